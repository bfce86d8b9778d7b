/**
 * The admin summaries the dashboard reads (`admin.queue`, `admin.metricsSummary`) against a real
 * `differently dev`: a sandbox held back by an org quota shows in the queue with its wall and
 * reason, admissions and activations count up, and a key without `admin` is refused.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Differently, PermissionDeniedError, type Org } from "@differently/sdk";
import { conforms } from "./conforms.js";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
let c: Differently;
let doc: Record<string, any>;
let org: Org;

before(async () => {
  dev = await startDev();
  c = dev.client();
  doc = await c.openapi();
  org = (await c.orgs.list()).items.find((o) => o.name === "default")!;
  assert.ok(org, "differently dev has a default org");
});
after(async () => {
  await dev?.stop();
});

const sum = (m: Record<string, number>) => Object.values(m).reduce((a, b) => a + b, 0);

describe("admin summaries", () => {
  it("queue and metricsSummary report a sandbox waiting behind its org's quota", async () => {
    const empty = await c.admin.queue();
    conforms(doc, "QueueReport", empty);
    assert.equal(empty.total, 0);
    assert.deepEqual(empty.orgs, []);
    const m0 = await c.admin.metricsSummary();
    conforms(doc, "MetricsSummary", m0);
    assert.equal(m0.enabled, true, "differently dev keeps metrics");

    await c.quotas.putOrg(org.id, { maxActive: 1 });
    const first = await runningSandbox(c);
    const second = await c.sandboxes.create({});
    try {
      assert.equal((await c.sandboxes.get(second.id)).status, "queued");
      const q = await c.admin.queue();
      conforms(doc, "QueueReport", q);
      assert.equal(q.total, 1);
      assert.equal(q.truncated, false);
      assert.equal(q.orgs.length, 1);
      const o = q.orgs[0]!;
      conforms(doc, "QueueOrg", o);
      for (const r of o.reasons) conforms(doc, "QueueReason", r);
      assert.equal(o.orgId, org.id);
      assert.equal(o.orgName, "default");
      assert.equal(o.depth, 1);
      assert.equal(o.oldestSandboxId, second.id);
      assert.ok(Date.parse(o.oldestQueuedAt) <= Date.now());
      assert.deepEqual(o.walls, { org: 1 });
      assert.equal(o.reasons.length, 1);
      assert.match(o.reasons[0]!.reason, /org active quota 1\/1/);
      assert.equal(o.reasons[0]!.count, 1);

      const m1 = await c.admin.metricsSummary();
      conforms(doc, "MetricsSummary", m1);
      assert.ok(sum(m1.admissions) >= sum(m0.admissions) + 2, `two admissions counted: ${JSON.stringify([m0.admissions, m1.admissions])}`);
      assert.ok(sum(m1.activations) >= sum(m0.activations) + 1, `one activation counted: ${JSON.stringify([m0.activations, m1.activations])}`);
      assert.ok((m1.activations[first.pool!] ?? 0) >= 1, `activations by pool: ${JSON.stringify(m1.activations)}`);
      assert.equal(m1.queueDepth[org.id], 1, `queue depth by org: ${JSON.stringify(m1.queueDepth)}`);
    } finally {
      await c.quotas.putOrg(org.id, { maxActive: null });
      await c.sandboxes.delete(first.id);
    }
    await c.sandboxes.wait(second.id, { timeoutMs: 30_000 });
    assert.equal((await c.admin.queue()).total, 0, "the queue drains once the quota allows it");
    await c.sandboxes.delete(second.id);
  });

  it("a key without `admin` is refused (403)", async () => {
    const key = await c.keys.create({ orgId: org.id, name: "reader", scopes: ["sandboxes:read"] });
    const reader = new Differently({ baseUrl: dev.url, apiKey: key.key });
    await assert.rejects(reader.admin.queue(), PermissionDeniedError);
    await assert.rejects(reader.admin.metricsSummary(), PermissionDeniedError);
  });
});
