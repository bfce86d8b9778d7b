/**
 * `Pty`: an interactive terminal in a sandbox over one WebSocket (`GET /v1/sandboxes/{id}/pty`,
 * protocol in docs/api.md, *Terminal*). Keystrokes go out as binary frames, resize and signals
 * as JSON text frames; output comes back as binary frames and the end as one JSON text frame.
 *
 * Uses the standard `WebSocket` (global in browsers and Node >= 22, behind
 * `--experimental-websocket` on Node 20) or one given in the client options, so the SDK keeps
 * no runtime dependency. The API takes the key only in the `Authorization` header, which a
 * browser's WebSocket cannot send: with a key this needs a WebSocket that accepts
 * `{headers}` (Node's), and the key never goes in the URL.
 */
import { StreamError, StreamInterruptedError } from "./errors.js";

/** The part of the WebSocket interface the terminal uses. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: string | ArrayBuffer | ArrayBufferView): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: "open" | "message" | "close" | "error", listener: (ev: any) => void): void;
}

/**
 * A WebSocket constructor. The second argument is Node's (undici's) non-standard
 * `{headers}` init when the client has a key; without a key it is not passed.
 */
export type WebSocketConstructor = new (url: string, init?: { headers: Record<string, string> }) => WebSocketLike;

/** Signals the terminal's foreground process group can be sent (as ^C would send INT). */
export type PtySignal = "INT" | "TERM" | "KILL" | "HUP";

export interface PtyOptions {
  /** Terminal size, 1–1000 each; the server's default is 80 × 24. */
  cols?: number;
  rows?: number;
  /** Program and arguments; default `sh -l` (a login shell). */
  command?: string[];
  /**
   * Added to the sandbox's env. These travel in the URL (proxies may log URLs): keep secrets
   * in the env given at create instead.
   */
  env?: Record<string, string>;
  /** Absolute working directory inside the sandbox. */
  cwd?: string;
  /** Reattach to a session (`pty.sessionId`) within its grace period; other options are ignored. */
  session?: string;
  /** Deadline for the socket to open and the session frame to arrive; default the client's `timeoutMs`. */
  timeoutMs?: number;
  /** Aborts the opening; an open terminal is ended with `close()`, `signal()` or `exit`. */
  signal?: AbortSignal;
}

/** Checks the options before anything is sent, naming the bad one (the server would, but a WebSocket client cannot read its 400). */
export function ptyQuery(o: PtyOptions): Record<string, string | number | string[] | undefined> {
  if (o.session !== undefined) {
    if (!o.session.startsWith("pty_")) throw new TypeError(`pty: session must be a pty_… id, got ${JSON.stringify(o.session)}`);
    return { session: o.session };
  }
  for (const [name, v] of [["cols", o.cols], ["rows", o.rows]] as const) {
    if (v !== undefined) checkSize(name, v);
  }
  if (o.command !== undefined) {
    if (o.command.length === 0 || o.command.some((a) => typeof a !== "string" || a === "" || a.includes("\0"))) {
      throw new TypeError("pty: command must be non-empty strings without NUL, program first");
    }
  }
  const env: string[] = [];
  for (const [k, v] of Object.entries(o.env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new TypeError(`pty: env name ${JSON.stringify(k)} is not a valid variable name`);
    if (v.includes("\0")) throw new TypeError(`pty: env ${k} contains NUL`);
    env.push(`${k}=${v}`);
  }
  if (o.cwd !== undefined && !o.cwd.startsWith("/")) throw new TypeError(`pty: cwd must be an absolute path, got ${JSON.stringify(o.cwd)}`);
  return { cols: o.cols, rows: o.rows, command: o.command, env: env.length ? env : undefined, cwd: o.cwd };
}

function checkSize(name: string, v: number): void {
  if (!Number.isInteger(v) || v < 1 || v > 1000) throw new RangeError(`pty: ${name} must be a whole number from 1 to 1000, got ${v}`);
}

type Ended = { kind: "exit"; code: number } | { kind: "error"; err: Error } | { kind: "closed" };

/**
 * A running terminal. Iterate it for output bytes (stdout and stderr are one stream on a
 * terminal); the iteration ends after the program exits and throws StreamError on an error
 * frame, StreamInterruptedError when the connection drops without an end frame (the program
 * keeps running for `graceSeconds`: reattach with `pty(id, {session: pty.sessionId})`).
 */
export class Pty implements AsyncIterable<Uint8Array> {
  /** The session id, for reattaching. */
  readonly sessionId: string;
  /** How long the program outlives a dropped connection. */
  readonly graceSeconds: number;
  /**
   * The program's exit code (128+n when signal n killed it). Rejects like the iteration does,
   * and with StreamInterruptedError after `close()` before the exit (the program runs on).
   */
  readonly exitCode: Promise<number>;

  #ws: WebSocketLike;
  #chunks: Uint8Array[] = [];
  #wake: (() => void) | undefined;
  #ended: Ended | undefined;
  #closedByUs = false;
  #closed: Promise<void>;
  #enc = new TextEncoder();

  /** @internal Built by `Sandboxes.pty` once the session frame has arrived. */
  constructor(o: Opened) {
    const { ws, session, closed } = o;
    this.#ws = ws;
    this.sessionId = session.id;
    this.graceSeconds = session.graceSeconds;
    this.#closed = closed;
    let settle!: (e: Ended) => void;
    const ended = new Promise<Ended>((r) => (settle = r));
    this.exitCode = ended.then((e) => {
      if (e.kind === "exit") return e.code;
      if (e.kind === "error") throw e.err;
      throw new StreamInterruptedError(
        this.#closedByUs
          ? `pty ${this.sessionId}: closed before the program exited`
          : `pty ${this.sessionId}: the connection closed without an exit frame (reattach within ${this.graceSeconds} s with {session})`,
      );
    });
    // Marked handled here; whoever awaits exitCode still gets the rejection.
    this.exitCode.catch(() => undefined);
    const end = (e: Ended) => {
      if (this.#ended) return;
      this.#ended = e;
      settle(e);
      this.#poke();
    };
    o.attach((data: unknown) => {
      if (typeof data === "string") {
        let msg: { type?: string; exitCode?: number; code?: string; message?: string };
        try {
          msg = JSON.parse(data);
        } catch {
          end({ kind: "error", err: new StreamError("invalid_frame", `not JSON: ${data.slice(0, 100)}`) });
          return;
        }
        if (msg.type === "exit" && typeof msg.exitCode === "number") end({ kind: "exit", code: msg.exitCode });
        else if (msg.type === "error") end({ kind: "error", err: new StreamError(msg.code ?? "unknown", msg.message ?? "") });
        return;
      }
      const bytes = toBytes(data);
      if (bytes && bytes.length > 0) {
        this.#chunks.push(bytes);
        this.#poke();
      }
    });
    closed.then(() => end({ kind: "closed" }));
  }

  #poke(): void {
    const w = this.#wake;
    this.#wake = undefined;
    w?.();
  }

  /** Keystrokes: a string (sent as UTF-8) or bytes; the terminal echoes and line-edits them. */
  write(data: string | Uint8Array): void {
    this.#send(typeof data === "string" ? this.#enc.encode(data) : data);
  }

  /** New terminal size (1–1000 each); the program gets SIGWINCH. */
  resize(cols: number, rows: number): void {
    checkSize("cols", cols);
    checkSize("rows", rows);
    this.#send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** A signal to the terminal's foreground process group. */
  signal(signal: PtySignal): void {
    if (!["INT", "TERM", "KILL", "HUP"].includes(signal)) throw new TypeError(`pty: signal must be INT, TERM, KILL or HUP, got ${signal}`);
    this.#send(JSON.stringify({ type: "signal", signal }));
  }

  #send(data: string | Uint8Array): void {
    if (this.#ended || this.#ws.readyState !== 1) throw new StreamInterruptedError(`pty ${this.sessionId}: the terminal is no longer connected`);
    this.#ws.send(data);
  }

  /**
   * Closes the socket. The program is not ended by this: it keeps running for the grace
   * period (send `exit` or a signal first to end it). Resolves once the socket is closed.
   */
  async close(): Promise<void> {
    if (!this.#ended) this.#closedByUs = true;
    if (this.#ws.readyState < 2) this.#ws.close(1000);
    await this.#closed;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    for (;;) {
      const c = this.#chunks.shift();
      if (c) {
        yield c;
        continue;
      }
      const e = this.#ended;
      if (e) {
        if (e.kind === "error") throw e.err;
        if (e.kind === "closed" && !this.#closedByUs) await this.exitCode; // throws StreamInterruptedError
        return;
      }
      await new Promise<void>((r) => (this.#wake = r));
    }
  }
}

function toBytes(data: unknown): Uint8Array | undefined {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return undefined;
}

/** What opening yields before the Pty exists: the socket, its session frame, and the frames after it. */
export interface Opened {
  ws: WebSocketLike;
  session: { id: string; graceSeconds: number };
  /**
   * Hands every frame after the session frame to `onFrame`, those already received first:
   * a WebSocket may deliver several frames in one task, before the awaiting caller runs.
   */
  attach(onFrame: (data: unknown) => void): void;
  closed: Promise<void>;
}

/**
 * Waits for the session frame on a new socket. Rejects with OpenFailed (what went wrong, in
 * words) so the caller can ask what the server refused: a WebSocket client sees no HTTP status.
 */
export function openSocket(ws: WebSocketLike, timeoutMs: number, signal: AbortSignal | undefined): Promise<Opened> {
  ws.binaryType = "arraybuffer";
  let onClosed!: () => void;
  const closed = new Promise<void>((r) => (onClosed = r));
  ws.addEventListener("close", () => onClosed());
  let backlog: unknown[] | undefined;
  let sink: ((data: unknown) => void) | undefined;
  const attach = (onFrame: (data: unknown) => void) => {
    for (const d of backlog ?? []) onFrame(d);
    backlog = undefined;
    sink = onFrame;
  };
  return new Promise<Opened>((resolve, reject) => {
    let done = false;
    const fail = (why: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (ws.readyState < 2) ws.close(1000);
      reject(new OpenFailed(why));
    };
    const timer = setTimeout(() => fail(`no session frame within ${timeoutMs} ms`), timeoutMs);
    if (signal) {
      if (signal.aborted) fail("aborted");
      else signal.addEventListener("abort", () => fail("aborted"), { once: true });
    }
    ws.addEventListener("error", () => fail("the WebSocket failed to open"));
    ws.addEventListener("close", (ev: { code?: number; reason?: string }) =>
      fail(`the WebSocket closed before the session frame (code ${ev.code ?? "?"}${ev.reason ? `, ${ev.reason}` : ""})`),
    );
    ws.addEventListener("message", (ev: { data: unknown }) => {
      if (sink) return sink(ev.data);
      if (backlog) return void backlog.push(ev.data);
      if (done) return;
      if (typeof ev.data !== "string") return fail("output before the session frame");
      let msg: { type?: string; id?: string; graceSeconds?: number; code?: string; message?: string };
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return fail(`the first text frame is not JSON: ${ev.data.slice(0, 100)}`);
      }
      if (msg.type === "session" && typeof msg.id === "string") {
        done = true;
        clearTimeout(timer);
        backlog = [];
        resolve({ ws, session: { id: msg.id, graceSeconds: msg.graceSeconds ?? 0 }, attach, closed });
      } else if (msg.type === "error") {
        done = true;
        clearTimeout(timer);
        if (ws.readyState < 2) ws.close(1000);
        reject(new StreamError(msg.code ?? "unknown", msg.message ?? ""));
      } else fail(`expected the session frame, got ${ev.data.slice(0, 100)}`);
    });
  });
}

/** @internal Opening failed before any answer could be read. */
export class OpenFailed extends Error {}
