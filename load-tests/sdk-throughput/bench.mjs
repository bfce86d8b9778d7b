#!/usr/bin/env node
// SDK overhead on a streamed exec (issue #22: ">= 0.8x the throughput of curl on the same
// route, measured in one run").
//
// Starts `differently dev` (devhost pool) on a free loopback port, makes one sandbox, and
// streams ~50 MB of output (`head -c 50000000 /dev/zero | tr '\0' a | fold -w 100`) through
// POST /v1/sandboxes/{id}/exec/stream, ROUNDS times, interleaving in each round:
//   curl SSE → SDK SSE → plain fetch SSE → the same three with binary frames
// curl writes the body to /dev/null; the SDK iterates every event and touches every chunk
// (text length for SSE, byte length for frames), as a caller would. Prints MB/s (output bytes
// of the command / wall time) per run, the medians, the SDK/curl ratio per format, and CPU
// time per run for both (curl's from /usr/bin/time, the SDK's from process.cpuUsage()).
//
// Usage: node load-tests/sdk-throughput/bench.mjs [--rounds N] [--bytes N]
//   DIFFERENTLY_BIN (default target/debug/differently); the SDK must be built
//   (cd sdks/typescript && npm ci && npm run build). Loopback only.
import { spawn, execFile } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../..");
const sdkEntry = join(repo, "sdks/typescript/dist/index.js");
if (!existsSync(sdkEntry)) {
  console.error(`bench: ${sdkEntry} is missing: cd sdks/typescript && npm ci && npm run build`);
  process.exit(2);
}
const { Differently, OutputChunk } = await import(sdkEntry);

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i === -1 ? dflt : Number(process.argv[i + 1]);
};
const ROUNDS = arg("--rounds", 5);
const BYTES = arg("--bytes", 50_000_000);
// fold -w 100 puts a newline between each 100 bytes (none after the last line: no input newline).
const OUTPUT_BYTES = BYTES + Math.ceil(BYTES / 100) - 1;
const bin = process.env.DIFFERENTLY_BIN || join(repo, "target/debug/differently");
if (!existsSync(bin)) {
  console.error(`bench: no differently binary at ${bin}: run \`cargo build -p differently\` (or set DIFFERENTLY_BIN)`);
  process.exit(2);
}

const dir = mkdtempSync(join(tmpdir(), "differently-sdk-bench-"));
const dev = spawn(bin, ["dev", "--listen", "127.0.0.1:0", "--key-file", join(dir, "key"), "--root", join(dir, "root")], {
  stdio: ["ignore", "pipe", "pipe"],
  env: { ...process.env, RUST_LOG: "warn", NO_COLOR: "1" },
});
let devErr = "";
dev.stderr.on("data", (d) => (devErr = (devErr + d).slice(-20_000)));
// On a failure exit: kill dev and remove what we can; the normal path waits for dev first.
process.on("exit", () => {
  if (dev.exitCode === null) dev.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});
const stop = async () => {
  if (dev.exitCode === null) {
    const exited = new Promise((r) => dev.once("exit", r));
    dev.kill("SIGTERM");
    await exited;
  }
  rmSync(dir, { recursive: true, force: true });
};

const vars = await new Promise((ok, fail) => {
  let out = "";
  const t = setTimeout(() => fail(new Error(`differently dev printed no URL in 30 s:\n${devErr}`)), 30_000);
  dev.stdout.on("data", (d) => {
    out += d;
    const v = Object.fromEntries([...out.matchAll(/^export (\w+)=(\S+)$/gm)].map((m) => [m[1], m[2]]));
    if (v.DIFFERENTLY_URL && v.DIFFERENTLY_API_KEY) {
      clearTimeout(t);
      ok(v);
    }
  });
});
const url = vars.DIFFERENTLY_URL;
if (!/^http:\/\/127\.0\.0\.1:\d+$/.test(url)) throw new Error(`bench: refusing a non-loopback URL ${url}`);
const key = vars.DIFFERENTLY_API_KEY;
for (let i = 0; ; i++) {
  try {
    if ((await fetch(`${url}/readyz`)).ok) break;
  } catch {}
  if (i > 300) throw new Error("differently dev never became ready");
  await new Promise((r) => setTimeout(r, 100));
}

const c = new Differently({ baseUrl: url, apiKey: key });
const sbx = await c.sandboxes.create({});
await c.sandboxes.wait(sbx.id, { timeoutMs: 30_000 });
const command = ["sh", "-c", `head -c ${BYTES} /dev/zero | tr '\\0' 'a' | fold -w 100`];
const body = JSON.stringify({ command, timeoutSeconds: 600 });
const bodyFile = join(dir, "body.json");
writeFileSync(bodyFile, body);
const headersFile = join(dir, "auth.txt"); // the key goes to curl through a file, never argv
writeFileSync(headersFile, `Authorization: Bearer ${key}\n`, { mode: 0o600 });

const ACCEPT = { sse: "text/event-stream", binary: "application/vnd.differently.exec-stream" };

function curlRun(format) {
  return new Promise((ok, fail) => {
    const timeFile = join(dir, "time.txt");
    const args = [
      "-f", "%U %S", "-o", timeFile,
      "curl", "-sS", "-N", "-o", "/dev/null", "-w", "%{size_download} %{time_total} %{http_code}",
      "-X", "POST", "-H", `@${headersFile}`, "-H", "content-type: application/json",
      "-H", `accept: ${ACCEPT[format]}`, "--data-binary", `@${bodyFile}`,
      `${url}/v1/sandboxes/${sbx.id}/exec/stream`,
    ];
    execFile("/usr/bin/time", args, { maxBuffer: 1 << 20 }, (err, stdout) => {
      if (err) return fail(err);
      const [size, total, code] = stdout.trim().split(" ");
      if (code !== "200") return fail(new Error(`curl got HTTP ${code}`));
      const [u, s] = readFileSync(timeFile, "utf8").trim().split("\n").at(-1).split(" ").map(Number);
      ok({ seconds: Number(total), wireBytes: Number(size), cpu: u + s });
    });
  });
}

async function sdkRun(format) {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const stream = await c.sandboxes.execStream(sbx.id, command, { format, timeoutSeconds: 600 });
  let n = 0;
  let exit;
  for await (const ev of stream) {
    if (ev instanceof OutputChunk) n += format === "sse" ? ev.text.length : ev.bytes.length;
    else exit = ev;
  }
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  if (exit?.exitCode !== 0) throw new Error(`exit ${exit?.exitCode}`);
  if (n !== OUTPUT_BYTES) throw new Error(`SDK ${format}: got ${n} bytes of output, expected ${OUTPUT_BYTES}`);
  return { seconds, bytes: n, cpu: (cpu.user + cpu.system) / 1e6 };
}

/** Plain fetch reading the body, no parsing: how much of the gap to curl is the runtime's HTTP client. */
async function fetchRun(format) {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/sandboxes/${sbx.id}/exec/stream`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", accept: ACCEPT[format] },
    body,
  });
  const reader = res.body.getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read());
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  return { seconds, cpu: (cpu.user + cpu.system) / 1e6 };
}

const mbps = (s) => OUTPUT_BYTES / 1e6 / s;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const results = { curl: { sse: [], binary: [] }, sdk: { sse: [], binary: [] }, fetch: { sse: [], binary: [] } };
console.log(`bench: ${ROUNDS} rounds of ${(OUTPUT_BYTES / 1e6).toFixed(1)} MB output each, sandbox ${sbx.id} on ${url}`);
// One warm-up of each, not counted.
await curlRun("binary");
await sdkRun("binary");
for (let r = 1; r <= ROUNDS; r++) {
  for (const format of ["sse", "binary"]) {
    const cu = await curlRun(format);
    results.curl[format].push(cu);
    const sd = await sdkRun(format);
    results.sdk[format].push(sd);
    const fe = await fetchRun(format);
    results.fetch[format].push(fe);
    console.log(
      `round ${r} ${format.padEnd(6)} curl ${mbps(cu.seconds).toFixed(1).padStart(6)} MB/s (cpu ${cu.cpu.toFixed(2)} s)` +
        `  sdk ${mbps(sd.seconds).toFixed(1).padStart(6)} MB/s (cpu ${sd.cpu.toFixed(2)} s)  ratio ${(cu.seconds / sd.seconds).toFixed(2)}` +
        `  | plain fetch ${mbps(fe.seconds).toFixed(1).padStart(6)} MB/s (cpu ${fe.cpu.toFixed(2)} s)`,
    );
  }
}
console.log("--- medians");
for (const format of ["sse", "binary"]) {
  const cu = median(results.curl[format].map((x) => mbps(x.seconds)));
  const sd = median(results.sdk[format].map((x) => mbps(x.seconds)));
  const fe = median(results.fetch[format].map((x) => mbps(x.seconds)));
  const ccpu = median(results.curl[format].map((x) => x.cpu));
  const scpu = median(results.sdk[format].map((x) => x.cpu));
  console.log(
    `${format.padEnd(6)} curl ${cu.toFixed(1)} MB/s, sdk ${sd.toFixed(1)} MB/s, ratio sdk/curl ${(sd / cu).toFixed(2)}` +
      ` (target >= 0.80); client cpu per run: curl ${ccpu.toFixed(2)} s, sdk ${scpu.toFixed(2)} s;` +
      ` plain fetch ${fe.toFixed(1)} MB/s (sdk/fetch ${(sd / fe).toFixed(2)})`,
  );
}
await c.sandboxes.delete(sbx.id);
await stop();
process.exit(0);
