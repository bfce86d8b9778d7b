/**
 * Compile-time checks of the event stream's types (this file failing `tsc` fails `npm test`):
 * `types` is refused without `format: "public"`, and a public event's `data` narrows by type.
 * The runtime part only proves the narrowing code runs on a real-shaped event.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Differently, type PublicEvent } from "@differently/sdk";

function compileOnly(c: Differently) {
  // @ts-expect-error `types` filters the public format only
  c.events.stream({ types: ["sandbox.status.changed"] });
  // @ts-expect-error not a format
  c.events.stream({ format: "json" });
  const status = c.events.stream({ after: 0 });
  const pub = c.events.stream({ format: "public", types: ["sandbox.exec.*"] });
  return { status, pub };
}

/** What a handler can read off each type without a cast. */
function describeEvent(e: PublicEvent): string {
  switch (e.type) {
    case "sandbox.status.changed":
      return `${e.data.status} v${e.data.statusVersion}`;
    case "sandbox.exec.finished":
      return `${e.data.program} → ${e.data.exitCode ?? "killed"}`;
    case "webhook.disabled":
      return `webhook ${e.data.webhookId}: ${e.data.reason}`;
    default:
      return e.type;
  }
}

describe("types", () => {
  it("public event data narrows by type", () => {
    assert.equal(typeof compileOnly, "function");
    const base = { version: 1 as const, id: "x", time: "2025-01-01T00:00:00Z", orgId: "org_1", projectId: "prj_1", cause: "user" as const, actor: null };
    assert.equal(describeEvent({ ...base, sandboxId: "sbx_1", type: "sandbox.exec.finished", data: { execId: "e", program: "sh", exitCode: null, durationMs: 1 } }), "sh → killed");
    assert.equal(describeEvent({ ...base, sandboxId: null, type: "webhook.disabled", data: { webhookId: "whk_1", reason: "failing" } }), "webhook whk_1: failing");
    assert.equal(describeEvent({ ...base, sandboxId: "sbx_1", type: "sandbox.file.written", data: { path: "/a", sizeBytes: 1 } }), "sandbox.file.written");
  });
});
