/**
 * A webhook receiver on 127.0.0.1 for the tests: records every request (headers, raw body) and
 * answers what `answer` says (200 unless told otherwise), and verifies Standard Webhooks
 * signatures with node:crypto, independently of anything in the SDK.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";

export interface Received {
  headers: IncomingHttpHeaders;
  body: string;
  at: number;
}

export interface Receiver {
  url: string;
  received: Received[];
  /** The status to answer a request with (default 200). */
  answer: (r: Received) => number;
  /** Resolves with the first request (already received or later) that `pred` accepts, within `ms`. */
  waitFor(pred: (r: Received) => boolean, ms?: number): Promise<Received>;
  close(): Promise<void>;
}

export async function startReceiver(): Promise<Receiver> {
  const received: Received[] = [];
  const waiters: { pred: (r: Received) => boolean; ok: (r: Received) => void }[] = [];
  const rcv: Receiver = {
    url: "",
    received,
    answer: () => 200,
    waitFor(pred, ms = 20_000) {
      const hit = received.find(pred);
      if (hit) return Promise.resolve(hit);
      return new Promise((ok, fail) => {
        const w = { pred, ok: (r: Received) => (clearTimeout(t), ok(r)) };
        const t = setTimeout(() => {
          waiters.splice(waiters.indexOf(w), 1);
          const seen = received.map((r) => `${r.headers["webhook-id"]} ${JSON.parse(r.body).type}`);
          fail(new Error(`no matching webhook request within ${ms} ms; received ${JSON.stringify(seen)}`));
        }, ms);
        waiters.push(w);
      });
    },
    close: () => new Promise((ok) => server.close(() => ok())),
  };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const r: Received = { headers: req.headers, body: Buffer.concat(chunks).toString("utf8"), at: Date.now() };
      received.push(r);
      const status = rcv.answer(r);
      res.writeHead(status, { "content-type": "text/plain" }).end(status < 300 ? "ok" : "no");
      for (const w of [...waiters]) {
        if (w.pred(r)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.ok(r);
        }
      }
    });
  });
  server.keepAliveTimeout = 1_000;
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  rcv.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return rcv;
}

/** The `v1,<base64>` signature of `id.timestamp.body` under a `whsec_<base64>` secret. */
export function sign(secret: string, id: string, timestamp: string, body: string): string {
  if (!secret.startsWith("whsec_")) throw new Error("not a whsec_ secret");
  const key = Buffer.from(secret.slice("whsec_".length), "base64");
  return `v1,${createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest("base64")}`;
}

/** The signatures of `webhook-signature` that `secret` produced (constant-time compare), by position. */
export function verifiedBy(r: Received, secret: string): number[] {
  const id = String(r.headers["webhook-id"] ?? "");
  const ts = String(r.headers["webhook-timestamp"] ?? "");
  const want = Buffer.from(sign(secret, id, ts, r.body));
  const sigs = String(r.headers["webhook-signature"] ?? "").split(" ").filter(Boolean);
  const hits: number[] = [];
  sigs.forEach((s, i) => {
    const got = Buffer.from(s);
    if (got.length === want.length && timingSafeEqual(got, want)) hits.push(i);
  });
  return hits;
}
