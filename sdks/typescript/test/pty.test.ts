/**
 * `sandboxes.pty` against a real `differently dev` (devhost pool: a real pseudo-terminal):
 * keystrokes and output, resize seen by `stty size`, signals, exit codes, reattach, the
 * refusals, and the key only ever in the Authorization header. Node 20 needs
 * `--experimental-websocket` for the global WebSocket (`npm test` passes it).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Differently, NotFoundError, type Pty, type WebSocketConstructor, type WebSocketLike } from "@differently/sdk";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
let c: Differently;
let sid: string;

before(async () => {
  assert.equal(
    typeof globalThis.WebSocket,
    "function",
    "no global WebSocket: run this file on Node >= 22, or on Node 20 with --experimental-websocket (npm test does)",
  );
  dev = await startDev();
  c = dev.client();
  sid = (await runningSandbox(c)).id;
});
after(async () => {
  await dev?.stop();
});

/** Reads the terminal's output until `re` matches all of it so far (decoded), within `ms`. */
class Screen {
  text = "";
  #it: AsyncIterator<Uint8Array>;
  #dec = new TextDecoder();
  constructor(p: Pty) {
    this.#it = p[Symbol.asyncIterator]();
  }
  async until(re: RegExp, ms = 15_000): Promise<RegExpMatchArray> {
    const deadline = Date.now() + ms;
    for (;;) {
      const m = this.text.match(re);
      if (m) return m;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${re} within ${ms} ms in ${JSON.stringify(this.text)}`);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const r = await Promise.race([
        this.#it.next(),
        new Promise<"timeout">((res) => (timer = setTimeout(() => res("timeout"), left))),
      ]);
      clearTimeout(timer);
      if (r === "timeout") continue;
      if (r.done) throw new Error(`output ended without ${re}: ${JSON.stringify(this.text)}`);
      this.text += this.#dec.decode(r.value, { stream: true });
    }
  }
  /** The rest of the output, to its end. */
  async drain(): Promise<string> {
    for (;;) {
      const r = await this.#it.next();
      if (r.done) return this.text;
      this.text += this.#dec.decode(r.value, { stream: true });
    }
  }
}

/** `word` as a line of output, not in the echo of the `echo` typed for it (the prompt may precede it). */
const line = (word: string) => new RegExp(`(?<!echo )${word}\\r?\\n`);

describe("pty", () => {
  it("sh: echo, resize seen by stty size, exit 3", async () => {
    const p = await c.sandboxes.pty(sid, { command: ["sh"], cols: 80, rows: 24 });
    assert.match(p.sessionId, /^pty_/);
    assert.ok(p.graceSeconds > 0);
    const s = new Screen(p);
    p.write("echo hi\n");
    await s.until(line("hi"));
    p.write("stty size\n");
    // The prompt may come between the typed line's echo and the output: match the output alone.
    await s.until(/24 80\r?\n/);
    p.resize(100, 40);
    p.write(new TextEncoder().encode("stty size\n"));
    await s.until(/40 100\r?\n/);
    p.write("exit 3\n");
    assert.equal(await p.exitCode, 3);
    await s.drain(); // the iteration ends after the exit frame
    await p.close();
    assert.throws(() => p.write("x"), /no longer connected/);
  });

  it("INT interrupts the foreground program; command, env and cwd are the program's", async () => {
    const p = await c.sandboxes.pty(sid, { command: ["sh"] });
    const s = new Screen(p);
    const started = Date.now();
    p.write("sleep 30\n");
    await s.until(/sleep 30\r?\n/);
    await new Promise((r) => setTimeout(r, 300));
    p.signal("INT");
    p.write("echo back\n");
    await s.until(line("back"));
    assert.ok(Date.now() - started < 20_000, "the sleep was interrupted, not waited out");
    p.write("exit\n");
    assert.equal(await p.exitCode, 0);

    await c.files.upload(sid, "/ptycwd/marker", "x");
    const q = await c.sandboxes.pty(sid, { command: ["sh", "-c", 'echo "FOO=$FOO TERM=$TERM"; pwd; exit 7'], env: { FOO: "bar baz" }, cwd: "/ptycwd" });
    const out = await new Screen(q).drain();
    assert.equal(await q.exitCode, 7);
    assert.match(out, /FOO=bar baz TERM=xterm-256color/);
    // devhost without bubblewrap shows the host path of the sandbox's root; either way it ends so.
    assert.match(out, /\/ptycwd\r?$/m);
  });

  it("a closed socket leaves the program running; {session} reattaches with the output made meanwhile", async () => {
    const p = await c.sandboxes.pty(sid, { command: ["sh"] });
    const s = new Screen(p);
    p.write("sleep 1; echo two\n");
    await s.until(/echo two\r?\n/); // the terminal's echo of the typed line: the shell has it
    await p.close();
    await assert.rejects(p.exitCode, /closed before the program exited/);
    assert.ok(!line("two").test(s.text), "two came after the close");
    await new Promise((r) => setTimeout(r, 1500));
    const again = await c.sandboxes.pty(sid, { session: p.sessionId });
    assert.equal(again.sessionId, p.sessionId);
    const s2 = new Screen(again);
    await s2.until(line("two")); // printed while nobody was attached, kept for the reattach
    again.write("exit 5\n");
    assert.equal(await again.exitCode, 5);
    await again.close();
  });

  it("refusals: bad options before any traffic, unknown sandbox and session as the API says", async () => {
    await assert.rejects(c.sandboxes.pty(sid, { cols: 0 }), /cols must be a whole number from 1 to 1000/);
    await assert.rejects(c.sandboxes.pty(sid, { cwd: "tmp" }), /cwd must be an absolute path/);
    await assert.rejects(c.sandboxes.pty(sid, { env: { "A-B": "x" } }), /env name "A-B"/);
    await assert.rejects(c.sandboxes.pty(sid, { command: [] }), /command must be non-empty/);
    const p = await c.sandboxes.pty(sid, { command: ["sh"] });
    assert.throws(() => p.resize(1001, 10), RangeError);
    assert.throws(() => p.signal("STOP" as "INT"), /INT, TERM, KILL or HUP/);
    p.write("exit\n");
    await p.exitCode;
    const missing = "sbx_" + "0".repeat(26);
    await assert.rejects(c.sandboxes.pty(missing), (e: unknown) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(c.sandboxes.pty(sid, { session: "pty_nosuchsession" }), (e: unknown) => e instanceof NotFoundError && /session/.test(e.message));
    const gone = await runningSandbox(c);
    await c.sandboxes.delete(gone.id);
    await c.sandboxes.wait(gone.id, { status: "terminated", timeoutMs: 30_000 });
    await assert.rejects(c.sandboxes.pty(gone.id), /the sandbox is terminated on pool local: the API opens terminals only in running sandboxes \(409\)/);
    const anon = new Differently({ baseUrl: dev.url });
    await assert.rejects(anon.sandboxes.pty(sid), (e: unknown) => (e as { status?: number }).status === 401);
  });

  it("the key travels in the Authorization header only, through an injected WebSocket", async () => {
    const seen: Array<{ url: string; init: unknown }> = [];
    const Global = globalThis.WebSocket as unknown as WebSocketConstructor;
    const Recording = function (url: string, init?: { headers: Record<string, string> }): WebSocketLike {
      seen.push({ url, init });
      return new Global(url, init);
    } as unknown as WebSocketConstructor;
    const k = new Differently({ baseUrl: dev.url, apiKey: dev.apiKey, webSocket: Recording });
    const p = await k.sandboxes.pty(sid, { command: ["sh", "-c", "exit 0"] });
    assert.equal(await p.exitCode, 0);
    assert.equal(seen.length, 1);
    assert.ok(seen[0]!.url.startsWith(dev.url.replace(/^http/, "ws") + `/v1/sandboxes/${sid}/pty?`), seen[0]!.url);
    assert.ok(!seen[0]!.url.includes(dev.apiKey), "the key is not in the URL");
    assert.deepEqual(seen[0]!.init, { headers: { authorization: `Bearer ${dev.apiKey}` } });

    const saved = Object.getOwnPropertyDescriptor(globalThis, "WebSocket")!;
    delete (globalThis as { WebSocket?: unknown }).WebSocket;
    try {
      await assert.rejects(new Differently({ baseUrl: dev.url, apiKey: dev.apiKey }).sandboxes.pty(sid), /--experimental-websocket/);
    } finally {
      Object.defineProperty(globalThis, "WebSocket", saved);
    }
  });
});
