/**
 * Streamed exec (`POST /v1/sandboxes/{id}/exec/stream`) as an async iterator of the events the
 * route frames: stdout/stderr chunks, then exactly one exit. An `error` event or frame is thrown
 * as StreamError; a body that ends without either as StreamInterruptedError.
 */
import { DifferentlyError, StreamError, StreamInterruptedError } from "./errors.js";
import { FRAME_ERROR, FRAME_EXIT, FRAME_STDERR, FRAME_STDOUT, FrameError } from "./frames.js";
import type { ExecExit, ExecRequest } from "./models.js";
import { parseSse } from "./sse.js";

/** Options of `exec` and `execStream` beyond the argv. */
export interface ExecOptions {
  /** Over the sandbox's env from create, over the defaults. Values are never echoed back. */
  env?: Record<string, string>;
  /** Absolute working directory. */
  cwd?: string;
  /** Fed to the command's standard input (the API takes stdin whole, in the request). */
  stdin?: string | Uint8Array;
  /** 1–86400; on timeout the exit code is 124. */
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

export interface ExecStreamOptions extends ExecOptions {
  /**
   * `binary` (default): the length-prefixed frames, exact bytes, fastest.
   * `sse`: the text/event-stream form (UTF-8 text; `outputEncoding: "base64"` for bytes).
   */
  format?: "binary" | "sse";
  /** SSE only: how output is carried in each event. */
  outputEncoding?: "utf8" | "base64";
}

const enc = new TextEncoder();

function base64Encode(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function base64Decode(b64: string): Uint8Array {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** The request body for argv + options (stdin as text or, for bytes, base64). */
export function execBody(command: string[], opts: ExecOptions & { outputEncoding?: "utf8" | "base64" }): ExecRequest {
  if (!Array.isArray(command) || command.length === 0) throw new TypeError("command must be a non-empty argv array");
  const body: ExecRequest = { command };
  if (opts.env !== undefined) body.env = opts.env;
  if (opts.cwd !== undefined) body.cwd = opts.cwd;
  if (opts.timeoutSeconds !== undefined) body.timeoutSeconds = opts.timeoutSeconds;
  if (opts.outputEncoding !== undefined) body.outputEncoding = opts.outputEncoding;
  if (typeof opts.stdin === "string") body.stdin = opts.stdin;
  else if (opts.stdin instanceof Uint8Array) body.stdinBase64 = base64Encode(opts.stdin);
  return body;
}

/** A chunk of output. `bytes` and `text` are computed on first use from what the wire carried. */
export class OutputChunk {
  readonly type: "stdout" | "stderr";
  #bytes: Uint8Array | undefined;
  #text: string | undefined;
  #b64: string | undefined;

  constructor(type: "stdout" | "stderr", from: { bytes?: Uint8Array; text?: string; base64?: string }) {
    this.type = type;
    this.#bytes = from.bytes;
    this.#text = from.text;
    this.#b64 = from.base64;
  }

  /** The raw bytes (exact in binary format and with base64 SSE). */
  get bytes(): Uint8Array {
    if (this.#bytes === undefined) {
      this.#bytes = this.#b64 !== undefined ? base64Decode(this.#b64) : enc.encode(this.#text ?? "");
    }
    return this.#bytes;
  }

  /**
   * The chunk as text. In binary format a chunk may end inside a UTF-8 character; use
   * `ExecStream.lines()` or `collect()` to decode across chunks.
   */
  get text(): string {
    if (this.#text === undefined) this.#text = new TextDecoder().decode(this.bytes);
    return this.#text;
  }
}

export interface ExitEvent extends ExecExit {
  type: "exit";
}

export type ExecEvent = OutputChunk | ExitEvent;

export interface ExecLine {
  stream: "stdout" | "stderr";
  /** Without its line end. */
  line: string;
}

export interface CollectedExec extends ExecExit {
  stdout: string;
  stderr: string;
}

/** @internal How a stream that is not an exec's reads (a process's output). */
export interface StreamReading {
  /** The byte offset the output starts at (counted on from here in binary format). */
  start?: number;
  /** The body may end without an exit: a normal end (a process read without following it). */
  openEnded?: boolean;
}

/** The error event's body: `{code, message}`, or the same inside the API's error envelope. */
function streamError(json: Record<string, unknown>): StreamError {
  const inner = json["error"];
  const e = json["code"] === undefined && inner !== null && typeof inner === "object" ? (inner as Record<string, unknown>) : json;
  return new StreamError(String(e["code"]), String(e["message"]));
}

/** One streamed exec: iterate it once (events, `lines()` or `collect()`). */
export class ExecStream implements AsyncIterable<ExecEvent> {
  readonly format: "binary" | "sse";
  #body: ReadableStream<Uint8Array>;
  #abort: AbortController;
  #encoding: "utf8" | "base64";
  #openEnded: boolean;
  #used = false;
  /** Set once the exit event has been read. */
  exit: ExecExit | undefined;
  /**
   * The byte offset just past the output read so far: SSE's `id:` of the last output event,
   * or in binary format the bytes counted from where the stream started.
   */
  offset: number;

  /** @internal */
  constructor(
    body: ReadableStream<Uint8Array>,
    format: "binary" | "sse",
    encoding: "utf8" | "base64",
    abort: AbortController,
    reading: StreamReading = {},
  ) {
    this.#body = body;
    this.format = format;
    this.#encoding = encoding;
    this.#abort = abort;
    this.#openEnded = reading.openEnded ?? false;
    this.offset = reading.start ?? 0;
  }

  /** Hangs up: the server cancels the command on the backend. */
  cancel(): void {
    this.#abort.abort(new DifferentlyError("exec stream cancelled"));
  }

  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    if (this.#used) throw new DifferentlyError("an ExecStream can be iterated only once");
    this.#used = true;
    return this.format === "binary" ? this.#binary() : this.#events();
  }

  /** The SSE form. */
  async *#events(): AsyncGenerator<ExecEvent> {
    let ended = false;
    try {
      {
        const b64 = this.#encoding === "base64";
        for await (const m of parseSse(this.#body)) {
          switch (m.event) {
            case "stdout":
            case "stderr": {
              const d = (JSON.parse(m.data) as { data: string }).data;
              if (m.id !== undefined && /^\d+$/.test(m.id)) this.offset = Number(m.id);
              yield new OutputChunk(m.event, b64 ? { base64: d } : { text: d });
              break;
            }
            case "exit": {
              const x = JSON.parse(m.data) as ExecExit;
              this.exit = { exitCode: x.exitCode, durationMs: x.durationMs };
              ended = true;
              yield { type: "exit", ...this.exit };
              return;
            }
            case "error": {
              ended = true;
              throw streamError(JSON.parse(m.data) as Record<string, unknown>);
            }
            default:
              break;
          }
        }
        if (this.#openEnded) {
          ended = true;
          return;
        }
      }
    } catch (err) {
      if (err instanceof StreamError || err instanceof DifferentlyError) throw err;
      if (err instanceof FrameError) throw new StreamInterruptedError(`exec stream corrupt: ${err.message}`, { cause: err });
      if (this.#abort.signal.aborted) throw this.#abort.signal.reason;
      throw new StreamInterruptedError("exec stream broke before the exit event (connection lost)", { cause: err });
    } finally {
      if (!ended) this.#abort.abort();
    }
    throw new StreamInterruptedError("exec stream ended without an exit event (connection lost)");
  }

  /**
   * The binary frames, decoded inline for throughput: output is yielded as views of each read
   * as soon as it arrives (a chunk boundary may fall anywhere anyway), never reassembled into
   * whole frames; only the small exit/error payloads are collected.
   */
  async *#binary(): AsyncGenerator<ExecEvent> {
    const reader = this.#body.getReader();
    const hdr = new Uint8Array(8);
    let hdrFill = 0;
    let type = -1; // -1: reading a header
    let remaining = 0;
    let ctrl: Uint8Array[] = [];
    const finish = (): ExecEvent | undefined => {
      const t = type;
      type = -1;
      if (t !== FRAME_EXIT && t !== FRAME_ERROR) return undefined;
      const len = ctrl.reduce((n, c) => n + c.length, 0);
      const all = new Uint8Array(len);
      let o = 0;
      for (const c of ctrl) {
        all.set(c, o);
        o += c.length;
      }
      ctrl = [];
      const json = JSON.parse(new TextDecoder().decode(all)) as Record<string, unknown>;
      ended = true;
      if (t === FRAME_ERROR) throw streamError(json);
      this.exit = { exitCode: Number(json["exitCode"]), durationMs: Number(json["durationMs"]) };
      return { type: "exit", ...this.exit };
    };
    let ended = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          if (type !== -1 || hdrFill > 0) throw new StreamInterruptedError("exec stream ended inside a frame (connection lost)");
          if (this.#openEnded) {
            ended = true;
            return;
          }
          throw new StreamInterruptedError("exec stream ended without an exit frame (connection lost)");
        }
        let off = 0;
        while (off < value.length) {
          if (type === -1) {
            const k = Math.min(8 - hdrFill, value.length - off);
            hdr.set(value.subarray(off, off + k), hdrFill);
            hdrFill += k;
            off += k;
            if (hdrFill < 8) break;
            hdrFill = 0;
            if (hdr[1] !== 0 || hdr[2] !== 0 || hdr[3] !== 0) throw new FrameError(`malformed frame header (type ${hdr[0]})`);
            type = hdr[0]!;
            remaining = ((hdr[4]! << 24) >>> 0) + (hdr[5]! << 16) + (hdr[6]! << 8) + hdr[7]!;
            if (remaining === 0) {
              const ev = finish();
              if (ev) {
                yield ev;
                return;
              }
            }
            continue;
          }
          const k = Math.min(remaining, value.length - off);
          const piece = value.subarray(off, off + k);
          off += k;
          remaining -= k;
          if (type === FRAME_STDOUT || type === FRAME_STDERR) {
            this.offset += piece.length;
            yield new OutputChunk(type === FRAME_STDOUT ? "stdout" : "stderr", { bytes: piece });
          }
          else if (type === FRAME_EXIT || type === FRAME_ERROR) ctrl.push(piece.slice());
          // other types (heartbeat has no payload; unknown future types) are skipped
          if (remaining === 0) {
            const ev = finish();
            if (ev) {
              yield ev;
              return;
            }
          }
        }
      }
    } catch (err) {
      if (err instanceof DifferentlyError) throw err;
      if (err instanceof FrameError) throw new StreamInterruptedError(`exec stream corrupt: ${err.message}`, { cause: err });
      if (this.#abort.signal.aborted) throw this.#abort.signal.reason;
      throw new StreamInterruptedError("exec stream broke before the exit frame (connection lost)", { cause: err });
    } finally {
      if (!ended) this.#abort.abort();
      reader.releaseLock();
      await this.#body.cancel().catch(() => undefined);
    }
  }

  /** Output as lines per stream, in arrival order, decoded across chunk boundaries. */
  async *lines(): AsyncGenerator<ExecLine> {
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const rest = { stdout: "", stderr: "" };
    for await (const ev of this) {
      if (ev instanceof OutputChunk) {
        const t = ev.type;
        const s = rest[t] + (this.format === "binary" ? dec[t].decode(ev.bytes, { stream: true }) : ev.text);
        const parts = s.split("\n");
        rest[t] = parts.pop() ?? "";
        for (const line of parts) yield { stream: t, line };
      }
    }
    for (const t of ["stdout", "stderr"] as const) {
      const last = rest[t] + dec[t].decode();
      if (last) yield { stream: t, line: last };
    }
  }

  /** Reads everything: the exit code and the whole output as text. */
  async collect(): Promise<CollectedExec> {
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const out = { stdout: [] as string[], stderr: [] as string[] };
    for await (const ev of this) {
      if (ev instanceof OutputChunk) {
        out[ev.type].push(this.format === "binary" ? dec[ev.type].decode(ev.bytes, { stream: true }) : ev.text);
      }
    }
    const exit = this.exit;
    if (!exit) throw new StreamInterruptedError("exec stream ended without an exit event");
    return {
      ...exit,
      stdout: out.stdout.join("") + dec.stdout.decode(),
      stderr: out.stderr.join("") + dec.stderr.decode(),
    };
  }
}
