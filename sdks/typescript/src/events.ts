/**
 * `GET /v1/events` (SSE, `id:` the stream sequence) as an async iterator that reconnects on its
 * own after a lost connection and resumes with `Last-Event-ID`, so no event is missed or
 * repeated while the server still holds it (24 h). Two formats read the same stream: `status`
 * (the default, `event: status` with the flat StatusEvent) and `public` (`event:` the type,
 * `data:` the versioned PublicEvent of docs/events.md); their ids are the same sequences.
 */
import { ApiError, ConnectionError, DifferentlyError } from "./errors.js";
import type { Transport } from "./http.js";
import type { PublicEvent, StatusEvent } from "./models.js";
import { parseSse } from "./sse.js";

export interface EventsOptions {
  /** `status` (default; status changes only, the body SDKs read before public events) or `public`. */
  format?: "status" | "public";
  /**
   * With `format: "public"` only: exact types or prefixes ending in `.*`
   * (`["sandbox.exec.*", "snapshot.*"]`); a name that matches no type is a 400 naming `types`.
   */
  types?: readonly string[];
  projectId?: string;
  sandboxId?: string;
  /** Resume after this sequence (what `lastEventId` held). Without it, only new events. */
  after?: number | string;
  /** Reconnect after a lost connection (default true). */
  reconnect?: boolean;
  /** Consecutive failed reconnects before giving up (default 8). */
  maxReconnectAttempts?: number;
  /** First reconnect delay in ms (default 250, doubling to 5 s; the server's `retry:` wins). */
  reconnectDelayMs?: number;
  signal?: AbortSignal;
}

/** `events.stream({format: "public", …})`: the options with the format fixed. */
export type PublicEventsOptions = Omit<EventsOptions, "format"> & { format: "public" };
/** `events.stream({…})` in the status format, which takes no `types` (the compiler says so). */
export type StatusEventsOptions = Omit<EventsOptions, "format" | "types"> & { format?: "status"; types?: never };

export interface EventMessage {
  /** The stream sequence (`id:`), to resume after. */
  id: number;
  /** `status` (the only kind the `status` format serves). */
  type: string;
  data: StatusEvent;
}

/** A message of the `public` format: `type` is the event's type, `data` the whole envelope. */
export interface PublicEventMessage {
  /** The stream sequence (`id:`), to resume after; not the event's own `data.id`. */
  id: number;
  type: string;
  data: PublicEvent;
}

/** An events subscription; iterate it once. `lastEventId` is where a new one would resume. */
export class EventStream<M extends EventMessage | PublicEventMessage = EventMessage> implements AsyncIterable<M> {
  #transport: Transport;
  #opts: EventsOptions;
  #abort = new AbortController();
  #used = false;
  /** The last sequence received (or the `after` given), as the server's `Last-Event-ID`. */
  lastEventId: string | undefined;
  /** How many times the stream reconnected. */
  reconnects = 0;

  /** @internal */
  constructor(transport: Transport, opts: EventsOptions) {
    if (opts.types !== undefined && opts.format !== "public") {
      throw new TypeError('events: `types` filters the public format only; pass format: "public"');
    }
    if (opts.types !== undefined && (opts.types.length === 0 || opts.types.some((t) => !t || t.includes(",")))) {
      throw new TypeError("events: `types` needs at least one type, each non-empty and without a comma");
    }
    this.#transport = transport;
    this.#opts = opts;
    this.lastEventId = opts.after === undefined ? undefined : String(opts.after);
    if (opts.signal) {
      const s = opts.signal;
      if (s.aborted) this.#abort.abort(s.reason);
      else s.addEventListener("abort", () => this.#abort.abort(s.reason), { once: true });
    }
  }

  /** Ends the subscription (an iteration in progress finishes without error). */
  close(): void {
    this.#abort.abort(new DifferentlyError("event stream closed"));
  }

  [Symbol.asyncIterator](): AsyncIterator<M> {
    if (this.#used) throw new DifferentlyError("an EventStream can be iterated only once");
    this.#used = true;
    return this.#run();
  }

  async *#run(): AsyncGenerator<M> {
    const reconnect = this.#opts.reconnect ?? true;
    const maxFails = this.#opts.maxReconnectAttempts ?? 8;
    let delay = this.#opts.reconnectDelayMs ?? 250;
    let serverRetry: number | undefined;
    let fails = 0;
    let first = true;
    const signal = this.#abort.signal;
    try {
      for (;;) {
        if (signal.aborted) return;
        if (!first) {
          this.reconnects++;
          await new Promise<void>((resolve) => {
            const t = setTimeout(resolve, serverRetry ?? delay);
            signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
          });
          if (signal.aborted) return;
          delay = Math.min(5_000, delay * 2);
        }
        first = false;
        let body: ReadableStream<Uint8Array> | null;
        try {
          const headers: Record<string, string> = { accept: "text/event-stream" };
          if (this.lastEventId !== undefined) headers["last-event-id"] = this.lastEventId;
          const a = await this.#transport.request({
            op: "events",
            query: {
              projectId: this.#opts.projectId,
              sandboxId: this.#opts.sandboxId,
              format: this.#opts.format,
              types: this.#opts.types?.join(","),
            },
            headers,
            stream: true,
            signal,
          });
          body = a.response.body;
        } catch (err) {
          if (signal.aborted) return;
          if (err instanceof ApiError && err.status !== 503 && err.status !== 502 && err.status !== 504) throw err;
          if (!reconnect || ++fails > maxFails) throw err;
          continue;
        }
        if (!body) throw new DifferentlyError("events: the answer has no body");
        const state = { id: this.lastEventId };
        try {
          for await (const m of parseSse(body, state)) {
            fails = 0;
            delay = this.#opts.reconnectDelayMs ?? 250;
            if (m.retry !== undefined) serverRetry = m.retry;
            this.lastEventId = state.id;
            const id = Number(m.id);
            yield { id, type: m.event, data: JSON.parse(m.data) } as M;
          }
        } catch (err) {
          if (signal.aborted) return;
          if (!reconnect) throw new ConnectionError("event stream lost", this.#transport.baseUrl, err);
          continue; // a broken connection: resume after lastEventId
        }
        if (signal.aborted) return;
        if (!reconnect) return;
        // The server ended the stream (e.g. a restart): resume as after a break.
      }
    } finally {
      this.#abort.abort();
    }
  }
}
