/**
 * Public events (docs/events.md) through the SDK against a real `differently dev`: the
 * `format: "public"` stream with and without `types`, its ids agreeing with the status format,
 * resuming; the event schemas (and the SDK's typed `data` held to them); and event credentials,
 * which `differently dev` cannot issue (no NATS auth callout): 501 `unsupported_operation`.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  EVENT_DATA,
  InvalidArgumentError,
  NotFoundError,
  PUBLIC_EVENT_TYPES,
  SANDBOX_STATUSES,
  UnsupportedOperationError,
  isKnownEventType,
  type Differently,
  type EventMessage,
  type Project,
  type PublicEventMessage,
} from "@differently/sdk";
import { conforms, conformsToFields } from "./conforms.js";
import { readUntil, startDev, type DevServer } from "./fixture.js";

type Json = Record<string, any>;

let dev: DevServer;
let c: Differently;
let doc: Json;
let project: Project;

before(async () => {
  dev = await startDev();
  c = dev.client();
  doc = await c.openapi();
  project = (await c.projects.list()).items.find((p) => p.name === "default")!;
  assert.ok(project, "differently dev has a default project");
});
after(async () => {
  await dev?.stop();
});

/** A public event's envelope and `data` as served and as the SDK types them. */
function checkPublic(m: PublicEventMessage, schemas: Map<string, Json>): void {
  conforms(doc, "PublicEvent", m.data);
  assert.equal(m.type, m.data.type, "the SSE event: is the event's type");
  assert.ok(isKnownEventType(m.data.type), `a type this SDK knows: ${m.data.type}`);
  const schema = schemas.get(m.data.type)!;
  conformsToFields(`${m.data.type} data`, EVENT_DATA[m.data.type], schema["properties"].data.required ?? [], m.data.data);
}

/** The served JSON Schema of each type, by type. */
async function schemasByType(): Promise<Map<string, Json>> {
  return new Map((await c.events.listSchemas()).items.map((i) => [i.type, i.schema as Json]));
}

describe("public events", () => {
  it("format public yields typed PublicEvents with the status format's ids, and `after` resumes", async () => {
    const schemas = await schemasByType();
    const pub = c.events.stream({ format: "public", projectId: project.id, after: 0 });
    const status = c.events.stream({ projectId: project.id, after: 0 });
    const pi = pub[Symbol.asyncIterator]();
    const si = status[Symbol.asyncIterator]();
    const s = await c.sandboxes.create({ projectId: project.id });
    const isRunning = (m: PublicEventMessage) =>
      m.data.type === "sandbox.status.changed" && m.data.sandboxId === s.id && m.data.data.status === "running";
    const events = await readUntil(pi, isRunning);
    for (const m of events) checkPublic(m, schemas);
    for (let i = 1; i < events.length; i++) assert.ok(events[i]!.id > events[i - 1]!.id, "ids increase");
    const mine = events.filter((m) => m.data.sandboxId === s.id);
    assert.ok(mine.every((m) => m.data.projectId === project.id && m.data.orgId === s.orgId));
    const changes = mine.filter((m) => m.data.type === "sandbox.status.changed");
    // Not necessarily provisioning first: a sandbox's earlier change can be stored after its
    // `running` (two publishers; docs/events.md "Ordering"), and then it arrives later.
    assert.ok(changes.length >= 1);
    assert.equal(new Set(mine.map((m) => m.data.id)).size, mine.length, "event ids are unique");
    assert.equal(pub.lastEventId, String(events.at(-1)!.id));

    // The status format reads the same stream: the same sequences for the same changes.
    const flat = await readUntil(si, (m: EventMessage) => m.data.sandboxId === s.id && m.data.status === "running");
    const flatIds = flat.filter((m) => m.data.sandboxId === s.id).map((m) => [m.id, m.data.status, m.data.statusVersion]);
    const pubIds = changes.map((m) => {
      assert.ok(m.data.type === "sandbox.status.changed");
      return [m.id, m.data.data.status, m.data.data.statusVersion];
    });
    assert.deepEqual(pubIds, flatIds);
    status.close();
    await si.return?.();

    // Resume after the first event: exactly the later ones, up to a pause made now (so there
    // is a later one even when `running` was the first stored).
    await c.sandboxes.pause(s.id);
    const isPaused = (m: PublicEventMessage) =>
      m.data.type === "sandbox.status.changed" && m.data.sandboxId === s.id && m.data.data.status === "paused";
    const all = [...events, ...(await readUntil(pi, isPaused))];
    pub.close();
    await pi.return?.();
    const again = c.events.stream({ format: "public", projectId: project.id, after: all[0]!.id });
    const ai = again[Symbol.asyncIterator]();
    const replay = await readUntil(ai, (m) => m.id === all.at(-1)!.id);
    assert.deepEqual(replay.map((m) => [m.id, m.data.id]), all.slice(1).map((m) => [m.id, m.data.id]));
    again.close();
    await ai.return?.();
    await c.sandboxes.delete(s.id);
  });

  it("`types` narrows the stream to those types and prefixes", async () => {
    const schemas = await schemasByType();
    const ops = c.events.stream({ format: "public", types: ["sandbox.operation.*"], after: 0 });
    const oi = ops[Symbol.asyncIterator]();
    const exact = c.events.stream({ format: "public", types: ["sandbox.status.changed"], sandboxId: undefined, after: 0 });
    const ei = exact[Symbol.asyncIterator]();
    const s = await c.sandboxes.create({ projectId: project.id });
    await c.sandboxes.wait(s.id, { timeoutMs: 30_000 });
    await c.sandboxes.pause(s.id);
    // Both, in either order: the API publishes `requested`, the worker `finished`, each right
    // after its own commit, so the stream may hold them the other way round.
    const seen = new Set<string>();
    const got = await readUntil(oi, (m) => {
      if (m.data.sandboxId === s.id) seen.add(m.data.type);
      return seen.has("sandbox.operation.requested") && seen.has("sandbox.operation.finished");
    });
    for (const m of got) {
      checkPublic(m, schemas);
      assert.match(m.data.type, /^sandbox\.operation\./, "only operation events");
    }
    const requested = got.find((m) => m.data.type === "sandbox.operation.requested" && m.data.sandboxId === s.id);
    assert.ok(requested, "the pause was requested");
    assert.ok(requested.data.type === "sandbox.operation.requested");
    assert.equal(requested.data.data.operation, "pause");
    assert.equal(requested.data.cause, "user");
    assert.match(requested.data.actor?.keyId ?? "", /^key_/);
    const finished = got.find((m) => m.data.type === "sandbox.operation.finished" && m.data.sandboxId === s.id)!;
    assert.ok(finished.data.type === "sandbox.operation.finished");
    assert.equal(finished.data.data.operationId, requested.data.data.operationId);
    assert.equal(finished.data.data.error, null);

    const changes = await readUntil(ei, (m) => m.data.sandboxId === s.id && m.data.type === "sandbox.status.changed" && m.data.data.status === "paused");
    for (const m of changes) assert.equal(m.data.type, "sandbox.status.changed", "only status changes");
    ops.close();
    exact.close();
    await oi.return?.();
    await ei.return?.();
    await c.sandboxes.delete(s.id);
  });

  it("a filter matching no type is an InvalidArgumentError naming `types`; `types` needs the public format", async () => {
    const bad = c.events.stream({ format: "public", types: ["sandbox.teleported"] });
    await assert.rejects(bad[Symbol.asyncIterator]().next(), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.field, "types");
      return true;
    });
    // Would be silently ignored by the status format: the SDK refuses it before sending.
    assert.throws(() => c.events.stream({ types: ["sandbox.status.changed"] } as never), TypeError);
    assert.throws(() => c.events.stream({ format: "public", types: [] }), TypeError);
    assert.throws(() => c.events.stream({ format: "public", types: ["a,b"] }), TypeError);
  });

  it("listSchemas and getSchema: every type, and the SDK's typed data matches each schema", async () => {
    const list = await c.events.listSchemas();
    conforms(doc, "EventSchemaList", list);
    assert.equal(list.version, 1);
    assert.deepEqual(list.items.map((i) => i.type).sort(), [...PUBLIC_EVENT_TYPES].sort(), "the SDK knows every served type");
    const served = new Map(list.items.map((i) => [i.type, i.schema as Json]));
    const problems: string[] = [];
    for (const type of PUBLIC_EVENT_TYPES) {
      const data: Json = served.get(type)!["properties"].data;
      const props: Json = data.properties ?? {};
      const sdk = EVENT_DATA[type];
      for (const f of Object.keys(props)) if (!(f in sdk)) problems.push(`${type}: served data.${f}, not in the SDK type`);
      for (const [f, spec] of Object.entries(sdk)) {
        const p = props[f];
        if (!p) {
          problems.push(`${type}: SDK data.${f} not served`);
          continue;
        }
        const types = new Set([p.type ?? []].flat());
        const nullable = spec.endsWith("?");
        if (p.type !== undefined && nullable !== types.has("null")) problems.push(`${type}: data.${f} nullable? SDK ${nullable}, served ${[...types]}`);
        const base = nullable ? spec.slice(0, -1) : spec;
        if (p.type !== undefined && !types.has(base)) problems.push(`${type}: data.${f} SDK ${base}, served ${[...types]}`);
      }
    }
    assert.deepEqual(problems, []);
    const statusEnum: string[] = served.get("sandbox.status.changed")!["properties"].data.properties.status.enum;
    assert.deepEqual([...statusEnum].sort(), [...SANDBOX_STATUSES].sort());

    const one = await c.events.getSchema("sandbox.exec.finished");
    assert.deepEqual(one, served.get("sandbox.exec.finished"));
    assert.equal(one["title"], "sandbox.exec.finished");
    await assert.rejects(c.events.getSchema("sandbox.teleported"), NotFoundError);
  });

  it("event credentials: differently dev has no NATS auth callout, so 501 unsupported_operation", async () => {
    const is501 = (e: unknown) => {
      assert.ok(e instanceof UnsupportedOperationError, String(e));
      assert.equal(e.status, 501);
      assert.equal(e.code, "unsupported_operation");
      assert.match(e.serverMessage, /auth callout/);
      assert.ok(!e.message.includes(dev.apiKey), "the key is never in an error");
      return true;
    };
    await assert.rejects(c.events.createCredentials({ ttlSeconds: 600 }), is501);
    await assert.rejects(c.events.createCredentials(), is501);
    await assert.rejects(c.events.revokeCredentials("evc_01M8SSW22CEQXZNR0PWW4VRGBM"), is501);
  });
});
