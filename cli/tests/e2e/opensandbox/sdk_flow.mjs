// The official OpenSandbox TypeScript SDK (@alibaba-group/opensandbox) driving Differently's
// OpenSandbox facade: create -> info -> run (streamed lines, env, exit codes 0 and 3) ->
// write -> read -> list -> renew -> pause -> resume -> kill -> gone, straight to the facade's
// execd endpoint and in server-proxy mode. Environment: OSB_DOMAIN, OSB_KEY, OSB_IMAGE.
// Run with NODE_PATH-free resolution: the caller sets the working directory to where the SDK
// is installed. Exits 1 on the first mismatch.
import { ConnectionConfig, Sandbox, SandboxManager } from "@alibaba-group/opensandbox";

const DOMAIN = process.env.OSB_DOMAIN;
const KEY = process.env.OSB_KEY;
const IMAGE = process.env.OSB_IMAGE ?? "default";

function check(label, cond, what) {
  console.log(`[${label}] ${cond ? "ok  " : "FAIL"} ${what}`);
  if (!cond) process.exit(1);
}

async function flow(useServerProxy) {
  const label = `ts ${useServerProxy ? "proxy" : "direct"}`;
  const connectionConfig = new ConnectionConfig({ domain: DOMAIN, apiKey: KEY, useServerProxy,
    requestTimeoutSeconds: 60 });
  const sb = await Sandbox.create({ connectionConfig, image: IMAGE, timeoutSeconds: 600,
    env: { FLOW: "ts" }, metadata: { flow: "ts" }, resource: { cpu: "1", memory: "512Mi" },
    readyTimeoutSeconds: 60 });
  try {
    const info = await sb.getInfo();
    check(label, info.status.state === "Running", `info: state ${info.status.state}`);
    check(label, info.metadata?.flow === "ts", `info: metadata ${JSON.stringify(info.metadata)}`);
    const streamed = [];
    const ex = await sb.commands.run("echo a; echo $FLOW $LOCAL; echo e >&2", { envs: { LOCAL: "y" } },
      { onStdout: (m) => { streamed.push(m.text); } });
    const out = ex.logs.stdout.map((m) => m.text);
    check(label, JSON.stringify(out) === JSON.stringify(["a", "ts y"]), `run: stdout ${JSON.stringify(out)}`);
    check(label, JSON.stringify(streamed) === JSON.stringify(out), `run: streamed ${JSON.stringify(streamed)}`);
    check(label, ex.logs.stderr.map((m) => m.text).join() === "e", "run: stderr");
    check(label, ex.exitCode === 0, `run: exit ${ex.exitCode}`);
    const ex3 = await sb.commands.run("exit 3");
    check(label, ex3.exitCode === 3, `run: exit 3 gives ${ex3.exitCode}`);
    await sb.files.writeFiles([{ path: "/tmp/osb-ts/hello.txt", data: "hallo ✓\n", mode: 644 }]);
    const back = await sb.files.readFile("/tmp/osb-ts/hello.txt");
    check(label, back === "hallo ✓\n", `files: round trip ${JSON.stringify(back)}`);
    const listed = await sb.files.listDirectory({ path: "/tmp/osb-ts" });
    check(label, listed.map((e) => e.path).join() === "/tmp/osb-ts/hello.txt",
      `files: list ${JSON.stringify(listed.map((e) => e.path))}`);
    const before = info.expiresAt;
    await sb.renew(30 * 60);
    const after = (await sb.getInfo()).expiresAt;
    check(label, after && new Date(after) > new Date(before), `renew: ${before} -> ${after}`);
    await sb.pause();
    const st = (await sb.getInfo()).status.state;
    check(label, st === "Paused", `pause: state ${st}`);
    const sb2 = await sb.resume();
    const exr = await sb2.commands.run("echo back");
    check(label, exr.logs.stdout.map((m) => m.text).join() === "back", "resume: commands run");
    check(label, (await sb2.files.readFile("/tmp/osb-ts/hello.txt")) === "hallo ✓\n", "resume: file survived");
  } finally {
    await sb.kill();
    await sb.close();
  }
  const mgr = SandboxManager.create({ connectionConfig });
  try {
    await mgr.getSandboxInfo(sb.id);
    check(label, false, "kill: still there");
  } catch (e) {
    check(label, String(e?.error?.code ?? e).includes("SANDBOX_NOT_FOUND"), `kill: gone (${e?.error?.code})`);
  } finally {
    await mgr.close();
  }
}

await flow(false);
await flow(true);
console.log("PASS");
