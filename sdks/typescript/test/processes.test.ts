/**
 * Processes against a real `differently dev` (devhost: `exec.stdin`, terminals, signals to the
 * process group): start, list, get, attach from an offset in both formats, detach, stdin,
 * close, signal, resize, kill.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ConflictError, Differently, NotFoundError, OutputChunk, type Process, type Sandbox } from "@differently/sdk";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
let c: Differently;
let sbx: Sandbox;

before(async () => {
  dev = await startDev();
  c = dev.client();
  sbx = await runningSandbox(c, { labels: { suite: "processes" } });
});
after(async () => {
  await dev?.stop();
});

/** Generous: the machine running the suite may be busy. */
const DEADLINE_MS = 60_000;

async function ended(pid: number): Promise<Process> {
  const start = Date.now();
  for (;;) {
    const p = await c.processes.get(sbx.id, pid);
    if (p.status !== "running") return p;
    assert.ok(Date.now() - start < DEADLINE_MS, `process ${pid} still runs`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("processes", () => {
  for (const format of ["binary", "sse"] as const) {
    it(`runs to its exit; the output is kept and read whole (${format})`, async () => {
      const p = await c.processes.start(sbx.id, ["sh", "-c", "echo out; echo err >&2; exit 3"], { tag: "t", cwd: "/tmp" });
      assert.ok(p.pid > 0);
      assert.equal(p.tag, "t");
      const out = await c.processes.output(sbx.id, p.pid, { format });
      const got = await out.collect();
      assert.deepEqual([got.stdout, got.stderr, got.exitCode], ["out\n", "err\n", 3]);
      assert.equal(out.offset, 8);
      const e = await c.processes.get(sbx.id, p.pid);
      assert.deepEqual([e.status, e.exitCode, e.outputBytes], ["exited", 3, 8]);
      assert.ok((await c.processes.list(sbx.id, { status: "exited" })).some((x) => x.pid === p.pid));
    });
  }

  it("detaches, re-attaches from an offset, takes stdin until it is closed", async () => {
    const p = await c.processes.start(sbx.id, ["sh", "-c", "echo ready; cat; echo done"], { stdin: true });
    assert.equal(p.stdinOpen, true);
    const first = await c.processes.output(sbx.id, p.pid);
    for await (const ev of first) {
      assert.ok(ev instanceof OutputChunk);
      assert.equal(ev.text, "ready\n");
      break; // hangs up: the process goes on
    }
    assert.equal(first.offset, 6);
    assert.equal((await c.processes.get(sbx.id, p.pid)).status, "running");
    await c.processes.sendStdin(sbx.id, p.pid, "hello\n");
    await c.processes.sendStdin(sbx.id, p.pid, new Uint8Array([0, 255, 10]));
    await c.processes.closeStdin(sbx.id, p.pid);
    await c.processes.closeStdin(sbx.id, p.pid); // a second close is fine
    const rest = await c.processes.output(sbx.id, p.pid, { from: 6 });
    const bytes: number[] = [];
    for await (const ev of rest) if (ev instanceof OutputChunk) bytes.push(...ev.bytes);
    assert.deepEqual(Buffer.from(bytes), Buffer.concat([Buffer.from("hello\n"), Buffer.from([0, 255, 10]), Buffer.from("done\n")]));
    assert.equal(rest.exit?.exitCode, 0);
    await assert.rejects(c.processes.sendStdin(sbx.id, p.pid, "late"), ConflictError);
  });

  it("without follow: the output kept now, no exit while it runs; kill ends it with 137", async () => {
    const p = await c.processes.start(sbx.id, ["sh", "-c", "echo one; sleep 60"]);
    const start = Date.now();
    while ((await c.processes.get(sbx.id, p.pid)).outputBytes < 4) {
      assert.ok(Date.now() - start < DEADLINE_MS, "no output");
      await new Promise((r) => setTimeout(r, 100));
    }
    const out = await c.processes.output(sbx.id, p.pid, { follow: false });
    let text = "";
    for await (const ev of out) if (ev instanceof OutputChunk) text += ev.text;
    assert.equal(text, "one\n");
    assert.equal(out.exit, undefined);
    await c.processes.kill(sbx.id, p.pid);
    assert.equal((await ended(p.pid)).exitCode, 128 + 9);
    await c.processes.kill(sbx.id, p.pid); // an ended one is fine
  });

  it("a signal ends it with 128+n; wait resolves the code", async () => {
    const p = await c.processes.start(sbx.id, ["sleep", "60"]);
    await c.processes.signal(sbx.id, p.pid, "TERM");
    assert.equal(await c.processes.wait(sbx.id, p.pid), 128 + 15);
  });

  it("a terminal process is resized; resizing a plain one is a conflict", async () => {
    const p = await c.processes.start(sbx.id, ["sh", "-c", "read x; stty size; echo got $x"], { pty: { cols: 80, rows: 24 } });
    assert.equal(p.pty, true);
    await c.processes.resize(sbx.id, p.pid, { cols: 100, rows: 30 });
    await c.processes.sendStdin(sbx.id, p.pid, "hi\n");
    const got = await (await c.processes.output(sbx.id, p.pid)).collect();
    assert.match(got.stdout, /30 100/);
    assert.match(got.stdout, /got hi/);
    const plain = await c.processes.start(sbx.id, ["true"]);
    await assert.rejects(c.processes.resize(sbx.id, plain.pid, { cols: 80, rows: 24 }), ConflictError);
  });

  it("an unknown pid is not found", async () => {
    await assert.rejects(c.processes.get(sbx.id, 4_000_000_000), NotFoundError);
    await assert.rejects(c.processes.output(sbx.id, 4_000_000_000), NotFoundError);
  });
});
