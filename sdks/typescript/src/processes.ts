/**
 * Processes that outlive a connection (`/v1/sandboxes/{id}/processes`, docs/processes.md): a
 * command started in the background with a pid of the control plane's, then listed, attached to
 * from any byte offset, fed stdin, signalled, resized and killed — from any client with the key.
 * Hanging up an output stream only detaches; the process goes on.
 */
import { ExecStream } from "./exec.js";
import type { CallOptions } from "./http.js";
import { Transport } from "./http.js";
import type { Process, ProcessList, ProcessSignal, ProcessStatus, SignalProcess, StartProcessRequest, TerminalSize } from "./models.js";

/** Options of `processes.start` beyond the argv. */
export interface StartProcessOptions extends CallOptions {
  /** Over the sandbox's env from create. Never shown back. */
  env?: Record<string, string>;
  /** Absolute working directory. */
  cwd?: string;
  /** Killed after this many seconds (exit 124); unset: runs until it ends or is killed. */
  timeoutSeconds?: number;
  /** Runs on a terminal of this size (the pool needs `exec.pty`): one output stream. */
  pty?: TerminalSize;
  /** Keeps stdin open for `sendStdin` (the pool needs `exec.stdin`, or `pty`). */
  stdin?: boolean;
  /** A label of yours, shown in listings. */
  tag?: string;
}

/** Options of `processes.output`. */
export interface ProcessOutputOptions {
  /** The byte offset to start at (default 0: the oldest output kept). */
  from?: number;
  /** Until it ends, then its exit (default); `false`: the output kept now, then the end. */
  follow?: boolean;
  /** `binary` (default: the frames, exact bytes) or `sse`. */
  format?: "binary" | "sse";
  signal?: AbortSignal;
}

/**
 * A process's output: iterate it once for stdout/stderr chunks, then (once the process has
 * ended) its exit. `offset` is where to attach again from, counted from `from` (as the
 * server's SSE `id:`s are): a `from` outside the output kept begins at the nearest kept byte,
 * and then `get(…).outputBytes` is the offset to trust. `cancel()` or breaking out of the
 * loop detaches; the process goes on.
 */
export class ProcessOutput extends ExecStream {}

/** The most bytes one `POST …/stdin` takes; `sendStdin` splits larger input. */
export const MAX_STDIN_PER_CALL = 1 << 20;

const PROCESS_SIGNAL_NAMES: readonly ProcessSignal[] = ["INT", "TERM", "KILL", "HUP"];

export class Processes {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }

  /**
   * Starts `command` in the background; resolves once it was sent to the backend. Never
   * retried (a retry would start a second process).
   */
  start(sandboxId: string, command: string[], o: StartProcessOptions = {}): Promise<Process> {
    if (!Array.isArray(command) || command.length === 0 || !command[0]) {
      throw new TypeError("command must be a non-empty argv array");
    }
    const { env, cwd, timeoutSeconds, pty, stdin, tag, ...opts } = o;
    const body: StartProcessRequest = { command };
    if (env !== undefined) body.env = env;
    if (cwd !== undefined) body.cwd = cwd;
    if (timeoutSeconds !== undefined) body.timeoutSeconds = timeoutSeconds;
    if (pty !== undefined) body.pty = pty;
    if (stdin) body.stdin = true;
    if (tag !== undefined) body.tag = tag;
    return this.#t.json({ op: "startProcess", params: { id: sandboxId }, json: body, ...opts });
  }

  /** The sandbox's processes, running and recently ended, newest first. */
  async list(sandboxId: string, o: { status?: ProcessStatus } & CallOptions = {}): Promise<Process[]> {
    const { status, ...opts } = o;
    const l: ProcessList = await this.#t.json({ op: "listProcesses", params: { id: sandboxId }, query: { status }, ...opts });
    return l.items;
  }

  /** One process: status, exit code once ended, output counters. */
  get(sandboxId: string, pid: number, opts: CallOptions = {}): Promise<Process> {
    return this.#t.json({ op: "getProcess", params: { id: sandboxId, pid: pidText(pid) }, ...opts });
  }

  /** Its output from `from` (resolves once the stream starts, so a 404 throws here). */
  async output(sandboxId: string, pid: number, o: ProcessOutputOptions = {}): Promise<ProcessOutput> {
    const format = o.format ?? "binary";
    const from = o.from ?? 0;
    const follow = o.follow ?? true;
    if (!Number.isSafeInteger(from) || from < 0) throw new TypeError("from must be a byte offset >= 0");
    const abort = new AbortController();
    if (o.signal) {
      const s = o.signal;
      if (s.aborted) abort.abort(s.reason);
      else s.addEventListener("abort", () => abort.abort(s.reason), { once: true });
    }
    const a = await this.#t.request({
      op: "processOutput",
      params: { id: sandboxId, pid: pidText(pid) },
      query: { from, follow },
      headers: { accept: format === "binary" ? "application/vnd.differently.exec-stream" : "text/event-stream" },
      stream: true,
      signal: abort.signal,
    });
    const ct = a.headers.get("content-type") ?? "";
    const got = ct.startsWith("application/vnd.differently.exec-stream") ? "binary" : "sse";
    if (!a.response.body) throw new TypeError("process output answer has no body");
    return new ProcessOutput(a.response.body, got, "utf8", abort, { start: from, openEnded: !follow });
  }

  /** Waits for it to end (reading its output from the start) and resolves its exit code. */
  async wait(sandboxId: string, pid: number, o: { signal?: AbortSignal } = {}): Promise<number> {
    const out = await this.output(sandboxId, pid, o.signal ? { signal: o.signal } : {});
    for await (const _ of out) {
      // the output is read and dropped
    }
    return out.exit?.exitCode ?? -1;
  }

  /**
   * Hands `data` (text as UTF-8) to its stdin (or its terminal), in order; more than 1 MiB goes
   * in several calls. Never retried once it may have reached the process.
   */
  async sendStdin(sandboxId: string, pid: number, data: string | Uint8Array, opts: CallOptions = {}): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let off = 0;
    do {
      const part = bytes.subarray(off, off + MAX_STDIN_PER_CALL);
      off += part.length;
      await this.#t.request({
        op: "writeProcessStdin",
        params: { id: sandboxId, pid: pidText(pid) },
        raw: part as BodyInit,
        headers: { "content-type": "application/octet-stream" },
        ...opts,
      });
    } while (off < bytes.length);
  }

  /** End of input (a second close is fine). */
  async closeStdin(sandboxId: string, pid: number, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "closeProcessStdin", params: { id: sandboxId, pid: pidText(pid) }, ...opts });
  }

  /** `INT`, `TERM`, `KILL` or `HUP` to its process group (a terminal's foreground group). */
  async signal(sandboxId: string, pid: number, signal: ProcessSignal, opts: CallOptions = {}): Promise<void> {
    const name = String(signal).toUpperCase().replace(/^SIG/, "") as ProcessSignal;
    if (!PROCESS_SIGNAL_NAMES.includes(name)) throw new TypeError(`signal must be one of ${PROCESS_SIGNAL_NAMES.join(", ")}`);
    const body: SignalProcess = { signal: name };
    await this.#t.request({ op: "signalProcess", params: { id: sandboxId, pid: pidText(pid) }, json: body, ...opts });
  }

  /** A terminal process's new size (1–1000 each). */
  async resize(sandboxId: string, pid: number, size: TerminalSize, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({
      op: "resizeProcess",
      params: { id: sandboxId, pid: pidText(pid) },
      json: { cols: size.cols, rows: size.rows },
      ...opts,
    });
  }

  /** `KILL` if it still runs; an ended one is fine. */
  async kill(sandboxId: string, pid: number, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "killProcess", params: { id: sandboxId, pid: pidText(pid) }, ...opts });
  }
}

function pidText(pid: number): string {
  if (!Number.isSafeInteger(pid) || pid < 0) throw new TypeError(`pid must be a non-negative integer, got ${pid}`);
  return String(pid);
}
