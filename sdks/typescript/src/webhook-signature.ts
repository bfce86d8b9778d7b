/**
 * Checking a webhook request on the receiving side: the Standard Webhooks signature
 * (`webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, the key the
 * base64 after `whsec_`) and the timestamp's age, with WebCrypto so it runs in Node >= 20,
 * browsers, and edge runtimes alike (no Node-only API in the SDK's core).
 */
import { DifferentlyError } from "./errors.js";
import type { PublicEvent } from "./models.js";

/** Why a webhook request was refused; `reason` is stable, the message says more. */
export class WebhookVerificationError extends DifferentlyError {
  readonly reason: "missing_headers" | "bad_secret" | "stale_timestamp" | "no_matching_signature" | "not_json";
  constructor(reason: WebhookVerificationError["reason"], message: string) {
    super(`webhook refused: ${message}`);
    this.reason = reason;
  }
}

export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export interface VerifyWebhookOptions {
  /** Refuse a `webhook-timestamp` further than this from now (default 300 s, as the spec says). */
  toleranceSeconds?: number;
  /** The clock, in ms (tests). */
  now?: () => number;
}

function header(h: WebhookHeaders, name: string): string | undefined {
  if (typeof (h as Headers).get === "function") return (h as Headers).get(name) ?? undefined;
  const rec = h as Record<string, string | string[] | undefined>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name);
  const v = key === undefined ? undefined : rec[key];
  return Array.isArray(v) ? v.join(" ") : v;
}

function base64ToBytes(b64: string): Uint8Array<ArrayBuffer> | undefined {
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) return undefined;
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function bytesToBase64(b: Uint8Array): string {
  let s = "";
  for (const x of b) s += String.fromCharCode(x);
  return btoa(s);
}

/** Compares without an early exit, so the time taken says nothing about where they differ. */
function sameText(a: string, b: string): boolean {
  let diff = a.length ^ b.length;
  for (let i = 0; i < Math.max(a.length, b.length); i++) diff |= (a.charCodeAt(i) | 0) ^ (b.charCodeAt(i) | 0);
  return diff === 0;
}

/** `v1,<base64>` for `id.timestamp.body` under a `whsec_…` secret. */
export async function signWebhook(secret: string, id: string, timestamp: string, body: string | Uint8Array): Promise<string> {
  if (!secret.startsWith("whsec_")) throw new WebhookVerificationError("bad_secret", "the secret is not a whsec_ secret");
  const key = base64ToBytes(secret.slice("whsec_".length));
  if (!key || key.length === 0) throw new WebhookVerificationError("bad_secret", "the secret's key is not base64");
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) throw new TypeError("no WebCrypto (globalThis.crypto.subtle) available");
  const k = await subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const enc = new TextEncoder();
  const head = enc.encode(`${id}.${timestamp}.`);
  const tail = typeof body === "string" ? enc.encode(body) : body;
  const msg = new Uint8Array(head.length + tail.length);
  msg.set(head, 0);
  msg.set(tail, head.length);
  return `v1,${bytesToBase64(new Uint8Array(await subtle.sign("HMAC", k, msg)))}`;
}

/**
 * Verifies a webhook request and returns its public event. `body` must be the raw body as
 * received (re-serialised JSON does not verify). `secret` may be several (while you roll one
 * out): any of them signing is enough. Throws WebhookVerificationError otherwise; answer such
 * a request with a 4xx and do not act on it. De-duplicate on `webhook-id` (the event's `id`):
 * a redelivery or a retry after a lost answer carries the same one.
 */
export async function verifyWebhook(
  secret: string | readonly string[],
  headers: WebhookHeaders,
  body: string | Uint8Array,
  opts: VerifyWebhookOptions = {},
): Promise<PublicEvent> {
  const id = header(headers, "webhook-id");
  const ts = header(headers, "webhook-timestamp");
  const sigs = header(headers, "webhook-signature");
  if (!id || !ts || !sigs) throw new WebhookVerificationError("missing_headers", "webhook-id, webhook-timestamp and webhook-signature are required");
  const now = (opts.now ?? Date.now)() / 1000;
  const tolerance = opts.toleranceSeconds ?? 300;
  if (!/^\d+$/.test(ts) || Math.abs(now - Number(ts)) > tolerance) {
    throw new WebhookVerificationError("stale_timestamp", `webhook-timestamp ${ts} is more than ${tolerance} s from now`);
  }
  const offered = sigs.split(" ").filter(Boolean);
  let ok = false;
  for (const s of typeof secret === "string" ? [secret] : secret) {
    const want = await signWebhook(s, id, ts, body);
    for (const got of offered) if (sameText(got, want)) ok = true;
  }
  if (!ok) throw new WebhookVerificationError("no_matching_signature", "no signature matches the secret(s) given");
  try {
    return JSON.parse(typeof body === "string" ? body : new TextDecoder().decode(body)) as PublicEvent;
  } catch (err) {
    throw new WebhookVerificationError("not_json", `the body is not JSON (${(err as Error).message})`);
  }
}
