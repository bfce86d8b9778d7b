// Drives Differently's E2B facade with the official E2B JS SDK (npm `e2b`), unchanged.
//
// Run by cli/tests/e2e/e2b_facade.rs with Node >= 20 against a real `differently dev` (devhost
// pool); the SDK comes from DIFFERENTLY_E2B_NODE_MODULES (scripts/test pins it). Settings come
// from the environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (org A), KEY_B (another
// organization). Prints one JSON report as its last line; the Rust test asserts on it. Every
// step records what the SDK answered (a value, or the error's class chain and message).

import { createRequire } from 'node:module';
import path from 'node:path';
import { randomUUID } from 'node:crypto';

const require = createRequire(path.join(process.env.DIFFERENTLY_E2B_NODE_MODULES, 'x.js'));
const { Sandbox, CommandExitError } = require('e2b');
const sdk = require('e2b/package.json').version;

const report = { sdk };

/** A step's result: {ok: value} or {error, message, chain: class names up the prototypes}. */
async function outcome(fn) {
  try {
    return { ok: await fn() };
  } catch (e) {
    const chain = [];
    for (let p = Object.getPrototypeOf(e); p && p.constructor !== Object; p = Object.getPrototypeOf(p)) {
      chain.push(p.constructor.name);
    }
    return { error: e?.constructor?.name, message: String(e?.message ?? e), chain };
  }
}

const tag = randomUUID().replaceAll('-', '').slice(0, 10);
report.tag = tag;
const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { flow: tag }, envs: { E2B_FLOW_TOKEN: tag } });
const sid = sbx.sandboxId;
report.id = sid;
const info = await sbx.getInfo();
report.info = { state: info.state, metadata: info.metadata, templateId: info.templateId, sandboxId: info.sandboxId };
report.is_running = await sbx.isRunning();

// Commands: stdout, stderr, the sandbox's env, a non-zero exit.
report.run = await outcome(async () => {
  const r = await sbx.commands.run('echo "out $E2B_FLOW_TOKEN"; echo "err line" 1>&2');
  return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode };
});
report.exit = await outcome(async () => {
  try {
    await sbx.commands.run('echo before; echo oops 1>&2; exit 3');
    return 'no error';
  } catch (e) {
    if (!(e instanceof CommandExitError)) throw e;
    return { exitCode: e.exitCode, stdout: e.stdout, stderr: e.stderr, error: e.error };
  }
});

// Streaming, bound by events: the command waits for a file that is written (through the
// files API) only once onStdout has delivered the first line; output held until the end
// would leave it waiting until its 30 s deadline.
const gate = `/tmp/e2b-js-gate-${tag}`;
const chunks = [];
let wrote = null;
report.stream = await outcome(async () => {
  const r = await sbx.commands.run(`echo first; while [ ! -e ${gate} ]; do sleep 0.05; done; echo second`, {
    timeoutMs: 30_000,
    onStdout: (s) => {
      chunks.push(s);
      wrote ??= sbx.files.write(gate, 'go');
    },
  });
  await wrote;
  return r.stdout;
});
report.stream_chunks = chunks;

// Files.
const d = `/tmp/e2b-js-${tag}`;
const text = `hello ${tag}\nzwei: grüße ✓\n`;
report.write = await outcome(async () => (await sbx.files.write(`${d}/a.txt`, text)).path);
report.read = await outcome(() => sbx.files.read(`${d}/a.txt`));
report.write_files = await outcome(async () => (await sbx.files.write([
  { path: `${d}/m1.txt`, data: 'one' }, { path: `${d}/sub/m2.txt`, data: 'two' }])).map((i) => i.path));
report.cmd_sees_file = await outcome(async () => (await sbx.commands.run(`cat ${d}/m1.txt`)).stdout);
report.list = await outcome(async () => (await sbx.files.list(d)).map((e) => [e.name, e.type]).sort());
report.exists = await outcome(async () => [await sbx.files.exists(`${d}/a.txt`), await sbx.files.exists(`${d}/missing`)]);
report.make_dir = await outcome(async () => [await sbx.files.makeDir(`${d}/new/deep`), await sbx.files.makeDir(`${d}/new/deep`)]);
report.rename = await outcome(async () => (await sbx.files.rename(`${d}/a.txt`, `${d}/new/b.txt`)).path);
report.after_rename = await outcome(async () => [await sbx.files.exists(`${d}/a.txt`), await sbx.files.read(`${d}/new/b.txt`)]);
report.remove = await outcome(async () => [await sbx.files.remove(`${d}/new`) ?? null, await sbx.files.exists(`${d}/new/b.txt`)]);
report.read_missing = await outcome(() => sbx.files.read(`${d}/missing`));

// Watching a directory: what commands create, write and remove is seen (bound by events).
const wd = `${d}/watched`;
await sbx.files.makeDir(wd);
const until = async (got, name, type) => {
  const end = Date.now() + 30_000;
  while (!got.some(([n, t]) => n === name && t === type)) {
    if (Date.now() > end) throw new Error(`no ${type} of ${name}: ${JSON.stringify(got)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
};
report.watch = await outcome(async () => {
  const got = [];
  const h = await sbx.files.watchDir(wd, (e) => { got.push([e.name, e.type]); }, { timeoutMs: 60_000 });
  await sbx.commands.run(`echo one > ${wd}/f.txt`);
  await until(got, 'f.txt', 'create');
  await sbx.commands.run(`echo more >> ${wd}/f.txt`);
  await until(got, 'f.txt', 'write');
  await sbx.commands.run(`rm ${wd}/f.txt`);
  await until(got, 'f.txt', 'remove');
  await h.stop();
  return got;
});

// A signed download URL, fetched with no headers.
await sbx.files.write(`${d}/signed.txt`, `signed ${tag}`);
report.signed_url = await outcome(() => sbx.downloadUrl(`${d}/signed.txt`));
report.signed_get = await outcome(async () => {
  const r = await fetch(await sbx.downloadUrl(`${d}/signed.txt`));
  return [r.status, await r.text()];
});

// Background processes: a command fed stdin, listed while it runs, killed by pid; and a
// dropped stream does not kill one: reconnected by pid it runs on, and its later output comes.
const waitFor = async (cond, what) => {
  const end = Date.now() + 30_000;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`no ${what} within 30 s`);
    await new Promise((r) => setTimeout(r, 100));
  }
};
report.background = await outcome(async () => {
  let seen = '';
  const h = await sbx.commands.run('cat', {
    background: true, stdin: true, timeoutMs: 0, onStdout: (s) => { seen += s; },
  });
  await sbx.commands.sendStdin(h.pid, `ping ${tag}\n`);
  const listed = (await sbx.commands.list()).filter((p) => p.pid === h.pid)
    .map((p) => [p.pid, p.cmd, p.args, p.envs, p.cwd ?? null]);
  await waitFor(() => seen.length >= `ping ${tag}\n`.length, 'echo');
  const killed = await sbx.commands.kill(h.pid);
  const end = await h.wait().then((r) => r.exitCode, (e) => [e.exitCode, e.error]);
  const after = (await sbx.commands.list()).filter((p) => p.pid === h.pid).length;
  return { pid: h.pid, listed, seen, killed, end, after, killAgain: await sbx.commands.kill(h.pid) };
});
report.detached = await outcome(async () => {
  const gate = `/tmp/e2b-js-bg-gate-${tag}`;
  let first = '';
  const h = await sbx.commands.run(
    `echo early; while [ ! -e ${gate} ]; do sleep 0.05; done; echo late; exec sleep 600`,
    { background: true, timeoutMs: 0, onStdout: (s) => { first += s; } },
  );
  await waitFor(() => first.includes('early'), 'early');
  await h.disconnect();
  const running = (await sbx.commands.list()).some((p) => p.pid === h.pid);
  let later = '';
  const h2 = await sbx.commands.connect(h.pid, { timeoutMs: 0, onStdout: (s) => { later += s; } });
  await sbx.files.write(gate, 'go');
  await waitFor(() => later.includes('late'), 'late');
  const killed = await h2.kill();
  const end = await h2.wait().then((r) => r.exitCode, (e) => e.exitCode);
  return { running, later, killed, end, first };
});

// Lifecycle.
report.set_timeout = await outcome(async () => (await sbx.setTimeout(200_000)) ?? null);
const listIds = async (metadata, opts = {}) => {
  const p = Sandbox.list({ ...opts, query: { metadata } });
  const ids = [];
  while (p.hasNext) ids.push(...(await p.nextItems()).map((s) => s.sandboxId));
  return ids;
};
report.list_meta = await outcome(() => listIds({ flow: tag }));
report.list_other_tag = await outcome(() => listIds({ flow: `not-${tag}` }));
await sbx.files.write(`${d}/keep.txt`, 'survives');
report.pause = await outcome(() => sbx.pause());
report.state_paused = await outcome(async () => (await sbx.getInfo()).state);
report.resume = await outcome(async () => (await Sandbox.connect(sid)).sandboxId);
report.survived = await outcome(() => sbx.files.read(`${d}/keep.txt`));

const b = { apiKey: process.env.KEY_B };

// Snapshots: taken after a file is written (changed after it), listed by sandbox a page at
// a time, restored by Sandbox.create(<snapshot id>) with the file as it was, another
// organization's key finding none of it, deleted (true, then false).
report.snapshots = await outcome(async () => {
  const out = {};
  const snapPath = `${d}/snap.txt`;
  await sbx.files.write(snapPath, `in snapshot ${tag}`);
  const s1 = await sbx.createSnapshot({ name: `snap-${tag}` });
  out.first = s1;
  await sbx.files.write(snapPath, `changed after ${tag}`);
  const s2 = await Sandbox.createSnapshot(sid);
  out.second = s2;
  out.pages = [];
  const p = Sandbox.listSnapshots({ sandboxId: sid, limit: 1 });
  while (p.hasNext && out.pages.length < 5) out.pages.push((await p.nextItems()).map((s) => s.snapshotId));
  out.by_name = (await Sandbox.listSnapshots({ name: `snap-${tag}` }).nextItems()).map((s) => [s.snapshotId, s.names]);
  const restored = await Sandbox.create(s1.snapshotId, { timeoutMs: 60_000 });
  out.restored = await outcome(async () => [await restored.files.read(snapPath), (await restored.getInfo()).templateId]);
  out.b_list_sandbox = await outcome(async () => (await Sandbox.listSnapshots({ ...b, sandboxId: sid }).nextItems()).map((s) => s.snapshotId));
  out.b_create_from = await outcome(async () => (await Sandbox.create(s1.snapshotId, { ...b, timeoutMs: 60_000 })).sandboxId);
  out.b_take = await outcome(async () => (await Sandbox.createSnapshot(sid, b)).snapshotId);
  out.b_delete = await outcome(() => Sandbox.deleteSnapshot(s1.snapshotId, b));
  await restored.kill();
  out.delete = await outcome(async () => [await Sandbox.deleteSnapshot(s1.snapshotId),
    await Sandbox.deleteSnapshot(s1.snapshotId), await Sandbox.deleteSnapshot(s2.snapshotId)]);
  out.after_delete = await outcome(async () => (await Sandbox.listSnapshots({ sandboxId: sid }).nextItems()).map((s) => s.snapshotId));
  return out;
});

// Another organization's key (`b`, above).
report.b_get = await outcome(async () => (await Sandbox.getInfo(sid, b)).sandboxId);
report.b_kill = await outcome(() => Sandbox.kill(sid, b));
report.b_list = await outcome(() => listIds({ flow: tag }, b));

// Routes of E2B's API the facade does not serve: 501 with the facade's message, which the
// SDK shows (a 404 would become "Sandbox … not found" for a sandbox that runs).
report.update_network = await outcome(() => sbx.updateNetwork({ denyOut: ['1.1.1.1'] }));
report.fork = await outcome(() => sbx.fork());
report.after_unserved = await outcome(() => sbx.isRunning());
// The domain getHost() is built from: one that never resolves, not E2B's own.
report.get_host = sbx.getHost(3000);

// The end.
report.kill = await outcome(() => sbx.kill());
report.after_kill_get = await outcome(async () => (await sbx.getInfo()).state);
report.after_kill_kill = await outcome(() => Sandbox.kill(sid));
report.after_kill_run = await outcome(async () => (await sbx.commands.run('echo x')).stdout);
report.after_kill_list = await outcome(() => listIds({ flow: tag }));

console.log(JSON.stringify(report));
