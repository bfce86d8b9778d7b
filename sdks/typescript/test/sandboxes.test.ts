/** Sandboxes, exec (buffered and streamed), files, lifecycle, snapshots, ports, placement, errors. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  ConflictError,
  Differently,
  InvalidArgumentError,
  NotFoundError,
  OutputChunk,
  UnsupportedOperationError,
  ValidationError,
  WaitError,
  type ExecEvent,
  type Sandbox,
} from "@differently/sdk";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
let c: Differently;
let sbx: Sandbox;

before(async () => {
  dev = await startDev();
  c = dev.client();
  sbx = await runningSandbox(c, { labels: { suite: "sandboxes" }, env: { FROM_CREATE: "yes" } });
});
after(async () => {
  await dev?.stop();
});

describe("create and wait", () => {
  it("creates with every field and reaches running", async () => {
    const project = (await c.projects.list()).items[0]!;
    const s = await c.sandboxes.create({
      projectId: project.id,
      template: "base",
      resources: { cpu: 1, memoryMiB: 256, diskGiB: 1 },
      env: { SECRET_VALUE: "s3cr3t" },
      labels: { team: "sdk", tier: "test" },
      ttlSeconds: 600,
      idleTimeoutSeconds: 300,
      capabilities: ["exec", "files"],
      classification: "internal",
      strategy: "private-first",
      external: "never",
      priority: 5,
    });
    assert.match(s.id, /^sbx_/);
    assert.ok(["queued", "provisioning", "running"].includes(s.status));
    assert.equal(s.projectId, project.id);
    assert.deepEqual(s.envKeys, ["SECRET_VALUE"]);
    assert.ok(!JSON.stringify(s).includes("s3cr3t"), "env values are never returned");
    assert.equal(s.labels["team"], "sdk");
    assert.equal(s.ttlSeconds, 600);
    assert.equal(s.idleTimeoutSeconds, 300);
    assert.equal(s.priority, 5);
    assert.equal(s.template, "base");
    assert.deepEqual(s.resources, { cpu: 1, memoryMiB: 256, diskGiB: 1 });
    const r = await c.sandboxes.wait(s.id, { status: "running", timeoutMs: 30_000 });
    assert.equal(r.status, "running");
    assert.equal(r.pool, "local");
    assert.equal((await c.sandboxes.get(s.id)).status, "running");
    await c.sandboxes.delete(s.id);
  });

  it("replays a create sent with the same Idempotency-Key", async () => {
    const key = `idem-${Date.now()}`;
    const a = await c.sandboxes.create({ labels: { idem: "1" } }, { idempotencyKey: key });
    const b = await c.sandboxes.create({ labels: { idem: "1" } }, { idempotencyKey: key });
    assert.equal(a.id, b.id);
    await assert.rejects(c.sandboxes.create({ labels: { idem: "2" } }, { idempotencyKey: key }), ConflictError);
    await c.sandboxes.delete(a.id);
  });

  it("wait throws WaitError when the deadline passes", async () => {
    await assert.rejects(c.sandboxes.wait(sbx.id, { status: "paused", timeoutMs: 1_000 }), (e: unknown) => {
      assert.ok(e instanceof WaitError);
      assert.equal((e.last as Sandbox).status, "running");
      return true;
    });
  });
});

describe("exec", () => {
  it("buffered: exit codes 0 and 3, stdout and stderr", async () => {
    const ok = await c.sandboxes.exec(sbx.id, ["sh", "-c", "echo hi"]);
    assert.equal(ok.exitCode, 0);
    assert.equal(ok.stdout, "hi\n");
    assert.equal(ok.stdoutTruncated, false);
    const three = await c.sandboxes.exec(sbx.id, ["sh", "-c", "echo oops >&2; exit 3"]);
    assert.equal(three.exitCode, 3);
    assert.equal(three.stderr, "oops\n");
    assert.equal(three.stdout, "");
  });

  it("env (over the create env) and cwd", async () => {
    // devhost maps sandbox paths under its own root: make the directory first.
    await c.files.upload(sbx.id, "/cwdtest/.keep", "");
    const r = await c.sandboxes.exec(sbx.id, ["sh", "-c", 'echo "$FROM_CREATE $MINE"; pwd'], {
      env: { MINE: "mine" },
      cwd: "/cwdtest",
    });
    assert.equal(r.exitCode, 0);
    const [envLine, cwd] = r.stdout.trimEnd().split("\n");
    assert.equal(envLine, "yes mine");
    assert.match(cwd!, /\/cwdtest$/);
    await assert.rejects(
      c.sandboxes.exec(sbx.id, ["pwd"], { cwd: "/no/such/dir" }),
      (e: unknown) => e instanceof ValidationError && e.field === "cwd",
    );
  });

  it("stdin as text and as bytes", async () => {
    const t = await c.sandboxes.exec(sbx.id, ["cat"], { stdin: "from stdin\n" });
    assert.equal(t.stdout, "from stdin\n");
    const b = await c.sandboxes.exec(sbx.id, ["od", "-An", "-tx1"], { stdin: new Uint8Array([0, 255, 10]) });
    assert.equal(b.stdout.trim(), "00 ff 0a");
  });

  it("timeout gives exit code 124", async () => {
    const r = await c.sandboxes.exec(sbx.id, ["sleep", "5"], { timeoutSeconds: 1 });
    assert.equal(r.exitCode, 124);
  });

  for (const format of ["binary", "sse"] as const) {
    it(`streamed (${format}): lines in order, stderr apart, exit code`, async () => {
      const stream = await c.sandboxes.execStream(
        sbx.id,
        ["sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; echo err >&2; exit 3"],
        { format },
      );
      assert.equal(stream.format, format);
      const stdout: string[] = [];
      const stderr: string[] = [];
      for await (const l of stream.lines()) (l.stream === "stdout" ? stdout : stderr).push(l.line);
      assert.deepEqual(stdout, ["line1", "line2", "line3", "line4", "line5"]);
      assert.deepEqual(stderr, ["err"]);
      assert.equal(stream.exit?.exitCode, 3);
    });

    it(`streamed (${format}): events as the route frames them, exit last`, async () => {
      const stream = await c.sandboxes.execStream(sbx.id, ["sh", "-c", "printf a; sleep 0.1; printf b; exit 0"], { format });
      const events: ExecEvent[] = [];
      for await (const ev of stream) events.push(ev);
      const last = events.at(-1)!;
      assert.ok(!(last instanceof OutputChunk));
      assert.equal(last.type, "exit");
      assert.equal(last.exitCode, 0);
      assert.ok(last.durationMs >= 100);
      const text = events.filter((e): e is OutputChunk => e instanceof OutputChunk).map((e) => e.text).join("");
      assert.equal(text, "ab");
      assert.ok(events.length >= 3, "two output events (the sleep separates them) and the exit");
    });
  }

  it("streamed binary keeps exact bytes, collect() decodes across chunks", async () => {
    const stream = await c.sandboxes.execStream(sbx.id, ["sh", "-c", "printf '\\000\\377\\303'; printf '\\251\\n'"]);
    const bytes: number[] = [];
    for await (const ev of stream) if (ev instanceof OutputChunk) bytes.push(...ev.bytes);
    assert.deepEqual(bytes, [0, 255, 0xc3, 0xa9, 10]);
    const s2 = await c.sandboxes.execStream(sbx.id, ["sh", "-c", "printf '\\303'; sleep 0.1; printf '\\251 ok'"]);
    const all = await s2.collect();
    assert.equal(all.stdout, "é ok");
    assert.equal(all.exitCode, 0);
  });

  it("streamed SSE with base64 output gives bytes", async () => {
    const stream = await c.sandboxes.execStream(sbx.id, ["sh", "-c", "printf '\\000\\377'"], { format: "sse", outputEncoding: "base64" });
    const bytes: number[] = [];
    for await (const ev of stream) if (ev instanceof OutputChunk) bytes.push(...ev.bytes);
    assert.deepEqual(bytes, [0, 255]);
  });

  it("breaking out of a stream hangs up and cancels the command", async () => {
    const marker = `/tmp/cancel-${Date.now()}`;
    const stream = await c.sandboxes.execStream(sbx.id, ["sh", "-c", `echo started; sleep 2; touch ${marker}`]);
    for await (const ev of stream) {
      if (ev instanceof OutputChunk) break;
    }
    await new Promise((r) => setTimeout(r, 2_500));
    const r = await c.sandboxes.exec(sbx.id, ["sh", "-c", `test -e ${marker} && echo exists || echo absent`]);
    assert.equal(r.stdout.trim(), "absent");
  });

  it("bad input: error code and field", async () => {
    await assert.rejects(c.sandboxes.exec(sbx.id, ["true"], { timeoutSeconds: 0 }), (e: unknown) => {
      assert.ok(e instanceof ValidationError);
      assert.equal(e.status, 422);
      assert.equal(e.code, "validation_failed");
      assert.equal(e.field, "timeoutSeconds");
      assert.ok(e.requestId && e.requestId.length > 0);
      return true;
    });
    await assert.rejects(c.sandboxes.execStream(sbx.id, ["true"], { cwd: "relative" }), (e: unknown) => {
      assert.ok(e instanceof ValidationError || e instanceof InvalidArgumentError);
      assert.equal(e.field, "cwd");
      return true;
    });
    await assert.rejects(c.sandboxes.create({ resources: { cpu: 0 } }), (e: unknown) => {
      assert.ok(e instanceof ValidationError);
      assert.equal(e.field, "resources.cpu");
      assert.match(e.message, /between 1 and 256/);
      return true;
    });
    await assert.rejects(c.sandboxes.list({ limit: 0 }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.equal(e.status, 400);
      assert.equal(e.field, "limit");
      return true;
    });
  });
});

describe("files", () => {
  it("upload, download (whole and range), list, stat, delete", async () => {
    const bytes = new Uint8Array(70_000).map((_, i) => i % 251);
    await c.files.upload(sbx.id, "/work/data/blob.bin", bytes, { mode: 0o600 });
    await c.files.upload(sbx.id, "/work/data/hello.txt", "hello, files\n");
    const back = await c.files.download(sbx.id, "/work/data/blob.bin");
    assert.deepEqual(back, bytes);
    assert.equal(await c.files.downloadText(sbx.id, "/work/data/hello.txt"), "hello, files\n");
    const part = await c.files.download(sbx.id, "/work/data/hello.txt", { range: { start: 7, end: 11 } });
    assert.equal(new TextDecoder().decode(part), "files");
    const tail = await c.files.download(sbx.id, "/work/data/hello.txt", { range: { suffix: 6 } });
    assert.equal(new TextDecoder().decode(tail), "files\n");
    const streamed = await c.files.downloadStream(sbx.id, "/work/data/blob.bin");
    let n = 0;
    const reader = streamed.getReader();
    for (let r = await reader.read(); !r.done; r = await reader.read()) n += r.value.length;
    assert.equal(n, bytes.length);

    const items = await c.files.list(sbx.id, "/work/data");
    assert.deepEqual(items.map((e) => e.path).sort(), ["/work/data/blob.bin", "/work/data/hello.txt"]);
    const st = await c.files.stat(sbx.id, "/work/data/blob.bin");
    assert.equal(st.size, 70_000);
    assert.equal(st.type, "file");
    assert.equal(st.mode & 0o777, 0o600);
    const dir = await c.files.stat(sbx.id, "/work/data");
    assert.equal(dir.type, "dir");

    // The sandbox sees what was uploaded through the API (cwd of exec = the sandbox root).
    await c.files.delete(sbx.id, "/work/data/hello.txt");
    await assert.rejects(c.files.download(sbx.id, "/work/data/hello.txt"), NotFoundError);
    await assert.rejects(c.files.stat(sbx.id, "/work/data/hello.txt"), NotFoundError);
    assert.deepEqual((await c.files.list(sbx.id, "/work/data")).map((e) => e.path), ["/work/data/blob.bin"]);
  });

  it("uploads a ReadableStream", async () => {
    const parts = ["stream", "ed ", "upload"];
    const body = new ReadableStream<Uint8Array>({
      start(ctl) {
        for (const p of parts) ctl.enqueue(new TextEncoder().encode(p));
        ctl.close();
      },
    });
    await c.files.upload(sbx.id, "/work/streamed.txt", body);
    assert.equal(await c.files.downloadText(sbx.id, "/work/streamed.txt"), "streamed upload");
  });

  it("makeDir: made with its parents and mode, then already there; refused where a file stands", async () => {
    const made = await c.files.makeDir(sbx.id, "/work/mk/a/b", { mode: 0o750 });
    assert.deepEqual(made, { path: "/work/mk/a/b", created: true });
    const modeOf = async (path: string) => (await c.files.stat(sbx.id, path)).mode & 0o7777;
    assert.equal((await c.files.stat(sbx.id, "/work/mk/a/b")).type, "dir");
    assert.equal(await modeOf("/work/mk/a/b"), 0o750);
    assert.equal(await modeOf("/work/mk/a"), 0o755, "parents are made 755");
    // Already there: created false, its mode left alone (octal text works as well).
    const again = await c.files.makeDir(sbx.id, "/work/mk/a/b", { mode: "700" });
    assert.deepEqual(again, { path: "/work/mk/a/b", created: false });
    assert.equal(await modeOf("/work/mk/a/b"), 0o750);
    assert.deepEqual(await c.files.makeDir(sbx.id, "/work/mk/plain"), { path: "/work/mk/plain", created: true });
    assert.equal(await modeOf("/work/mk/plain"), 0o755);
    // The sandbox sees it.
    const r = await c.sandboxes.exec(sbx.id, ["stat", "-c", "%F %a", "/work/mk/a/b"]);
    assert.equal(r.stdout, "directory 750\n");

    await c.files.upload(sbx.id, "/work/mk/f.txt", "file");
    for (const [path, reason] of [
      ["/work/mk/f.txt", "exists_not_directory"],
      ["/work/mk/f.txt/sub", "not_a_directory"],
    ] as const) {
      await assert.rejects(c.files.makeDir(sbx.id, path), (e: unknown) => {
        assert.ok(e instanceof ConflictError, String(e));
        assert.equal(e.status, 409);
        assert.equal(e.details["reason"], reason);
        return true;
      });
    }
    assert.equal(await c.files.downloadText(sbx.id, "/work/mk/f.txt"), "file");
    for (const [path, mode, field] of [
      ["relative/dir", undefined, "path"],
      ["/work/mk/bad", "rwx", "mode"],
    ] as const) {
      await assert.rejects(c.files.makeDir(sbx.id, path, mode === undefined ? {} : { mode }), (e: unknown) => {
        assert.ok(e instanceof InvalidArgumentError, String(e));
        assert.equal(e.field, field);
        return true;
      });
    }
    await assert.rejects(c.files.stat(sbx.id, "/work/mk/bad"), NotFoundError);
  });

  it("a relative path is a 400 naming path", async () => {
    await assert.rejects(c.files.download(sbx.id, "relative.txt"), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.equal(e.code, "invalid_argument");
      return true;
    });
  });
});

describe("listing", () => {
  it("filters by labels and status, pages with an iterator", async () => {
    const tag = `p${Date.now()}`;
    const made: string[] = [];
    for (let i = 0; i < 5; i++) made.push((await c.sandboxes.create({ labels: { page: tag, odd: String(i % 2) } })).id);
    const page = await c.sandboxes.list({ labels: { page: tag }, limit: 2 });
    assert.equal(page.items.length, 2);
    assert.ok(page.nextCursor, "a first page of 2 out of 5 has a cursor");
    const seen: string[] = [];
    for await (const s of c.sandboxes.iterate({ labels: { page: tag }, limit: 2 })) seen.push(s.id);
    assert.deepEqual([...seen].sort(), [...made].sort());
    assert.equal(new Set(seen).size, 5, "no sandbox twice across pages");
    const odd: string[] = [];
    for await (const s of c.sandboxes.iterate({ labels: { odd: "1" } })) if (made.includes(s.id)) odd.push(s.id);
    assert.deepEqual(odd.sort(), [made[1]!, made[3]!].sort());
    // Two labels AND: only the sandboxes carrying both pairs, not those with either one (an
    // odd=1 sandbox of another tag, the odd=0 ones of this tag), across pages of 1.
    const other = (await c.sandboxes.create({ labels: { page: `${tag}-other`, odd: "1" } })).id;
    const both: string[] = [];
    for await (const s of c.sandboxes.iterate({ labels: { page: tag, odd: "1" }, limit: 1 })) both.push(s.id);
    assert.deepEqual(both.sort(), [made[1]!, made[3]!].sort());
    const first = await c.sandboxes.list({ labels: { page: tag, odd: "0" } });
    assert.deepEqual(first.items.map((s) => s.id).sort(), [made[0]!, made[2]!, made[4]!].sort());
    assert.equal((await c.sandboxes.list({ labels: { page: tag, odd: "2" } })).items.length, 0, "a pair nobody has matches nothing");
    await c.sandboxes.delete(other);
    for (const id of made) await c.sandboxes.wait(id, { timeoutMs: 30_000 });
    const running: string[] = [];
    for await (const s of c.sandboxes.iterate({ labels: { page: tag }, status: "running" })) running.push(s.id);
    assert.equal(running.length, 5);
    for (const id of made) await c.sandboxes.delete(id);
  });
});

describe("update, keepalive, lifecycle", () => {
  it("patches TTL, labels and idle timeout", async () => {
    const before = await c.sandboxes.get(sbx.id);
    const u = await c.sandboxes.update(sbx.id, { ttlSeconds: 7200, labels: { suite: "sandboxes", patched: "yes" }, idleTimeoutSeconds: 900 });
    assert.equal(u.ttlSeconds, 7200);
    assert.equal(u.labels["patched"], "yes");
    assert.equal(u.idleTimeoutSeconds, 900);
    assert.ok(u.expiresAt && (!before.expiresAt || Date.parse(u.expiresAt) >= Date.parse(before.expiresAt)));
    const cleared = await c.sandboxes.update(sbx.id, { idleTimeoutSeconds: null });
    assert.equal(cleared.idleTimeoutSeconds, null);
    await assert.rejects(c.sandboxes.update(sbx.id, { ttlSeconds: 0 }), (e: unknown) => e instanceof ValidationError && e.field === "ttlSeconds");
  });

  it("keepalive answers (204)", async () => {
    await c.sandboxes.keepalive(sbx.id);
  });

  it("pause → resume; stop/start are 501 on devhost; 409 from the wrong status", async () => {
    const s = await runningSandbox(c);
    const p = await c.sandboxes.pause(s.id);
    assert.equal(p.status, "paused");
    assert.equal((await c.sandboxes.pause(s.id)).status, "paused", "already there: 200");
    assert.equal((await c.sandboxes.get(s.id)).status, "paused");
    const r = await c.sandboxes.resume(s.id);
    assert.equal(r.status, "running");
    assert.equal((await c.sandboxes.exec(s.id, ["true"])).exitCode, 0);
    // devhost has no lifecycle.stop: the pool says so with 501 unsupported_operation.
    await assert.rejects(c.sandboxes.stop(s.id), (e: unknown) => e instanceof UnsupportedOperationError && e.code === "unsupported_operation");
    await assert.rejects(c.sandboxes.start(s.id), (e: unknown) => e instanceof UnsupportedOperationError || e instanceof ConflictError);
    await c.sandboxes.delete(s.id);
    await c.sandboxes.wait(s.id, { status: "terminated", timeoutMs: 30_000 });
    await assert.rejects(c.sandboxes.pause(s.id), (e: unknown) => {
      assert.ok(e instanceof ConflictError);
      assert.equal(e.details["status"], "terminated");
      return true;
    });
  });
});

describe("snapshots and fork", () => {
  it("snapshot → ready → fork carries the files; delete", async () => {
    const s = await runningSandbox(c);
    await c.files.upload(s.id, "/state.txt", "before snapshot");
    const snap = await c.sandboxes.snapshot(s.id, { name: "sdk-snap" });
    assert.match(snap.id, /^snp_/);
    assert.equal(snap.sandboxId, s.id);
    const ready = await c.snapshots.wait(snap.id, { timeoutMs: 30_000 });
    assert.equal(ready.status, "ready");
    assert.equal(ready.name, "sdk-snap");
    assert.ok((await c.sandboxes.snapshots(s.id)).items.some((x) => x.id === snap.id));
    const listed: string[] = [];
    for await (const x of c.snapshots.iterate({ projectId: s.projectId, limit: 1 })) listed.push(x.id);
    assert.ok(listed.includes(snap.id));

    const fork = await c.sandboxes.fork(snap.id, { labels: { forked: "yes" } });
    assert.equal(fork.labels["differently.dev/from-snapshot"], snap.id);
    await c.sandboxes.wait(fork.id, { timeoutMs: 30_000 });
    assert.equal(await c.files.downloadText(fork.id, "/state.txt"), "before snapshot");
    await c.files.upload(fork.id, "/state.txt", "changed in fork");
    assert.equal(await c.files.downloadText(s.id, "/state.txt"), "before snapshot", "the fork is independent");

    await assert.rejects(c.sandboxes.fork("snp_00000000000000000000000000"), (e: unknown) => e instanceof NotFoundError && e.field === "fromSnapshot");
    await c.sandboxes.delete(fork.id);
    await c.sandboxes.delete(s.id);
    const del = await c.snapshots.delete(snap.id);
    assert.ok(del === null || del.status === "deleting");
    if (del !== null) {
      const deadline = Date.now() + 20_000;
      while (Date.now() < deadline) {
        try {
          await c.snapshots.get(snap.id);
        } catch (e) {
          if (e instanceof NotFoundError) break;
          throw e;
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    }
    await assert.rejects(c.snapshots.get(snap.id), NotFoundError);
  });
});

describe("ports, placement", () => {
  it("exposes a port where the pool can, and is refused 501 where it cannot", async () => {
    // devhost offers ports.expose only without bubblewrap (CI installs it): follow what the
    // pool advertises, and check the refusal when it does not.
    const local = await c.pools.get("local");
    if (!local.capabilities.includes("ports.expose")) {
      await assert.rejects(c.sandboxes.exposePort(sbx.id, 8080), UnsupportedOperationError);
      return;
    }
    const p = await c.sandboxes.exposePort(sbx.id, 8080, { expiresSeconds: 60 });
    assert.ok("url" in p, "devhost answers at once");
    assert.match(p.url, /^http:\/\/127\.0\.0\.1:8080/);
    await assert.rejects(c.sandboxes.exposePort(sbx.id, 0), (e: unknown) => e instanceof ValidationError && e.field === "port");
  });

  it("explains a placement and dry-runs one", async () => {
    const p = await c.placement.explain(sbx.id);
    assert.equal(p.decision, "placed");
    assert.equal(p.pool, "local");
    assert.ok(p.pools.some((x) => x.name === "local" && x.eligible));
    assert.deepEqual(await c.sandboxes.placement(sbx.id), p);
    const before = (await c.sandboxes.list({ limit: 1000 })).items.length;
    const d = await c.placement.dryRun({ resources: { cpu: 1 } });
    assert.equal(d.decision, "placed");
    assert.equal(d.pool, "local");
    assert.equal((await c.sandboxes.list({ limit: 1000 })).items.length, before, "a dry run creates nothing");
  });
});

describe("delete", () => {
  it("delete → terminating → terminated; another tenant's id is 404", async () => {
    const s = await runningSandbox(c);
    const d = await c.sandboxes.delete(s.id);
    assert.ok(["terminating", "terminated"].includes(d.status));
    const t = await c.sandboxes.wait(s.id, { status: "terminated", timeoutMs: 30_000 });
    assert.equal(t.status, "terminated");
    assert.ok(t.endedAt);
    await assert.rejects(c.sandboxes.exec(s.id, ["true"]), ConflictError);
    await assert.rejects(c.sandboxes.get("sbx_00000000000000000000000000"), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.code, "not_found");
      return true;
    });
  });
});
