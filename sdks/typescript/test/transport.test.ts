/**
 * The transport's own behaviour, against small loopback HTTP servers the test controls:
 * retries only where safe, Retry-After honoured, one Idempotency-Key across retries, errors
 * that say what to do, and the SSE and frame decoders on awkward chunkings.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { inspect } from "node:util";
import { describe, it } from "node:test";
import {
  ConnectionError,
  Differently,
  parseFrames,
  parseSse,
  RateLimitError,
  TimeoutError,
  UnavailableError,
} from "@differently/sdk";

const KEY = "dly_key_01TESTKEY0000000000000000_supersecretvalue";

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  at: number;
}

/** A loopback server answering with `answer(n)` for the n-th request (0-based). */
async function serve(answer: (n: number, req: IncomingMessage, res: ServerResponse) => void) {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    seen.push({ method: req.method!, url: req.url!, headers: req.headers, at: Date.now() });
    req.resume();
    req.on("end", () => answer(seen.length - 1, req, res));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, seen, close: () => new Promise<void>((r) => server.close(() => r())) };
}

function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  res.writeHead(status, { "content-type": "application/json", "x-request-id": "req-1", ...headers });
  res.end(JSON.stringify(body));
}

const SANDBOX = { id: "sbx_1", status: "queued" };
const envelope = (code: string, message: string, details: object = {}) => ({ error: { code, message, details, requestId: "req-body" } });

describe("retries", () => {
  it("GET retries a 503 after Retry-After, then succeeds", async () => {
    const s = await serve((n, _q, res) =>
      n === 0 ? json(res, 503, envelope("provider_unavailable", "db down"), { "retry-after": "1" }) : json(res, 200, SANDBOX),
    );
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      const got = await c.sandboxes.get("sbx_1");
      assert.equal(got.id, "sbx_1");
      assert.equal(s.seen.length, 2);
      // At least the full second by the wall clock: a timer alone can fire early under load.
      assert.ok(s.seen[1]!.at - s.seen[0]!.at >= 1000, "waited for Retry-After: 1");
      assert.equal(s.seen[0]!.headers["authorization"], `Bearer ${KEY}`);
    } finally {
      await s.close();
    }
  });

  it("a create POST is retried with the same Idempotency-Key", async () => {
    const s = await serve((n, _q, res) =>
      n === 0 ? json(res, 429, envelope("rate_limited", "slow down"), { "retry-after": "0" }) : json(res, 202, SANDBOX),
    );
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      await c.sandboxes.create({});
      assert.equal(s.seen.length, 2);
      const k0 = s.seen[0]!.headers["idempotency-key"];
      assert.ok(typeof k0 === "string" && k0.length >= 16);
      assert.equal(s.seen[1]!.headers["idempotency-key"], k0);
    } finally {
      await s.close();
    }
  });

  it("exec (a POST without an Idempotency-Key) is never retried", async () => {
    const s = await serve((_n, _q, res) => json(res, 503, envelope("provider_unavailable", "backend down"), { "retry-after": "0" }));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      await assert.rejects(c.sandboxes.exec("sbx_1", ["true"]), (e: unknown) => {
        assert.ok(e instanceof UnavailableError);
        assert.equal(e.code, "provider_unavailable");
        assert.equal(e.retryAfterSeconds, 0);
        return true;
      });
      assert.equal(s.seen.length, 1);
      assert.equal(s.seen[0]!.headers["idempotency-key"], undefined);
    } finally {
      await s.close();
    }
  });

  it("creates that show a secret once (keys, webhooks) and event credentials are never retried", async () => {
    const s = await serve((_n, _q, res) => json(res, 503, envelope("provider_unavailable", "db down"), { "retry-after": "0" }));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      await assert.rejects(c.keys.create({ name: "k", scopes: ["admin"] }), UnavailableError);
      await assert.rejects(c.webhooks.create({ url: "https://hooks.example.com/x" }), UnavailableError);
      await assert.rejects(c.events.createCredentials({}), UnavailableError);
      assert.deepEqual(s.seen.map((x) => `${x.method} ${x.url}`), ["POST /v1/keys", "POST /v1/webhooks", "POST /v1/events/credentials"]);
      assert.ok(s.seen[0]!.headers["idempotency-key"], "keys still send an Idempotency-Key");
      assert.ok(s.seen[1]!.headers["idempotency-key"], "webhooks still send an Idempotency-Key");
      // The webhook list, a GET, is retried as usual.
      await assert.rejects(c.webhooks.list(), UnavailableError);
      assert.equal(s.seen.length, 3 + 3, "a GET: the first try and maxRetries (2) more");
    } finally {
      await s.close();
    }
  });

  it("quota_exceeded (429 that waiting cannot fix) is not retried; gives up after maxRetries", async () => {
    const s = await serve((_n, _q, res) => json(res, 429, envelope("quota_exceeded", "over quota")));
    const s2 = await serve((_n, _q, res) => json(res, 429, envelope("rate_limited", "slow"), { "retry-after": "0" }));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      await assert.rejects(c.sandboxes.list(), RateLimitError);
      assert.equal(s.seen.length, 1);
      const c2 = new Differently({ baseUrl: s2.url, apiKey: KEY, maxRetries: 3 });
      await assert.rejects(c2.sandboxes.list(), (e: unknown) => e instanceof RateLimitError && e.code === "rate_limited");
      assert.equal(s2.seen.length, 4);
    } finally {
      await s.close();
      await s2.close();
    }
  });

  it("a Retry-After longer than maxRetryAfterMs is not waited for", async () => {
    const s = await serve((_n, _q, res) => json(res, 503, envelope("provider_unavailable", "later"), { "retry-after": "120" }));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY, maxRetryAfterMs: 1000 });
      const t0 = Date.now();
      await assert.rejects(c.sandboxes.get("sbx_1"), (e: unknown) => e instanceof UnavailableError && e.retryAfterSeconds === 120);
      assert.ok(Date.now() - t0 < 1000);
      assert.equal(s.seen.length, 1);
    } finally {
      await s.close();
    }
  });
});

describe("errors", () => {
  it("carry status, code, message, field and request id; never the key", async () => {
    const s = await serve((_n, _q, res) => json(res, 422, envelope("validation_failed", "resources.cpu: must be between 1 and 256", { field: "resources.cpu" })));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY });
      const e = await c.sandboxes.create({ resources: { cpu: 0 } }).catch((x: unknown) => x);
      assert.ok(e instanceof RateLimitError === false);
      const err = e as import("@differently/sdk").ApiError;
      assert.equal(err.status, 422);
      assert.equal(err.code, "validation_failed");
      assert.equal(err.field, "resources.cpu");
      assert.equal(err.requestId, "req-body");
      assert.equal(err.serverMessage, "resources.cpu: must be between 1 and 256");
      assert.match(err.message, /POST \/v1\/sandboxes: 422 validation_failed/);
      for (const shown of [err.message, err.stack ?? "", inspect(err, { depth: 10, showHidden: true }), JSON.stringify(err)]) {
        assert.ok(!shown.includes("supersecretvalue"), shown);
      }
    } finally {
      await s.close();
    }
  });

  it("a non-JSON error body still gives a status and the header's request id", async () => {
    const s = await serve((_n, _q, res) => {
      res.writeHead(502, { "content-type": "text/plain", "x-request-id": "hdr-7" });
      res.end("bad gateway");
    });
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY, maxRetries: 0 });
      await assert.rejects(c.sandboxes.get("sbx_1"), (e: any) => e.status === 502 && e.code === "http_502" && e.requestId === "hdr-7" && e.serverMessage === "bad gateway");
    } finally {
      await s.close();
    }
  });

  it("connection refused says what to do", async () => {
    const s = await serve(() => undefined);
    const url = s.url;
    await s.close(); // nothing listens there now
    const c = new Differently({ baseUrl: url, apiKey: KEY, maxRetries: 1 });
    await assert.rejects(c.sandboxes.list(), (e: unknown) => {
      assert.ok(e instanceof ConnectionError);
      assert.equal(e.message, `connection refused at ${url} — is \`differently dev\` running? (check the URL or DIFFERENTLY_URL)`);
      assert.ok(!inspect(e, { depth: 10 }).includes("supersecretvalue"));
      return true;
    });
  });

  it("a slow answer is a TimeoutError", async () => {
    const s = await serve((_n, _q, res) => setTimeout(() => json(res, 200, SANDBOX), 1500));
    try {
      const c = new Differently({ baseUrl: s.url, apiKey: KEY, timeoutMs: 200, maxRetries: 0 });
      await assert.rejects(c.sandboxes.get("sbx_1"), TimeoutError);
    } finally {
      await s.close();
    }
  });

  it("refuses a key passed as a header, and a non-http URL", () => {
    assert.throws(() => new Differently({ baseUrl: "http://127.0.0.1:1", headers: { Authorization: `Bearer ${KEY}` } }), TypeError);
    assert.throws(() => new Differently({ baseUrl: "ftp://x" }), TypeError);
    assert.throws(() => Differently.fromEnv({}), /DIFFERENTLY_URL/);
    const c = Differently.fromEnv({ DIFFERENTLY_URL: "http://127.0.0.1:9/", DIFFERENTLY_API_KEY: KEY });
    assert.equal(c.baseUrl, "http://127.0.0.1:9");
    assert.ok(!inspect(c).includes("supersecretvalue") && !JSON.stringify(c).includes("supersecretvalue"));
  });
});

/** A ReadableStream of the given chunks. */
function chunks(parts: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(ctl) {
      for (const p of parts) ctl.enqueue(p);
      ctl.close();
    },
  });
}
const te = new TextEncoder();

/** Splits bytes every `n` bytes. */
function every(bytes: Uint8Array, n: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let i = 0; i < bytes.length; i += n) out.push(bytes.slice(i, i + n));
  return out;
}

describe("decoders", () => {
  it("SSE: comments, multi-line data, ids, CRLF and CR line ends, any chunking", async () => {
    const text =
      ": ping\r\n\r\nid: 7\r\nevent: status\r\ndata: {\"a\":1}\r\n\r\n" +
      "event: stdout\ndata: line one\ndata: line two\n\n" +
      "data:no-space\rretry: 1500\r\r" +
      "event: exit\ndata: {\"exitCode\":3,\"durationMs\":1}\n\n" +
      "data: unterminated";
    for (const n of [1, 2, 3, 7, 1000]) {
      const got = [];
      for await (const m of parseSse(chunks(every(te.encode(text), n)))) got.push(m);
      assert.deepEqual(
        got.map((m) => [m.event, m.data, m.id, m.retry]),
        [
          ["status", '{"a":1}', "7", undefined],
          ["stdout", "line one\nline two", "7", undefined],
          ["message", "no-space", "7", 1500],
          ["exit", '{"exitCode":3,"durationMs":1}', "7", undefined],
        ],
        `chunked every ${n} bytes`,
      );
    }
  });

  it("SSE: a UTF-8 character split across chunks", async () => {
    const bytes = te.encode("data: é€😀\n\n");
    for (const n of [1, 2, 3]) {
      const got = [];
      for await (const m of parseSse(chunks(every(bytes, n)))) got.push(m.data);
      assert.deepEqual(got, ["é€😀"]);
    }
  });

  it("frames: split at every byte, many per chunk, heartbeat, exact payloads", async () => {
    const frame = (type: number, payload: Uint8Array) => {
      const f = new Uint8Array(8 + payload.length);
      f[0] = type;
      new DataView(f.buffer).setUint32(4, payload.length);
      f.set(payload, 8);
      return f;
    };
    const big = new Uint8Array(70_000).map((_, i) => (i * 7) % 256);
    const all = [frame(1, te.encode("out")), frame(0, new Uint8Array(0)), frame(2, new Uint8Array([0, 255])), frame(1, big), frame(3, te.encode('{"exitCode":0,"durationMs":5}'))];
    const bytes = new Uint8Array(all.reduce((n, f) => n + f.length, 0));
    let o = 0;
    for (const f of all) {
      bytes.set(f, o);
      o += f.length;
    }
    // (1-byte reads of the 70 kB frame would only measure web streams' per-read cost.)
    for (const n of [7, 9, 13, 4096, bytes.length]) {
      const got = [];
      for await (const f of parseFrames(chunks(every(bytes, n)))) got.push({ type: f.type, payload: Array.from(f.payload) });
      assert.equal(got.length, 5, `every ${n}`);
      assert.deepEqual(got.map((f) => f.type), [1, 0, 2, 1, 3]);
      assert.deepEqual(got[2]!.payload, [0, 255]);
      assert.deepEqual(got[3]!.payload, Array.from(big));
    }
    const small = bytes.slice(0, all[0]!.length + all[1]!.length + all[2]!.length);
    const one = [];
    for await (const f of parseFrames(chunks(every(small, 1)))) one.push([f.type, Array.from(f.payload)]);
    assert.deepEqual(one, [[1, Array.from(te.encode("out"))], [0, []], [2, [0, 255]]]);
    // A body cut inside a frame is an error, not a silent end.
    await assert.rejects(async () => {
      for await (const _ of parseFrames(chunks([bytes.slice(0, 12)]))) void _;
    }, /ended inside a frame/);
  });
});
