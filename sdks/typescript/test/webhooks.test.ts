/**
 * Webhooks against a real `differently dev`: the whole resource (create, get, list, iterate,
 * update, rotate-secret, deliveries, redeliver, delete), real deliveries to a receiver on
 * 127.0.0.1 whose Standard Webhooks signatures are verified with node:crypto, and the 422s of
 * URLs the operator's rules refuse.
 *
 * Two servers: `open` allows a loopback receiver the way an operator would
 * (`DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE`, `DIFFERENTLY_WEBHOOKS_ALLOW_HTTP`, docs/configuration.md);
 * `strict` runs with a server's defaults, which refuse it (dev's own loopback allowance
 * turned off with `DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK=false`).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  Differently,
  NotFoundError,
  ValidationError,
  WebhookVerificationError,
  signWebhook,
  verifyWebhook,
  type Project,
  type PublicEvent,
  type WebhookDelivery,
  type WebhookWithSecret,
} from "@differently/sdk";
import { conforms } from "./conforms.js";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";
import { sign, startReceiver, verifiedBy, type Receiver, type Received } from "./receiver.js";

let open: DevServer;
let strict: DevServer;
let c: Differently;
let doc: Record<string, any>;
let project: Project;
let rcv: Receiver;
/** Every request the SDK sent to `open`, with its headers (to check the Idempotency-Key). */
const sent: { method: string; url: string; headers: Headers }[] = [];

before(async () => {
  [open, strict] = await Promise.all([
    startDev({ env: { DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE: "true", DIFFERENTLY_WEBHOOKS_ALLOW_HTTP: "true" } }),
    startDev({ env: { DIFFERENTLY_WEBHOOKS_ALLOW_LOOPBACK: "false" } }),
  ]);
  const recording: typeof fetch = (input, init) => {
    sent.push({ method: init?.method ?? "GET", url: String(input), headers: new Headers(init?.headers) });
    return fetch(input, init);
  };
  c = open.client({ fetch: recording });
  doc = await c.openapi();
  project = (await c.projects.list()).items.find((p) => p.name === "default")!;
  assert.ok(project, "differently dev has a default project");
  rcv = await startReceiver();
});
after(async () => {
  await rcv?.close();
  await Promise.all([open?.stop(), strict?.stop()]);
});

/** Polls the delivery log until `pred` holds for one delivery, within `ms`. */
async function waitDelivery(id: string, pred: (d: WebhookDelivery) => boolean, ms = 20_000): Promise<WebhookDelivery> {
  const deadline = Date.now() + ms;
  let last: WebhookDelivery[] = [];
  for (;;) {
    last = [];
    for await (const d of c.webhooks.iterateDeliveries(id, { limit: 2 })) last.push(d);
    const hit = last.find(pred);
    if (hit) return hit;
    if (Date.now() > deadline) {
      throw new Error(`no matching delivery within ${ms} ms: ${JSON.stringify(last.map((d) => [d.eventType, d.status, d.attempts, d.responseCode, d.lastError]))}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The receiver's request for a status change of `sandboxId` to `status`. */
function statusRequest(sandboxId: string, status: string) {
  return (r: Received) => {
    const e = JSON.parse(r.body) as PublicEvent;
    return e.type === "sandbox.status.changed" && e.sandboxId === sandboxId && e.data.status === status;
  };
}

describe("signWebhook", () => {
  it("computes the Standard Webhooks specification's example, as node:crypto does", async () => {
    const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const [id, ts, body] = ["msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", '{"test": 2432232314}'];
    const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    assert.equal(sign(secret, id, ts, body), want);
    assert.equal(await signWebhook(secret, id, ts, body), want);
    const headers = new Headers({ "webhook-id": id, "webhook-timestamp": ts, "webhook-signature": `v1,bm90IGl0 ${want}` });
    assert.deepEqual(await verifyWebhook(secret, headers, body, { now: () => 1614265330_000 }), { test: 2432232314 });
  });
});

describe("webhooks", () => {
  let hook: WebhookWithSecret;

  it("refused URLs are a ValidationError naming `url` (the defaults refuse a loopback receiver)", async () => {
    const sc = strict.client();
    for (const url of [`${rcv.url}/hook`, "https://127.0.0.1/hook", "https://localhost/hook", "https://10.1.2.3/hook"]) {
      await assert.rejects(sc.webhooks.create({ url }), (e: unknown) => {
        assert.ok(e instanceof ValidationError, `${url}: ${e}`);
        assert.equal(e.status, 422);
        assert.equal(e.code, "validation_failed");
        assert.equal(e.field, "url", `${url}: ${e.message}`);
        return true;
      });
    }
    assert.deepEqual((await sc.webhooks.list()).items, [], "nothing was stored");
    // Even where loopback is allowed, credentials in the URL are not; nor a filter matching no type.
    await assert.rejects(c.webhooks.create({ url: `http://user:pw@127.0.0.1:1/hook` }), (e: unknown) => e instanceof ValidationError && e.field === "url");
    await assert.rejects(c.webhooks.create({ url: `${rcv.url}/hook`, eventTypes: ["no.such.type"] }), (e: unknown) => e instanceof ValidationError && e.field === "eventTypes");
  });

  it("create shows the secret once; get, list and iterate never do", async () => {
    const before = sent.length;
    hook = await c.webhooks.create({ url: `${rcv.url}/hook`, eventTypes: ["sandbox.status.changed"], description: "sdk test" });
    conforms(doc, "WebhookWithSecret", hook);
    assert.match(hook.secret, /^whsec_[A-Za-z0-9+/]+=*$/);
    assert.equal(hook.projectId, project.id, "defaults to the key's project");
    assert.deepEqual(hook.eventTypes, ["sandbox.status.changed"]);
    assert.equal(hook.enabled, true);
    assert.equal(hook.previousSecretExpiresAt, null);
    const creates = sent.slice(before).filter((r) => r.method === "POST" && r.url.endsWith("/v1/webhooks"));
    assert.equal(creates.length, 1, "sent once");
    assert.ok(creates[0]!.headers.get("idempotency-key"), "with an Idempotency-Key");

    const got = await c.webhooks.get(hook.id);
    conforms(doc, "Webhook", got);
    assert.ok(!("secret" in got), "get never shows the secret");
    const { secret: _secret, ...withoutSecret } = hook;
    assert.deepEqual(got, withoutSecret);

    const second = await c.webhooks.create({ url: `${rcv.url}/other`, projectId: project.id });
    const page = await c.webhooks.list({ projectId: project.id, limit: 1 });
    assert.equal(page.items.length, 1);
    assert.ok(page.nextCursor, "two webhooks, pages of one");
    const all: string[] = [];
    for await (const w of c.webhooks.iterate({ limit: 1 })) {
      conforms(doc, "Webhook", w);
      assert.ok(!("secret" in w));
      all.push(w.id);
    }
    assert.deepEqual([...all].sort(), [hook.id, second.id].sort());
    await c.webhooks.delete(second.id);
    await assert.rejects(c.webhooks.get(second.id), NotFoundError);
    // Another organization's key sees nothing of it: the same 404 as a missing webhook.
    const org = await c.orgs.create({ name: `other-${Date.now()}` });
    const key = await c.keys.create({ orgId: org.id, name: "reader", scopes: ["sandboxes:read"] });
    const other = new Differently({ baseUrl: open.url, apiKey: key.key });
    await assert.rejects(other.webhooks.get(hook.id), NotFoundError);
    await assert.rejects(other.webhooks.deliveries(hook.id), NotFoundError);
    assert.deepEqual((await other.webhooks.list()).items, []);
  });

  it("delivers signed public events, logs the deliveries, and redelivers with the same webhook-id", async () => {
    const s = await runningSandbox(c);
    const r = await rcv.waitFor(statusRequest(s.id, "running"));
    assert.equal(r.headers["content-type"], "application/json");
    const event = JSON.parse(r.body) as PublicEvent;
    conforms(doc, "PublicEvent", event);
    assert.equal(r.headers["webhook-id"], event.id, "webhook-id is the event's id");
    const ts = Number(r.headers["webhook-timestamp"]);
    assert.ok(Math.abs(ts - Date.now() / 1000) < 300, `timestamp ${ts} within five minutes`);
    assert.deepEqual(verifiedBy(r, hook.secret), [0], `signed with the secret: ${r.headers["webhook-signature"]}`);
    // A wrong secret does not verify (the check can fail).
    assert.deepEqual(verifiedBy(r, `whsec_${Buffer.from("not the secret").toString("base64")}`), []);
    // The SDK's receiver-side check agrees, and refuses what it must.
    assert.deepEqual(await verifyWebhook(hook.secret, r.headers, r.body), event);
    assert.deepEqual(await verifyWebhook(hook.secret, r.headers, new TextEncoder().encode(r.body)), event);
    const refused = async (p: Promise<unknown>, reason: WebhookVerificationError["reason"]) =>
      assert.rejects(p, (e: unknown) => e instanceof WebhookVerificationError && e.reason === reason && !e.message.includes(hook.secret));
    await refused(verifyWebhook(`whsec_${Buffer.from("not the secret").toString("base64")}`, r.headers, r.body), "no_matching_signature");
    await refused(verifyWebhook(hook.secret, r.headers, r.body.replace(event.id, `${event.id}x`)), "no_matching_signature");
    await refused(verifyWebhook(hook.secret, r.headers, r.body, { now: () => Date.now() + 600_000 }), "stale_timestamp");
    await refused(verifyWebhook(hook.secret, { ...r.headers, "webhook-signature": undefined }, r.body), "missing_headers");
    await refused(verifyWebhook("not-a-secret", r.headers, r.body), "bad_secret");
    // The filter holds: only status changes came.
    for (const x of rcv.received) assert.equal(JSON.parse(x.body).type, "sandbox.status.changed");

    const d = await waitDelivery(hook.id, (d) => d.eventId === event.id && d.status === "succeeded");
    conforms(doc, "WebhookDelivery", d);
    assert.equal(d.webhookId, hook.id);
    assert.equal(d.eventType, "sandbox.status.changed");
    assert.equal(d.responseCode, 200);
    assert.equal(d.attempts, 1);
    assert.equal(d.responseBody, "ok");
    assert.ok(d.deliveredAt);

    const count = rcv.received.filter((x) => x.headers["webhook-id"] === event.id).length;
    const again = await c.webhooks.redeliver(hook.id, d.id);
    conforms(doc, "WebhookDelivery", again);
    assert.equal(again.id, d.id);
    assert.equal(again.status, "pending");
    await rcv.waitFor((x) => x.headers["webhook-id"] === event.id && rcv.received.filter((y) => y.headers["webhook-id"] === event.id).length > count);
    const redone = await waitDelivery(hook.id, (x) => x.id === d.id && x.status === "succeeded" && x.attempts >= 2);
    assert.equal(redone.eventId, event.id);
    await c.sandboxes.delete(s.id);
  });

  it("a failed attempt is logged and retried until the receiver takes it", async () => {
    const s = await c.sandboxes.create({});
    // Refuse the first attempt at this sandbox's `running`, take the rest.
    let refused = false;
    rcv.answer = (r) => {
      if (!refused && statusRequest(s.id, "running")(r)) {
        refused = true;
        return 500;
      }
      return 200;
    };
    try {
      const failed = await waitDelivery(hook.id, (d) => d.responseCode === 500);
      assert.equal(failed.status, "pending", "a 500 is retried");
      assert.ok(failed.lastError, "the failure is described");
      assert.ok(failed.nextAttemptAt, "and the next attempt scheduled");
      // The first back-off is 2.5–5 s (initial_backoff_ms 5000, jittered ½–1×).
      const ok = await waitDelivery(hook.id, (d) => d.id === failed.id && d.status === "succeeded", 30_000);
      assert.equal(ok.responseCode, 200);
      assert.ok(ok.attempts >= 2);
      const tries = rcv.received.filter((x) => x.headers["webhook-id"] === ok.eventId);
      assert.ok(tries.length >= 2, "the receiver saw the same webhook-id again");
    } finally {
      rcv.answer = () => 200;
      await c.sandboxes.delete(s.id);
    }
  });

  it("update changes the filter, the description and enabled", async () => {
    const u = await c.webhooks.update(hook.id, { eventTypes: ["sandbox.status.*", "sandbox.operation.*"], description: null });
    conforms(doc, "Webhook", u);
    assert.deepEqual(u.eventTypes, ["sandbox.status.*", "sandbox.operation.*"]);
    assert.equal(u.description, null);
    const off = await c.webhooks.update(hook.id, { enabled: false });
    assert.equal(off.enabled, false);
    const on = await c.webhooks.update(hook.id, { enabled: true });
    assert.equal(on.enabled, true);
    assert.equal(on.consecutiveFailures, 0);
    await assert.rejects(c.webhooks.update(hook.id, { url: "http://user:pw@127.0.0.1:1/hook" }), (e: unknown) => e instanceof ValidationError && e.field === "url");
    assert.equal((await c.webhooks.get(hook.id)).url, `${rcv.url}/hook`, "a refused update changes nothing");
  });

  it("rotate-secret: a new secret, and both sign during the overlap, new first", async () => {
    const rotated = await c.webhooks.rotateSecret(hook.id);
    conforms(doc, "WebhookWithSecret", rotated);
    assert.notEqual(rotated.secret, hook.secret);
    assert.match(rotated.secret, /^whsec_/);
    assert.ok(rotated.previousSecretExpiresAt && Date.parse(rotated.previousSecretExpiresAt) > Date.now());
    const s = await runningSandbox(c);
    const r = await rcv.waitFor(statusRequest(s.id, "running"));
    const sigs = String(r.headers["webhook-signature"]).split(" ");
    assert.equal(sigs.length, 2, `two signatures: ${r.headers["webhook-signature"]}`);
    assert.deepEqual(verifiedBy(r, rotated.secret), [0], "the new secret signs first");
    assert.deepEqual(verifiedBy(r, hook.secret), [1], "the old one still signs, second");
    const event = JSON.parse(r.body);
    assert.deepEqual(await verifyWebhook(rotated.secret, r.headers, r.body), event, "a receiver that has the new secret");
    assert.deepEqual(await verifyWebhook(hook.secret, r.headers, r.body), event, "a receiver that still has the old one");
    // The operation filter added above lets a pause request through.
    await c.sandboxes.pause(s.id);
    const op = await rcv.waitFor((x) => {
      const e = JSON.parse(x.body) as PublicEvent;
      return e.type === "sandbox.operation.requested" && e.sandboxId === s.id;
    });
    const e = JSON.parse(op.body) as PublicEvent;
    assert.ok(e.type === "sandbox.operation.requested");
    assert.equal(e.data.operation, "pause");
    assert.equal(e.cause, "user");
    assert.ok(e.actor?.keyId.startsWith("key_"), JSON.stringify(e.actor));
    hook = rotated;
    await c.sandboxes.delete(s.id);
  });

  it("delete removes the webhook and its log; nothing more is sent", async () => {
    await c.webhooks.delete(hook.id);
    await assert.rejects(c.webhooks.get(hook.id), NotFoundError);
    await assert.rejects(c.webhooks.deliveries(hook.id), NotFoundError);
    await assert.rejects(c.webhooks.delete(hook.id), NotFoundError);
    assert.deepEqual((await c.webhooks.list()).items, []);
    const s = await runningSandbox(c);
    await new Promise((r) => setTimeout(r, 1_000));
    assert.equal(rcv.received.filter((x) => statusRequest(s.id, "running")(x)).length, 0, "no delivery after delete");
    await c.sandboxes.delete(s.id);
  });
});
