/**
 * The transport: one `fetch` per attempt, the API key in a header and nowhere else, errors
 * mapped to the hierarchy in `errors.ts`, and retries only where a repeat cannot do harm.
 */
import {
  ApiError,
  apiErrorFor,
  ConnectionError,
  DifferentlyError,
  TimeoutError,
} from "./errors.js";
import type { WebSocketConstructor, WebSocketLike } from "./pty.js";
import { fillPath, IDEMPOTENT_CREATES, ROUTES, SHOWS_SECRET_ONCE, type OperationId } from "./routes.js";

export type QueryValue = string | number | boolean | undefined | null | readonly string[];

export interface ClientOptions {
  /** e.g. `http://127.0.0.1:7070` (what `differently dev` prints as DIFFERENTLY_URL). */
  baseUrl: string;
  /** `dly_<keyid>_<secret>`. Kept private: never logged, never in an error or `inspect`. */
  apiKey?: string;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
  /** Deadline per attempt for non-streamed calls, and until the headers for streamed ones. Default 60 s. */
  timeoutMs?: number;
  /** Retries of a safe request after a connection failure, 429 `rate_limited`, 502, 503 or 504. Default 2. */
  maxRetries?: number;
  /** Longest `Retry-After` honoured before giving up and throwing. Default 30 s. */
  maxRetryAfterMs?: number;
  /** Extra headers on every request (not for the key). */
  headers?: Record<string, string>;
  /**
   * The WebSocket for `sandboxes.pty` instead of the global one (Node 20 has it only behind
   * `--experimental-websocket`). With an `apiKey` it must accept Node's `{headers}` init.
   */
  webSocket?: WebSocketConstructor;
}

export interface CallOptions {
  signal?: AbortSignal;
  /** Overrides the client's `timeoutMs` for this call. */
  timeoutMs?: number;
  /** Your own `Idempotency-Key` for a creating POST (else the SDK makes one). */
  idempotencyKey?: string;
}

export interface RequestSpec extends CallOptions {
  op: OperationId;
  params?: Record<string, string>;
  query?: Record<string, QueryValue>;
  /** A JSON body (serialized here). */
  json?: unknown;
  /** A raw body (file upload). A ReadableStream is sent as is and never retried. */
  raw?: BodyInit;
  headers?: Record<string, string>;
  /** Return as soon as the headers arrive; the caller reads the body. */
  stream?: boolean;
}

/** A finished answer (`body` read) or a streamed one (`body` undefined, read `response.body`). */
export interface Answer {
  status: number;
  headers: Headers;
  response: Response;
  body: Uint8Array | undefined;
}

const RETRY_STATUSES = new Set([502, 503, 504]);

/**
 * Sleeps at least `ms` by the wall clock, or rejects when the signal aborts. A timer alone can
 * fire early against it (Node arms it from the event loop's cached time, which lags behind
 * under load), and a server's `Retry-After` is a minimum: so it re-arms until the time has
 * really passed.
 */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  const until = Date.now() + ms;
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const arm = () => {
      const left = until - Date.now();
      if (left <= 0) {
        signal?.removeEventListener("abort", onAbort);
        resolve();
        return;
      }
      timer = setTimeout(arm, left);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    arm();
  });
}

/** `Retry-After` as milliseconds: delta-seconds or an HTTP date. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const s = value.trim();
  if (/^\d+$/.test(s)) return Number(s) * 1000;
  const at = Date.parse(s);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** A random id for `Idempotency-Key` (Web Crypto: browsers and Node >= 20). */
export function newIdempotencyKey(): string {
  const c = (globalThis as { crypto?: Crypto }).crypto;
  if (c && typeof c.randomUUID === "function") return c.randomUUID();
  const b = new Uint8Array(16);
  if (!c) throw new DifferentlyError("no Web Crypto available to make an Idempotency-Key; pass idempotencyKey");
  c.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** The innermost `code` of a fetch failure (undici nests it in `cause`, sometimes an AggregateError). */
function networkCode(err: unknown): string | undefined {
  let e: unknown = err;
  for (let i = 0; i < 5 && e; i++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && code !== "ERR_INVALID_STATE") return code;
    const inner = (e as { errors?: unknown[] }).errors;
    if (Array.isArray(inner) && inner.length > 0) {
      const c = networkCode(inner[0]);
      if (c) return c;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** A connection failure, phrased as what to do about it. */
export function connectionError(baseUrl: string, err: unknown): ConnectionError {
  const code = networkCode(err);
  let msg: string;
  switch (code) {
    case "ECONNREFUSED":
      msg = `connection refused at ${baseUrl} — is \`differently dev\` running? (check the URL or DIFFERENTLY_URL)`;
      break;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      msg = `cannot resolve the host of ${baseUrl} — check the URL or DIFFERENTLY_URL`;
      break;
    case "ECONNRESET":
    case "UND_ERR_SOCKET":
    case "EPIPE":
      msg = `the connection to ${baseUrl} was closed mid-request — the server may have restarted; try again`;
      break;
    case "ETIMEDOUT":
    case "UND_ERR_CONNECT_TIMEOUT":
      msg = `connecting to ${baseUrl} timed out — is the server reachable from here?`;
      break;
    default: {
      const detail = code ?? (err instanceof Error ? err.message : String(err));
      msg = `cannot reach ${baseUrl} (${detail}) — is the server running and the URL right?`;
    }
  }
  return new ConnectionError(msg, baseUrl, err);
}

/** Reads an error answer into an ApiError (any body: envelope, text, or none). */
async function errorFrom(method: string, path: string, res: Response): Promise<ApiError> {
  let code = `http_${res.status}`;
  let message = res.statusText || "error";
  let details: Record<string, unknown> | undefined;
  let requestId: string | undefined = res.headers.get("x-request-id") ?? undefined;
  const text = await res.text().catch(() => "");
  try {
    const env = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; details?: unknown; requestId?: unknown } };
    const e = env.error;
    if (e && typeof e === "object") {
      if (typeof e.code === "string") code = e.code;
      if (typeof e.message === "string") message = e.message;
      if (e.details && typeof e.details === "object") details = e.details as Record<string, unknown>;
      if (typeof e.requestId === "string") requestId = e.requestId;
    }
  } catch {
    if (text) message = text.length > 300 ? `${text.slice(0, 300)}…` : text;
  }
  const ra = parseRetryAfter(res.headers.get("retry-after"));
  return apiErrorFor({
    status: res.status,
    code,
    message,
    details,
    requestId,
    method,
    path,
    retryAfterSeconds: ra === undefined ? undefined : Math.ceil(ra / 1000),
  });
}

function isReplayable(body: BodyInit | undefined): boolean {
  return !(typeof ReadableStream !== "undefined" && body instanceof ReadableStream);
}

export class Transport {
  readonly baseUrl: string;
  readonly #apiKey: string | undefined;
  readonly #fetch: typeof fetch;
  readonly #timeoutMs: number;
  readonly #maxRetries: number;
  readonly #maxRetryAfterMs: number;
  readonly #headers: Record<string, string>;
  readonly #webSocket: WebSocketConstructor | undefined;

  constructor(opts: ClientOptions) {
    if (!opts.baseUrl) throw new TypeError("baseUrl is required (e.g. http://127.0.0.1:7070)");
    let url: URL;
    try {
      url = new URL(opts.baseUrl);
    } catch {
      throw new TypeError(`baseUrl is not a URL: ${opts.baseUrl}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`baseUrl must be http(s): ${opts.baseUrl}`);
    }
    this.baseUrl = url.toString().replace(/\/+$/, "");
    this.#apiKey = opts.apiKey;
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("no fetch available: pass options.fetch");
    this.#fetch = f.bind(globalThis);
    this.#timeoutMs = opts.timeoutMs ?? 60_000;
    this.#maxRetries = opts.maxRetries ?? 2;
    this.#maxRetryAfterMs = opts.maxRetryAfterMs ?? 30_000;
    this.#headers = { ...(opts.headers ?? {}) };
    this.#webSocket = opts.webSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    for (const k of Object.keys(this.#headers)) {
      if (k.toLowerCase() === "authorization") throw new TypeError("pass the key as apiKey, not as a header");
    }
  }

  /** Whether this transport was given a key (the key itself is never exposed). */
  get hasApiKey(): boolean {
    return this.#apiKey !== undefined;
  }

  /** The default per-attempt deadline (`timeoutMs`). */
  get timeoutMs(): number {
    return this.#timeoutMs;
  }

  /**
   * Opens a WebSocket to `op` (ws:// or wss:// for the base URL's http/https), the key in the
   * `Authorization` header and never in the URL.
   */
  webSocket(op: OperationId, params: Record<string, string>, query: Record<string, QueryValue>): WebSocketLike {
    const WS = this.#webSocket;
    if (typeof WS !== "function") {
      throw new TypeError(
        "no WebSocket available: use Node >= 22 or a browser, run Node 20 with --experimental-websocket, or pass options.webSocket",
      );
    }
    const url = this.url(op, params, query).replace(/^http/, "ws");
    if (this.#apiKey === undefined) return new WS(url);
    const headers = { ...this.#headers, authorization: `Bearer ${this.#apiKey}` };
    try {
      return new WS(url, { headers });
    } catch (err) {
      // A browser's WebSocket takes protocols, not headers, and throws on the object.
      throw new TypeError(
        "this WebSocket cannot send headers (a browser's cannot): the API takes the key only in the Authorization header, " +
          "so open terminals from Node, or through a same-origin proxy that adds the header and a client without apiKey",
        { cause: err },
      );
    }
  }

  url(op: OperationId, params: Record<string, string> = {}, query: Record<string, QueryValue> = {}): string {
    const path = fillPath(ROUTES[op].path, params);
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v === undefined || v === null) continue;
      if (Array.isArray(v)) for (const x of v) qs.append(k, x);
      else qs.append(k, String(v));
    }
    const s = qs.toString();
    return `${this.baseUrl}${path}${s ? `?${s}` : ""}`;
  }

  /**
   * Sends a request, retrying where safe; throws ApiError for an error status. For
   * `stream: true` the body is left unread (the timeout covers the headers only).
   */
  async request(spec: RequestSpec): Promise<Answer> {
    const { method, path: template } = ROUTES[spec.op];
    const url = this.url(spec.op, spec.params, spec.query);
    const path = fillPath(template, spec.params ?? {});
    const headers: Record<string, string> = { ...this.#headers, ...(spec.headers ?? {}) };
    if (this.#apiKey !== undefined) headers["authorization"] = `Bearer ${this.#apiKey}`;
    let body: BodyInit | undefined;
    if (spec.json !== undefined) {
      body = JSON.stringify(spec.json);
      headers["content-type"] = "application/json";
    } else if (spec.raw !== undefined) {
      body = spec.raw;
      headers["content-type"] ??= "application/octet-stream";
    }
    const creates = method === "POST" && IDEMPOTENT_CREATES.has(spec.op);
    if (creates) headers["idempotency-key"] = spec.idempotencyKey ?? newIdempotencyKey();
    const safe =
      (method === "GET" || method === "PUT" || method === "DELETE" || (creates && !SHOWS_SECRET_ONCE.has(spec.op))) &&
      isReplayable(body);
    const maxRetries = safe ? this.#maxRetries : 0;
    const timeoutMs = spec.timeoutMs ?? this.#timeoutMs;

    for (let attempt = 0; ; attempt++) {
      const ctl = new AbortController();
      const onAbort = () => ctl.abort(spec.signal?.reason);
      if (spec.signal?.aborted) throw spec.signal.reason;
      spec.signal?.addEventListener("abort", onAbort, { once: true });
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        ctl.abort(new TimeoutError(`${method} ${path}: no answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        spec.signal?.removeEventListener("abort", onAbort);
      };
      let res: Response;
      try {
        const init: RequestInit & { duplex?: "half" } = { method, headers, signal: ctl.signal };
        if (body !== undefined) init.body = body;
        if (!isReplayable(body)) init.duplex = "half";
        res = await this.#fetch(url, init);
      } catch (err) {
        cleanup();
        if (spec.signal?.aborted) throw spec.signal.reason;
        if (timedOut) throw new TimeoutError(`${method} ${path}: no answer within ${timeoutMs} ms`);
        const ce = connectionError(this.baseUrl, err);
        if (attempt < maxRetries) {
          await sleep(backoff(attempt), spec.signal);
          continue;
        }
        throw ce;
      }
      if (res.ok) {
        if (spec.stream) {
          // The deadline was for the headers; the body runs as long as it runs, and the
          // caller's abort (still wired to ctl) ends it.
          clearTimeout(timer);
          return { status: res.status, headers: res.headers, response: res, body: undefined };
        }
        try {
          const buf = new Uint8Array(await res.arrayBuffer());
          cleanup();
          return { status: res.status, headers: res.headers, response: res, body: buf };
        } catch (err) {
          cleanup();
          if (spec.signal?.aborted) throw spec.signal.reason;
          if (timedOut) throw new TimeoutError(`${method} ${path}: no answer within ${timeoutMs} ms`);
          throw connectionError(this.baseUrl, err);
        }
      }
      let apiErr: ApiError;
      try {
        apiErr = await errorFrom(method, path, res);
      } finally {
        cleanup();
      }
      const retryable =
        RETRY_STATUSES.has(res.status) || (res.status === 429 && apiErr.code === "rate_limited");
      if (retryable && attempt < maxRetries) {
        const ra = apiErr.retryAfterSeconds === undefined ? undefined : apiErr.retryAfterSeconds * 1000;
        if (ra === undefined || ra <= this.#maxRetryAfterMs) {
          await sleep(ra ?? backoff(attempt), spec.signal);
          continue;
        }
      }
      throw apiErr;
    }
  }

  /** `request` and the body as JSON (`undefined` for 204). */
  async json<T>(spec: RequestSpec): Promise<T> {
    const a = await this.request({ ...spec, stream: false });
    if (a.status === 204 || !a.body) return undefined as T;
    const text = new TextDecoder().decode(a.body);
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new DifferentlyError(`${ROUTES[spec.op].method} ${ROUTES[spec.op].path}: answer is not JSON`, {
        cause: err,
      });
    }
  }

  toJSON(): Record<string, unknown> {
    return { baseUrl: this.baseUrl, apiKey: this.#apiKey === undefined ? undefined : "[redacted]" };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Transport { baseUrl: '${this.baseUrl}', apiKey: ${this.#apiKey === undefined ? "none" : "[redacted]"} }`;
  }
}

/** 200 ms, 400 ms, 800 ms … (cap 5 s), with ±25 % jitter. */
function backoff(attempt: number): number {
  const base = Math.min(5_000, 200 * 2 ** attempt);
  return base * (0.75 + Math.random() * 0.5);
}
