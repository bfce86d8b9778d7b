/**
 * `Differently`: the client. One Transport, and one small resource object per area of the API
 * (sandboxes, files, snapshots, events, webhooks, tenancy, operators), each method one route.
 */
import { DifferentlyError, InvalidArgumentError, NotFoundError, WaitError } from "./errors.js";
import {
  EventStream,
  type EventMessage,
  type EventsOptions,
  type PublicEventMessage,
  type PublicEventsOptions,
  type StatusEventsOptions,
} from "./events.js";
import { execBody, ExecStream, type ExecOptions, type ExecStreamOptions } from "./exec.js";
import { Transport, type CallOptions, type ClientOptions, type QueryValue } from "./http.js";
import { Processes } from "./processes.js";
import { OpenFailed, openSocket, Pty, ptyQuery, type PtyOptions } from "./pty.js";
import {
  FINAL_STATUSES,
  type AuditEvent,
  type AuditSegment,
  type Checkpoint,
  type CreatedKey,
  type CreateKeyRequest,
  type CreateOrgRequest,
  type CreateProjectRequest,
  type CreateSandboxRequest,
  type CreateWebhookRequest,
  type DryRun,
  type EventCredentials,
  type EventCredentialsRequest,
  type EventSchemaList,
  type ExecResult,
  type FileEntry,
  type FileList,
  type MadeDir,
  type MakeDirectoryRequest,
  type Health,
  type Key,
  type ListAuditParams,
  type ListSandboxesParams,
  type MetricsSummary,
  type Org,
  type Page,
  type PendingOperation,
  type Placement,
  type Policy,
  type Pool,
  type PoolRecord,
  type PoolRequest,
  type WarmClass,
  type WarmClasses,
  type WarmClassesRequest,
  type PortAnswer,
  type Project,
  type PublicEventType,
  type QueueReport,
  type Quota,
  type QuotaView,
  type Sandbox,
  type SandboxStatus,
  type Secret,
  type Snapshot,
  type SnapshotStatus,
  type TrustReport,
  type UpdateOrgRequest,
  type UpdateProjectRequest,
  type UpdateSandboxRequest,
  type UpdateWebhookRequest,
  type Verification,
  type Webhook,
  type WebhookDelivery,
  type WebhookWithSecret,
} from "./models.js";

export interface PageParams {
  limit?: number;
  cursor?: string;
}

/** Walks every page from `first` on (the cursor is opaque; `nextCursor: null` ends it). */
async function* paginate<T>(fetchPage: (cursor: string | undefined) => Promise<Page<T>>, cursor?: string): AsyncGenerator<T> {
  let next: string | undefined = cursor;
  for (;;) {
    const page = await fetchPage(next);
    for (const item of page.items) yield item;
    if (!page.nextCursor) return;
    next = page.nextCursor;
  }
}

function pageQuery(p: PageParams): Record<string, QueryValue> {
  return { limit: p.limit, cursor: p.cursor };
}

/** Polls with the server-side `/wait` (≤ 300 s per call) until `status`, a final status, or the deadline. */
export interface WaitOptions extends CallOptions {
  /** Default `running`. */
  status?: SandboxStatus;
  /** Overall deadline; default 120 s. */
  timeoutMs?: number;
}

export class Sandboxes {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }

  /** 202: `queued`, or already `provisioning`. The SDK sends an Idempotency-Key, so a retry never creates twice. */
  create(req: CreateSandboxRequest = {}, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "createSandbox", json: req, ...opts });
  }

  get(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "getSandbox", params: { id }, ...opts });
  }

  /** One page; `iterate` walks them all. `labels`: every pair must match (one `label=` each). */
  list(params: ListSandboxesParams = {}, opts: CallOptions = {}): Promise<Page<Sandbox>> {
    const label = Object.entries(params.labels ?? {}).map(([k, v]) => `${k}=${v}`);
    return this.#t.json({
      op: "listSandboxes",
      query: { status: params.status, label, projectId: params.projectId, ...pageQuery(params) },
      ...opts,
    });
  }

  iterate(params: ListSandboxesParams = {}, opts: CallOptions = {}): AsyncGenerator<Sandbox> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }

  /**
   * Waits until the sandbox has `status` (default `running`). Throws WaitError when it reaches
   * another final status (`failed`, `terminated`) or the deadline passes; `err.last` is the sandbox.
   */
  async wait(id: string, opts: WaitOptions = {}): Promise<Sandbox> {
    const want = opts.status ?? "running";
    const deadline = Date.now() + (opts.timeoutMs ?? 120_000);
    for (;;) {
      const left = Math.max(0, deadline - Date.now());
      const secs = Math.min(300, Math.ceil(left / 1000));
      const sbx: Sandbox = await this.#t.json({
        op: "waitSandbox",
        params: { id },
        query: { status: want, timeoutSeconds: secs },
        timeoutMs: secs * 1000 + 30_000,
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      if (sbx.status === want) return sbx;
      if (FINAL_STATUSES.includes(sbx.status)) {
        throw new WaitError(`sandbox ${id} is ${sbx.status} (${sbx.statusReason ?? "no reason"}), not ${want}`, sbx);
      }
      if (Date.now() >= deadline) throw new WaitError(`sandbox ${id} is still ${sbx.status}, not ${want}, at the deadline`, sbx);
    }
  }

  /** TTL renew, labels (replaces the caller's), idle timeout (`null` clears it). */
  update(id: string, patch: UpdateSandboxRequest, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "updateSandbox", params: { id }, json: patch, ...opts });
  }

  /** Counts as activity (resets the idle clock). */
  async keepalive(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "keepalive", params: { id }, ...opts });
  }

  /** 200 when done (or already there), 202 while still in progress: the sandbox either way. */
  pause(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "pauseSandbox", params: { id }, ...opts });
  }
  resume(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "resumeSandbox", params: { id }, ...opts });
  }
  stop(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "stopSandbox", params: { id }, ...opts });
  }
  start(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "startSandbox", params: { id }, ...opts });
  }

  /** 202 `terminating` (or the ended sandbox as it is). */
  delete(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#t.json({ op: "deleteSandbox", params: { id }, ...opts });
  }

  /** Buffered exec: each of stdout/stderr keeps 1 MiB (`…Truncated` beyond). Never retried. */
  exec(id: string, command: string[], opts: ExecOptions & { outputEncoding?: "utf8" | "base64" } = {}): Promise<ExecResult> {
    const { signal } = opts;
    return this.#t.json({
      op: "exec",
      params: { id },
      json: execBody(command, opts),
      timeoutMs: (opts.timeoutSeconds ?? 3600) * 1000 + 30_000,
      ...(signal ? { signal } : {}),
    });
  }

  /**
   * Streamed exec: resolves once the stream starts (so a 404/422/501 throws here), then iterate
   * the ExecStream. Breaking out of the loop or `cancel()` hangs up, which cancels the command.
   */
  async execStream(id: string, command: string[], opts: ExecStreamOptions = {}): Promise<ExecStream> {
    const format = opts.format ?? "binary";
    const abort = new AbortController();
    if (opts.signal) {
      const s = opts.signal;
      if (s.aborted) abort.abort(s.reason);
      else s.addEventListener("abort", () => abort.abort(s.reason), { once: true });
    }
    const encoding = format === "sse" ? (opts.outputEncoding ?? "utf8") : "utf8";
    const body = execBody(command, { ...opts, ...(format === "sse" && opts.outputEncoding ? { outputEncoding: opts.outputEncoding } : {}) });
    const a = await this.#t.request({
      op: "execStream",
      params: { id },
      json: body,
      headers: { accept: format === "binary" ? "application/vnd.differently.exec-stream" : "text/event-stream" },
      stream: true,
      signal: abort.signal,
    });
    const ct = a.headers.get("content-type") ?? "";
    const got = ct.startsWith("application/vnd.differently.exec-stream") ? "binary" : "sse";
    if (!a.response.body) throw new TypeError("exec stream answer has no body");
    return new ExecStream(a.response.body, got, encoding, abort);
  }

  /**
   * An interactive terminal (capability `exec.pty`): resolves once the session is open, then
   * `write()`, iterate the output, `resize()`, `signal()`, await `exitCode`, `close()`.
   * Needs a WebSocket that can send the key header (Node; see `ClientOptions.webSocket`).
   */
  async pty(id: string, opts: PtyOptions = {}): Promise<Pty> {
    const query = ptyQuery(opts);
    const ws = this.#t.webSocket("openPty", { id }, query);
    try {
      return new Pty(await openSocket(ws, opts.timeoutMs ?? this.#t.timeoutMs, opts.signal));
    } catch (err) {
      if (err instanceof OpenFailed) throw await this.#whyNoPty(id, query, opts, err.message);
      throw err;
    }
  }

  /**
   * A WebSocket client sees no HTTP status, so after a failed open this asks the API what it
   * would refuse: the same URL without the upgrade (key and parameters: 401/403/400 with the
   * field), then the sandbox itself (404, not running).
   */
  async #whyNoPty(id: string, query: Record<string, QueryValue>, opts: PtyOptions, why: string): Promise<Error> {
    const where = `GET /v1/sandboxes/${id}/pty`;
    try {
      await this.#t.request({ op: "openPty", params: { id }, query });
    } catch (err) {
      // The one answer that says nothing: "this route is a WebSocket" (key and query are fine).
      if (!(err instanceof InvalidArgumentError && err.field === undefined)) return err as Error;
    }
    let sbx: Sandbox;
    try {
      sbx = await this.get(id);
    } catch (err) {
      return err as Error;
    }
    const hint = opts.session
      ? `the session may have ended or belong to another key (404)`
      : sbx.status !== "running"
        ? `the API opens terminals only in running sandboxes (409)`
        : `its pool may lack exec.pty (501)`;
    return new DifferentlyError(`${where}: ${why}; the sandbox is ${sbx.status} on pool ${sbx.pool ?? "none"}: ${hint}`);
  }

  /** The stored placement explanation. */
  placement(id: string, opts: CallOptions = {}): Promise<Placement> {
    return this.#t.json({ op: "getPlacement", params: { id }, ...opts });
  }

  /** 200 `{url, expiresAt}`, or 202 `{operation, status}` while pending. */
  exposePort(id: string, port: number, o: { expiresSeconds?: number } & CallOptions = {}): Promise<PortAnswer | PendingOperation> {
    const { expiresSeconds, ...opts } = o;
    return this.#t.json({ op: "exposePort", params: { id }, json: { port, ...(expiresSeconds ? { expiresSeconds } : {}) }, ...opts });
  }

  /** A snapshot of this sandbox (202; `ready` once the backend says so — see `snapshots.wait`). */
  snapshot(id: string, o: { name?: string } & CallOptions = {}): Promise<Snapshot> {
    const { name, ...opts } = o;
    return this.#t.json({ op: "createSnapshot", params: { id }, json: name === undefined ? {} : { name }, ...opts });
  }

  /** Snapshots of this sandbox, one page. */
  snapshots(id: string, params: PageParams = {}, opts: CallOptions = {}): Promise<Page<Snapshot>> {
    return this.#t.json({ op: "listSandboxSnapshots", params: { id }, query: pageQuery(params), ...opts });
  }

  /** Restore/fork: a new sandbox from a ready snapshot (pinned to the pool holding it). */
  fork(snapshotId: string, req: Omit<CreateSandboxRequest, "fromSnapshot"> = {}, opts: CallOptions = {}): Promise<Sandbox> {
    return this.create({ ...req, fromSnapshot: snapshotId }, opts);
  }
}

/** Byte range for a download: `{start, end?}` (inclusive end) or `{suffix}` (the last n bytes). */
export type ByteRange = { start: number; end?: number } | { suffix: number };

export class Files {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }

  /**
   * Writes `data` at `path` (absolute; parents are created). `mode` is octal text or a number
   * (`"644"`, `0o644`). A ReadableStream is streamed and, unlike a buffer, never retried.
   */
  async upload(
    id: string,
    path: string,
    data: string | Uint8Array | Blob | ArrayBuffer | ReadableStream<Uint8Array>,
    o: { mode?: string | number } & CallOptions = {},
  ): Promise<void> {
    const { mode, ...opts } = o;
    const m = mode === undefined ? undefined : typeof mode === "number" ? mode.toString(8) : mode;
    await this.#t.request({ op: "uploadFile", params: { id }, query: { path, mode: m }, raw: data as BodyInit, ...opts });
  }

  /** The file's bytes (or the range's: 206). */
  async download(id: string, path: string, o: { range?: ByteRange } & CallOptions = {}): Promise<Uint8Array> {
    const { range, ...opts } = o;
    const a = await this.#t.request({ op: "downloadFile", params: { id }, query: { path }, headers: rangeHeader(range), ...opts });
    return a.body ?? new Uint8Array(0);
  }

  /** The file as UTF-8 text. */
  async downloadText(id: string, path: string, opts: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.download(id, path, opts));
  }

  /** The file as a stream (large files: nothing is buffered). */
  async downloadStream(id: string, path: string, o: { range?: ByteRange } & CallOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const { range, ...opts } = o;
    const a = await this.#t.request({ op: "downloadFile", params: { id }, query: { path }, headers: rangeHeader(range), stream: true, ...opts });
    return a.response.body ?? new ReadableStream({ start: (c) => c.close() });
  }

  /** Entries under a directory (`depth` 1–16, default 1); a file's path lists the file itself. */
  async list(id: string, path: string, o: { depth?: number } & CallOptions = {}): Promise<FileEntry[]> {
    const { depth, ...opts } = o;
    const l: FileList = await this.#t.json({ op: "listFiles", params: { id }, query: { path, depth }, ...opts });
    return l.items;
  }

  /**
   * One entry's metadata. There is no stat route: this lists the parent directory and picks
   * the entry (NotFoundError when absent, as the API says for a missing file).
   */
  async stat(id: string, path: string, opts: CallOptions = {}): Promise<FileEntry> {
    const clean = path.length > 1 ? path.replace(/\/+$/, "") : path;
    if (clean === "/") return { path: "/", type: "dir", size: 0, mode: 0o755, modifiedAt: null };
    const parent = clean.slice(0, clean.lastIndexOf("/")) || "/";
    const items = await this.list(id, parent, { depth: 1, ...opts });
    const hit = items.find((e) => e.path === clean);
    if (!hit) {
      throw new NotFoundError({ status: 404, code: "not_found", message: `no such file: ${clean}`, method: "GET", path: `files/list?path=${parent}` });
    }
    return hit;
  }

  async delete(id: string, path: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "deleteFile", params: { id }, query: { path }, ...opts });
  }

  /**
   * Makes the directory at `path` (absolute) and its missing parents, like `mkdir -p` (parents
   * get `755`). `mode` is octal text or a number (`"750"`, `0o750`; default `755`). `created`
   * is true when it was made (201), false when a directory was already there (200, its mode
   * left as it was). A file at `path` or among its parents is a ConflictError (409,
   * `details.reason` `exists_not_directory` or `not_a_directory`).
   */
  async makeDir(id: string, path: string, o: { mode?: string | number } & CallOptions = {}): Promise<MadeDir> {
    const { mode, ...opts } = o;
    const body: MakeDirectoryRequest = { path };
    if (mode !== undefined) body.mode = typeof mode === "number" ? mode.toString(8) : mode;
    return this.#t.json({ op: "makeDirectory", params: { id }, json: body, ...opts });
  }
}

function rangeHeader(range: ByteRange | undefined): Record<string, string> {
  if (!range) return {};
  if ("suffix" in range) return { range: `bytes=-${range.suffix}` };
  return { range: `bytes=${range.start}-${range.end ?? ""}` };
}

export class Snapshots {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  create(sandboxId: string, o: { name?: string } & CallOptions = {}): Promise<Snapshot> {
    const { name, ...opts } = o;
    return this.#t.json({ op: "createSnapshot", params: { id: sandboxId }, json: name === undefined ? {} : { name }, ...opts });
  }
  get(id: string, opts: CallOptions = {}): Promise<Snapshot> {
    return this.#t.json({ op: "getSnapshot", params: { id }, ...opts });
  }
  list(params: { projectId?: string } & PageParams = {}, opts: CallOptions = {}): Promise<Page<Snapshot>> {
    return this.#t.json({ op: "listSnapshots", query: { projectId: params.projectId, ...pageQuery(params) }, ...opts });
  }
  iterate(params: { projectId?: string } & PageParams = {}, opts: CallOptions = {}): AsyncGenerator<Snapshot> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  /** `null` when gone (204); the snapshot (`deleting`) while the backend works (202). */
  async delete(id: string, opts: CallOptions = {}): Promise<Snapshot | null> {
    const s = await this.#t.json<Snapshot | undefined>({ op: "deleteSnapshot", params: { id }, ...opts });
    return s ?? null;
  }
  /** Polls until the snapshot is `status` (default `ready`); WaitError on `failed` or the deadline. */
  async wait(id: string, o: { status?: SnapshotStatus; timeoutMs?: number; intervalMs?: number } & CallOptions = {}): Promise<Snapshot> {
    const want = o.status ?? "ready";
    const deadline = Date.now() + (o.timeoutMs ?? 120_000);
    for (;;) {
      const s = await this.get(id, o.signal ? { signal: o.signal } : {});
      if (s.status === want) return s;
      if (s.status === "failed") throw new WaitError(`snapshot ${id} failed: ${s.statusReason ?? "no reason"}`, s);
      if (Date.now() >= deadline) throw new WaitError(`snapshot ${id} is still ${s.status} at the deadline`, s);
      await new Promise((r) => setTimeout(r, o.intervalMs ?? 250));
    }
  }
}

export class Placements {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  /** Why the sandbox is where it is (or why it waits). */
  explain(sandboxId: string, opts: CallOptions = {}): Promise<Placement> {
    return this.#t.json({ op: "getPlacement", params: { id: sandboxId }, ...opts });
  }
  /** What a create with this body would do now, creating nothing. */
  dryRun(req: CreateSandboxRequest = {}, opts: CallOptions = {}): Promise<DryRun> {
    return this.#t.json({ op: "dryRunPlacement", json: req, ...opts });
  }
}

export class Events {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  /**
   * Events as SSE; reconnects and resumes with `Last-Event-ID` on its own. `format: "public"`
   * yields PublicEvents (narrow with `types`); the default yields StatusEvents.
   */
  stream(opts: PublicEventsOptions): EventStream<PublicEventMessage>;
  stream(opts?: StatusEventsOptions): EventStream<EventMessage>;
  /** A format only known at run time: messages of either kind. */
  stream(opts: EventsOptions & { format: "status" | "public" }): EventStream<EventMessage | PublicEventMessage>;
  stream(opts: EventsOptions = {}): EventStream<EventMessage> | EventStream<PublicEventMessage> | EventStream<EventMessage | PublicEventMessage> {
    return opts.format === "public" ? new EventStream<PublicEventMessage>(this.#t, opts) : new EventStream<EventMessage>(this.#t, opts);
  }

  /** The JSON Schema (draft 2020-12) of the envelope and of every public event type. */
  listSchemas(opts: CallOptions = {}): Promise<EventSchemaList> {
    return this.#t.json({ op: "listEventSchemas", ...opts });
  }

  /** One type's JSON Schema; NotFoundError/InvalidArgumentError for a type the server does not know. */
  getSchema(type: PublicEventType | (string & {}), opts: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.#t.json({ op: "getEventSchema", params: { type }, ...opts });
  }

  /**
   * NATS credentials for the org's public subjects (201; `token` shown once). Needs a NATS
   * server with Differently's auth callout: otherwise, and always under `differently dev`,
   * UnsupportedOperationError (501 `unsupported_operation`); read `stream()` instead.
   * Never retried (each call makes a credential).
   */
  createCredentials(req: EventCredentialsRequest = {}, opts: CallOptions = {}): Promise<EventCredentials> {
    return this.#t.json({ op: "createEventCredentials", json: req, ...opts });
  }

  /** Revokes a credential (204): new connections are refused at once. 501 as `createCredentials`. */
  async revokeCredentials(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "revokeEventCredentials", params: { id }, ...opts });
  }
}

/** `GET /v1/webhooks` filters. */
export interface ListWebhooksParams extends PageParams {
  projectId?: string;
}

/**
 * A project's webhooks: signed POSTs of its public events (`docs/webhooks.md`). The signing
 * secret is in the answer of `create` and `rotateSecret` only; keep it there.
 */
export class Webhooks {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }

  /**
   * 201 with `secret` (`whsec_<base64>`), shown only this once. ValidationError (422) naming
   * `url` for a URL the operator's rules refuse, `eventTypes` for a filter matching no type;
   * ConflictError (409) when the server has no secrets key. Never retried (a replay is a 409).
   */
  create(req: CreateWebhookRequest, opts: CallOptions = {}): Promise<WebhookWithSecret> {
    return this.#t.json({ op: "createWebhook", json: req, ...opts });
  }

  get(id: string, opts: CallOptions = {}): Promise<Webhook> {
    return this.#t.json({ op: "getWebhook", params: { id }, ...opts });
  }

  list(params: ListWebhooksParams = {}, opts: CallOptions = {}): Promise<Page<Webhook>> {
    return this.#t.json({ op: "listWebhooks", query: { projectId: params.projectId, ...pageQuery(params) }, ...opts });
  }

  iterate(params: ListWebhooksParams = {}, opts: CallOptions = {}): AsyncGenerator<Webhook> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }

  /** Change `url`, `eventTypes`, `description`; `enabled: true` re-enables a disabled one. */
  update(id: string, patch: UpdateWebhookRequest, opts: CallOptions = {}): Promise<Webhook> {
    return this.#t.json({ op: "updateWebhook", params: { id }, json: patch, ...opts });
  }

  /** Deletes the webhook with its delivery log (204). */
  async delete(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "deleteWebhook", params: { id }, ...opts });
  }

  /**
   * A new signing secret (shown once). The replaced one keeps signing next to it until
   * `previousSecretExpiresAt`, so receivers can switch without missing a delivery.
   */
  rotateSecret(id: string, opts: CallOptions = {}): Promise<WebhookWithSecret> {
    return this.#t.json({ op: "rotateWebhookSecret", params: { id }, ...opts });
  }

  /** The delivery log, newest first, one page. */
  deliveries(id: string, params: PageParams = {}, opts: CallOptions = {}): Promise<Page<WebhookDelivery>> {
    return this.#t.json({ op: "listWebhookDeliveries", params: { id }, query: pageQuery(params), ...opts });
  }

  iterateDeliveries(id: string, params: PageParams = {}, opts: CallOptions = {}): AsyncGenerator<WebhookDelivery> {
    return paginate((cursor) => this.deliveries(id, { ...params, cursor }, opts), params.cursor);
  }

  /** 202: the delivery, pending and due now; it is sent with the same `webhook-id`. */
  redeliver(id: string, deliveryId: string, opts: CallOptions = {}): Promise<WebhookDelivery> {
    return this.#t.json({ op: "redeliverWebhook", params: { id, deliveryId }, ...opts });
  }
}

export class Orgs {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  create(req: CreateOrgRequest, opts: CallOptions = {}): Promise<Org> {
    return this.#t.json({ op: "createOrg", json: req, ...opts });
  }
  get(id: string, opts: CallOptions = {}): Promise<Org> {
    return this.#t.json({ op: "getOrg", params: { id }, ...opts });
  }
  list(params: PageParams = {}, opts: CallOptions = {}): Promise<Page<Org>> {
    return this.#t.json({ op: "listOrgs", query: pageQuery(params), ...opts });
  }
  iterate(params: PageParams = {}, opts: CallOptions = {}): AsyncGenerator<Org> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  /** Rename, or `status: "suspended"` / `"active"`. */
  update(id: string, patch: UpdateOrgRequest, opts: CallOptions = {}): Promise<Org> {
    return this.#t.json({ op: "updateOrg", params: { id }, json: patch, ...opts });
  }
  async delete(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "deleteOrg", params: { id }, ...opts });
  }
}

export class Projects {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  create(req: CreateProjectRequest, opts: CallOptions = {}): Promise<Project> {
    return this.#t.json({ op: "createProject", json: req, ...opts });
  }
  get(id: string, opts: CallOptions = {}): Promise<Project> {
    return this.#t.json({ op: "getProject", params: { id }, ...opts });
  }
  list(params: { orgId?: string } & PageParams = {}, opts: CallOptions = {}): Promise<Page<Project>> {
    return this.#t.json({ op: "listProjects", query: { orgId: params.orgId, ...pageQuery(params) }, ...opts });
  }
  iterate(params: { orgId?: string } & PageParams = {}, opts: CallOptions = {}): AsyncGenerator<Project> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  update(id: string, patch: UpdateProjectRequest, opts: CallOptions = {}): Promise<Project> {
    return this.#t.json({ op: "updateProject", params: { id }, json: patch, ...opts });
  }
  /** 409 while it has live sandboxes or any snapshot. */
  async delete(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "deleteProject", params: { id }, ...opts });
  }
}

export class Keys {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  /** 201 with `key`, the secret, shown only this once. Never retried (a replay is a 409). */
  create(req: CreateKeyRequest, opts: CallOptions = {}): Promise<CreatedKey> {
    return this.#t.json({ op: "createKey", json: req, ...opts });
  }
  get(id: string, opts: CallOptions = {}): Promise<Key> {
    return this.#t.json({ op: "getKey", params: { id }, ...opts });
  }
  list(params: { orgId?: string } & PageParams = {}, opts: CallOptions = {}): Promise<Page<Key>> {
    return this.#t.json({ op: "listKeys", query: { orgId: params.orgId, ...pageQuery(params) }, ...opts });
  }
  iterate(params: { orgId?: string } & PageParams = {}, opts: CallOptions = {}): AsyncGenerator<Key> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  revoke(id: string, opts: CallOptions = {}): Promise<Key> {
    return this.#t.json({ op: "revokeKey", params: { id }, ...opts });
  }
}

export class Quotas {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  getOrg(orgId: string, opts: CallOptions = {}): Promise<QuotaView> {
    return this.#t.json({ op: "getOrgQuota", params: { id: orgId }, ...opts });
  }
  putOrg(orgId: string, quota: Quota, opts: CallOptions = {}): Promise<QuotaView> {
    return this.#t.json({ op: "putOrgQuota", params: { id: orgId }, json: quota, ...opts });
  }
  getProject(projectId: string, opts: CallOptions = {}): Promise<QuotaView> {
    return this.#t.json({ op: "getProjectQuota", params: { id: projectId }, ...opts });
  }
  putProject(projectId: string, quota: Quota, opts: CallOptions = {}): Promise<QuotaView> {
    return this.#t.json({ op: "putProjectQuota", params: { id: projectId }, json: quota, ...opts });
  }
}

export class Policies {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  getGlobal(opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "getGlobalPolicy", ...opts });
  }
  putGlobal(policy: Policy, opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "putGlobalPolicy", json: policy, ...opts });
  }
  getOrg(orgId: string, opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "getOrgPolicy", params: { id: orgId }, ...opts });
  }
  putOrg(orgId: string, policy: Policy, opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "putOrgPolicy", params: { id: orgId }, json: policy, ...opts });
  }
  getProject(projectId: string, opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "getProjectPolicy", params: { id: projectId }, ...opts });
  }
  putProject(projectId: string, policy: Policy, opts: CallOptions = {}): Promise<Policy> {
    return this.#t.json({ op: "putProjectPolicy", params: { id: projectId }, json: policy, ...opts });
  }
}

export class Pools {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  list(params: PageParams = {}, opts: CallOptions = {}): Promise<Page<Pool>> {
    return this.#t.json({ op: "listPools", query: pageQuery(params), ...opts });
  }
  iterate(params: PageParams = {}, opts: CallOptions = {}): AsyncGenerator<Pool> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  get(name: string, opts: CallOptions = {}): Promise<Pool> {
    return this.#t.json({ op: "getPool", params: { name }, ...opts });
  }
  create(req: PoolRequest, opts: CallOptions = {}): Promise<PoolRecord> {
    return this.#t.json({ op: "createPool", json: req, ...opts });
  }
  update(name: string, req: PoolRequest, opts: CallOptions = {}): Promise<PoolRecord> {
    return this.#t.json({ op: "updatePool", params: { name }, json: req, ...opts });
  }
  async delete(name: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.request({ op: "deletePool", params: { name }, ...opts });
  }
  /** The pool's warm classes, each with its `ready` and `creating` instances. */
  getWarm(name: string, opts: CallOptions = {}): Promise<WarmClasses> {
    return this.#t.json({ op: "getWarmClasses", params: { name }, ...opts });
  }
  /** Replaces the pool's warm classes (`[]` removes them all); answers as `getWarm`. */
  setWarm(name: string, classes: WarmClass[], opts: CallOptions = {}): Promise<WarmClasses> {
    const body: WarmClassesRequest = { classes };
    return this.#t.json({ op: "putWarmClasses", params: { name }, json: body, ...opts });
  }
}

export class Secrets {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  list(opts: CallOptions = {}): Promise<Page<Secret>> {
    return this.#t.json({ op: "listSecrets", ...opts });
  }
  /** Stores a backend credential; the answer carries its fingerprint, never the value. */
  put(name: string, value: string, opts: CallOptions = {}): Promise<Secret> {
    return this.#t.json({ op: "putSecret", params: { name }, json: { value }, ...opts });
  }
}

export class Audit {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  /** Tenant-scoped records, one page. */
  list(params: ListAuditParams = {}, opts: CallOptions = {}): Promise<Page<AuditEvent>> {
    const { limit, cursor, ...filters } = params;
    return this.#t.json({ op: "listAudit", query: { ...filters, limit, cursor }, ...opts });
  }
  iterate(params: ListAuditParams = {}, opts: CallOptions = {}): AsyncGenerator<AuditEvent> {
    return paginate((cursor) => this.list({ ...params, cursor }, opts), params.cursor);
  }
  /** Verifies every chain (admin). */
  verify(opts: CallOptions = {}): Promise<Verification> {
    return this.#t.json({ op: "verifyAudit", ...opts });
  }
  /** The whole log as JSON lines (admin), parsed one object per line as it streams. */
  async *export(opts: CallOptions = {}): AsyncGenerator<Record<string, unknown>> {
    const a = await this.#t.request({ op: "exportAudit", stream: true, ...opts });
    const body = a.response.body;
    if (!body) return;
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (value) buf += value;
        let nl: number;
        while ((nl = buf.indexOf("\n")) !== -1) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) yield JSON.parse(line) as Record<string, unknown>;
        }
        if (done) break;
      }
      if (buf.trim()) yield JSON.parse(buf) as Record<string, unknown>;
    } finally {
      reader.releaseLock();
    }
  }
  /** A signed checkpoint of every chain head (201), or `null` (204: nothing new). */
  async checkpoint(opts: CallOptions = {}): Promise<Checkpoint | null> {
    return (await this.#t.json<Checkpoint | undefined>({ op: "checkpointAudit", ...opts })) ?? null;
  }
  /** Starts a new segment (e.g. after a key rotation), with the reason recorded. */
  segment(reason: string, opts: CallOptions = {}): Promise<AuditSegment> {
    return this.#t.json({ op: "segmentAudit", json: { reason }, ...opts });
  }
}

export class Admin {
  #t: Transport;
  /** @internal */
  constructor(t: Transport) {
    this.#t = t;
  }
  /** Per pool and per org: where work may go, under which policy, with which credentials. */
  trustReport(opts: CallOptions = {}): Promise<TrustReport> {
    return this.#t.json({ op: "trustReport", ...opts });
  }
  /** This API process's admission, activation and queue-depth counters as JSON. */
  metricsSummary(opts: CallOptions = {}): Promise<MetricsSummary> {
    return this.#t.json({ op: "metricsSummary", ...opts });
  }
  /** The fair queue per organization (deepest first), with what each waits behind. */
  queue(opts: CallOptions = {}): Promise<QueueReport> {
    return this.#t.json({ op: "adminQueue", ...opts });
  }
}

export interface EnvLike {
  [name: string]: string | undefined;
}

/** The client. `new Differently({baseUrl, apiKey})`, or `Differently.fromEnv()`. */
export class Differently {
  readonly #t: Transport;
  readonly sandboxes: Sandboxes;
  readonly files: Files;
  /** Processes that outlive a connection (docs/processes.md). */
  readonly processes: Processes;
  readonly snapshots: Snapshots;
  readonly placement: Placements;
  readonly events: Events;
  readonly orgs: Orgs;
  readonly projects: Projects;
  readonly keys: Keys;
  readonly quotas: Quotas;
  readonly policies: Policies;
  readonly pools: Pools;
  readonly secrets: Secrets;
  readonly audit: Audit;
  readonly admin: Admin;
  readonly webhooks: Webhooks;

  constructor(opts: ClientOptions) {
    this.#t = new Transport(opts);
    this.sandboxes = new Sandboxes(this.#t);
    this.files = new Files(this.#t);
    this.processes = new Processes(this.#t);
    this.snapshots = new Snapshots(this.#t);
    this.placement = new Placements(this.#t);
    this.events = new Events(this.#t);
    this.orgs = new Orgs(this.#t);
    this.projects = new Projects(this.#t);
    this.keys = new Keys(this.#t);
    this.quotas = new Quotas(this.#t);
    this.policies = new Policies(this.#t);
    this.pools = new Pools(this.#t);
    this.secrets = new Secrets(this.#t);
    this.audit = new Audit(this.#t);
    this.admin = new Admin(this.#t);
    this.webhooks = new Webhooks(this.#t);
  }

  /**
   * From `DIFFERENTLY_URL` and `DIFFERENTLY_API_KEY` (what `differently dev` prints). Pass
   * `env` in a browser or elsewhere without `process`; in Node it defaults to `process.env`.
   */
  static fromEnv(env?: EnvLike, extra: Omit<ClientOptions, "baseUrl" | "apiKey"> = {}): Differently {
    const e: EnvLike = env ?? (globalThis as { process?: { env?: EnvLike } }).process?.env ?? {};
    const baseUrl = e["DIFFERENTLY_URL"];
    if (!baseUrl) throw new TypeError("DIFFERENTLY_URL is not set (differently dev prints it)");
    const apiKey = e["DIFFERENTLY_API_KEY"];
    return new Differently({ ...extra, baseUrl, ...(apiKey ? { apiKey } : {}) });
  }

  get baseUrl(): string {
    return this.#t.baseUrl;
  }

  health(opts: CallOptions = {}): Promise<Health> {
    return this.#t.json({ op: "health", ...opts });
  }
  ready(opts: CallOptions = {}): Promise<Health> {
    return this.#t.json({ op: "ready", ...opts });
  }
  /** The served OpenAPI 3.1 document. */
  openapi(opts: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.#t.json({ op: "openapi", ...opts });
  }

  toJSON(): Record<string, unknown> {
    return { baseUrl: this.#t.baseUrl, apiKey: this.#t.hasApiKey ? "[redacted]" : undefined };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Differently { baseUrl: '${this.#t.baseUrl}', apiKey: ${this.#t.hasApiKey ? "[redacted]" : "none"} }`;
  }
}
