/** Orgs, projects, keys, quotas, policies, pools, secrets, audit, trust report; tenant isolation. */
import assert from "node:assert/strict";
import { inspect } from "node:util";
import { after, before, describe, it } from "node:test";
import {
  AuthenticationError,
  ConflictError,
  Differently,
  NotFoundError,
  PermissionDeniedError,
  RateLimitError,
  ValidationError,
  type Org,
  type Project,
} from "@differently/sdk";
import { runningSandbox, startDev, type DevServer } from "./fixture.js";

let dev: DevServer;
let admin: Differently;
let org2: Org;
let prj2: Project;
let tenant2: Differently;
let tenant2Key: string;

before(async () => {
  dev = await startDev();
  admin = dev.client();
  org2 = await admin.orgs.create({ name: "second tenant" });
  prj2 = await admin.projects.create({ orgId: org2.id, name: "p2" });
  const k = await admin.keys.create({
    orgId: org2.id,
    projectId: prj2.id,
    name: "tenant2",
    scopes: ["sandboxes:read", "sandboxes:write", "sandboxes:exec", "files:read", "files:write"],
  });
  tenant2Key = k.key;
  tenant2 = new Differently({ baseUrl: dev.url, apiKey: k.key });
});
after(async () => {
  await dev?.stop();
});

describe("orgs and projects", () => {
  it("create, get, list, iterate, update", async () => {
    assert.match(org2.id, /^org_/);
    assert.equal(org2.status, "active");
    assert.deepEqual(await admin.orgs.get(org2.id), org2);
    const ids: string[] = [];
    for await (const o of admin.orgs.iterate({ limit: 1 })) ids.push(o.id);
    assert.ok(ids.includes(org2.id) && ids.length >= 2);
    const renamed = await admin.orgs.update(org2.id, { name: "second tenant, renamed" });
    assert.equal(renamed.name, "second tenant, renamed");

    assert.equal(prj2.orgId, org2.id);
    assert.deepEqual((await admin.projects.list({ orgId: org2.id })).items.map((p) => p.id), [prj2.id]);
    const p = await admin.projects.update(prj2.id, { name: "p2 renamed" });
    assert.equal(p.name, "p2 renamed");
    const extra = await admin.projects.create({ orgId: org2.id, name: "to delete" });
    await admin.projects.delete(extra.id);
    await assert.rejects(admin.projects.get(extra.id), NotFoundError);
    await assert.rejects(admin.orgs.create({ name: "" }), (e: unknown) => e instanceof ValidationError && e.field === "name");
    const gone = await admin.orgs.create({ name: "to delete" });
    await admin.orgs.delete(gone.id);
    await assert.rejects(admin.orgs.get(gone.id), NotFoundError);
  });

  it("a suspended org may read but not write (403), and comes back", async () => {
    const o = await admin.orgs.create({ name: "to suspend" });
    const k = await admin.keys.create({ orgId: o.id, name: "k", scopes: ["sandboxes:read", "sandboxes:write"] });
    const t = new Differently({ baseUrl: dev.url, apiKey: k.key });
    assert.equal((await admin.orgs.update(o.id, { status: "suspended" })).status, "suspended");
    await t.sandboxes.list();
    await assert.rejects(t.sandboxes.create({}), (e: unknown) => e instanceof PermissionDeniedError && e.status === 403);
    await admin.orgs.update(o.id, { status: "active" });
    const p = await t.projects.create({ orgId: o.id, name: "own" }).catch(() => admin.projects.create({ orgId: o.id, name: "own" }));
    const s = await t.sandboxes.create({ projectId: p.id });
    await t.sandboxes.delete(s.id);
  });
});

describe("keys", () => {
  it("create shows the secret once; get/list never do; revoke → 401", async () => {
    const k = await admin.keys.create({ orgId: org2.id, name: "short-lived", scopes: ["sandboxes:read"] });
    assert.match(k.key, /^dly_/);
    const got = await admin.keys.get(k.id);
    assert.equal(got.id, k.id);
    assert.ok(!("key" in got));
    const listed = (await admin.keys.list({ orgId: org2.id })).items;
    assert.ok(listed.some((x) => x.id === k.id));
    assert.ok(!JSON.stringify(listed).includes(k.key.split("_").at(-1)!));
    const c = new Differently({ baseUrl: dev.url, apiKey: k.key });
    await c.sandboxes.list();
    await assert.rejects(c.sandboxes.create({}), PermissionDeniedError, "read-only key cannot create");
    const revoked = await admin.keys.revoke(k.id);
    assert.ok(revoked.revokedAt);
    await assert.rejects(c.sandboxes.list(), (e: unknown) => {
      assert.ok(e instanceof AuthenticationError);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthenticated");
      assert.ok(!e.message.includes(k.key) && !inspect(e).includes(k.key), "the key is never in an error");
      return true;
    });
  });
});

describe("two tenants", () => {
  it("neither sees the other's sandboxes (404, not in lists)", async () => {
    const mine = await runningSandbox(admin);
    const theirs = await runningSandbox(tenant2);
    assert.equal(theirs.orgId, org2.id);
    assert.equal(theirs.projectId, prj2.id);
    await assert.rejects(tenant2.sandboxes.get(mine.id), NotFoundError);
    await assert.rejects(tenant2.sandboxes.exec(mine.id, ["true"]), NotFoundError);
    await assert.rejects(tenant2.files.download(mine.id, "/x"), NotFoundError);
    await assert.rejects(admin.sandboxes.get(theirs.id), NotFoundError, "not even the admin key sees another org's sandbox");
    const seen: string[] = [];
    for await (const s of tenant2.sandboxes.iterate()) seen.push(s.id);
    assert.deepEqual(seen, [theirs.id]);
    assert.equal((await tenant2.sandboxes.exec(theirs.id, ["echo", "ok"])).stdout, "ok\n");
    await assert.rejects(tenant2.orgs.create({ name: "nope" }), PermissionDeniedError);
    await tenant2.sandboxes.delete(theirs.id);
    await admin.sandboxes.delete(mine.id);
  });
});

describe("quotas and policies", () => {
  it("org and project quotas: put, get with usage, and enforcement", async () => {
    const q = await admin.quotas.putOrg(org2.id, { maxActive: 5, maxCpu: 2, maxMemoryMiB: 8192, maxDiskGiB: 100, maxQueued: 10, maxQueueSeconds: 600, maxSandbox: { cpu: 2, memoryMiB: 4096, diskGiB: 20 } });
    assert.equal(q.quota.maxCpu, 2);
    assert.equal(q.quota.maxSandbox?.cpu, 2);
    const v = await admin.quotas.getOrg(org2.id);
    assert.equal(v.quota.maxActive, 5);
    assert.equal(typeof v.usage["active"], "number");
    await assert.rejects(tenant2.sandboxes.create({ resources: { cpu: 4 } }), (e: unknown) => {
      assert.ok(e instanceof RateLimitError);
      assert.equal(e.code, "quota_exceeded");
      assert.match(e.message, /resources\.cpu/);
      return true;
    });
    const pq = await admin.quotas.putProject(prj2.id, { maxActive: 3 });
    assert.equal(pq.quota.maxActive, 3);
    assert.equal((await tenant2.quotas.getProject(prj2.id)).quota.maxActive, 3, "an org key reads its quota");
    await assert.rejects(admin.quotas.putOrg(org2.id, { maxCpu: 2_000_000 }), (e: unknown) => e instanceof ValidationError && e.field === "maxCpu");
  });

  it("global, org and project policies round trip", async () => {
    const g = await admin.policies.getGlobal();
    assert.equal(typeof g, "object");
    const o = await admin.policies.putOrg(org2.id, { allowedClassifications: ["internal", "public"], defaultStrategy: "cheapest" });
    assert.deepEqual(o.allowedClassifications, ["internal", "public"]);
    assert.equal((await admin.policies.getOrg(org2.id)).defaultStrategy, "cheapest");
    const p = await admin.policies.putProject(prj2.id, { deniedPools: ["nope"] });
    assert.deepEqual(p.deniedPools, ["nope"]);
    assert.deepEqual((await admin.policies.getProject(prj2.id)).deniedPools, ["nope"]);
    const g2 = await admin.policies.putGlobal({ ...g, allowedRegions: null });
    assert.equal(g2.allowedRegions ?? null, null);
    await assert.rejects(admin.policies.putOrg(org2.id, { deniedPools: ["Bad Name"] } as never), (e: unknown) => e instanceof ValidationError || e instanceof Error);
  });
});

describe("operators", () => {
  it("pools: list, get, create, update, delete", async () => {
    const pools = await admin.pools.list();
    const local = pools.items.find((p) => p.name === "local");
    assert.ok(local && local.kind === "devhost" && local.healthy);
    const got = await admin.pools.get("local");
    assert.ok(got.capabilities.includes("exec.stream"));
    const made = await admin.pools.create({ name: "sdk-extra", kind: "fake" });
    assert.equal(made.source, "api");
    const upd = await admin.pools.update("sdk-extra", { maxConcurrent: 3 });
    assert.equal(upd.maxConcurrent, 3);
    await admin.pools.delete("sdk-extra");
    await assert.rejects(admin.pools.get("sdk-extra"), NotFoundError);
  });

  it("pools: warm classes put, read back with counts, refused when invalid", async () => {
    const put = await admin.pools.setWarm("local", [
      { name: "default", size: 0, refillPerSecond: 1 },
      { name: "py", size: 0, maxSize: 2, refillPerSecond: 0.5, template: "python:3.12", resources: { cpu: 2, memoryMiB: 2048, diskGiB: 5 } },
    ]);
    try {
      assert.deepEqual(put.classes.map((x) => x.name), ["default", "py"]);
      const [d, py] = put.classes;
      assert.equal(d!.maxAgeSeconds, 3600);
      assert.equal(d!.template ?? null, null);
      assert.equal(d!.ready, 0);
      assert.equal(d!.creating, 0);
      assert.equal(py!.maxSize, 2);
      assert.equal(py!.resources?.memoryMiB, 2048);
      assert.deepEqual(await admin.pools.getWarm("local"), put);
      await assert.rejects(
        admin.pools.setWarm("local", [{ name: "a", size: 1, refillPerSecond: 0 }]),
        (e: unknown) => e instanceof ValidationError && e.field === "classes[0].refillPerSecond",
      );
      await assert.rejects(admin.pools.getWarm("no-such-pool"), NotFoundError);
    } finally {
      const cleared = await admin.pools.setWarm("local", []);
      assert.deepEqual(cleared.classes, []);
    }
  });

  it("secrets: stored by name, value never returned", async () => {
    const s = await admin.secrets.put("sdk-secret", "very-secret-value");
    assert.equal(s.name, "sdk-secret");
    const all = await admin.secrets.list();
    assert.ok(all.items.some((x) => x.name === "sdk-secret"));
    assert.ok(!JSON.stringify(all).includes("very-secret-value") && !JSON.stringify(s).includes("very-secret-value"));
  });

  it("audit: list with a filter, iterate pages, verify, export, checkpoint", async () => {
    const s = await runningSandbox(admin);
    await admin.sandboxes.exec(s.id, ["true"]);
    const execs = await admin.audit.list({ action: "sandbox.exec", resource: s.id });
    assert.equal(execs.items.length, 1);
    assert.equal(execs.items[0]!.action, "sandbox.exec");
    let n = 0;
    const seqs = new Set<number>();
    for await (const r of admin.audit.iterate({ limit: 3 })) {
      n++;
      seqs.add(r.seq);
    }
    assert.ok(n > 3 && seqs.size === n, "several pages, no record twice");
    const v = await admin.audit.verify();
    assert.equal(v.ok, true);
    assert.ok(v.records > 0);
    const cp = await admin.audit.checkpoint();
    assert.ok(cp === null || typeof cp === "object");
    let exported = 0;
    let sawExec = false;
    for await (const line of admin.audit.export()) {
      exported++;
      if (line["action"] === "sandbox.exec" && line["resource"] === s.id) sawExec = true;
    }
    assert.ok(exported >= n && sawExec);
    await assert.rejects(admin.audit.segment("no lost key"), ConflictError);
    await assert.rejects(tenant2.audit.verify(), PermissionDeniedError);
    await admin.sandboxes.delete(s.id);
  });

  it("trust report", async () => {
    const t = await admin.admin.trustReport();
    assert.ok(t.generatedAt && t.installationId);
    assert.ok(t.pools.some((p) => p["name"] === "local"));
  });

  it("health, ready, openapi", async () => {
    assert.equal((await admin.health()).status, "ok");
    assert.equal((await admin.ready()).status, "ready");
    const doc = await admin.openapi();
    assert.equal(doc["openapi"], "3.1.0");
  });
});

describe("the key stays secret", () => {
  it("not in inspect, JSON or errors", async () => {
    for (const shown of [inspect(admin), JSON.stringify(admin), inspect(admin, { showHidden: true, depth: 5 }), String(admin)]) {
      assert.ok(!shown.includes(dev.apiKey), `key leaked in ${shown}`);
      assert.ok(!shown.includes(tenant2Key));
    }
    assert.match(inspect(admin), /redacted/);
    const err = await admin.sandboxes.get("sbx_00000000000000000000000000").catch((e: unknown) => e);
    assert.ok(err instanceof NotFoundError);
    assert.ok(!inspect(err, { depth: 10, showHidden: true }).includes(dev.apiKey));
  });
});
