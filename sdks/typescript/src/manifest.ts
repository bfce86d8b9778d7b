/**
 * The SDK's models as data the OpenAPI test compares with the served document: the generated
 * `MODELS` (one entry per wire type, `generated/manifest.ts`), the query parameters each
 * operation sends, and the `data` fields of each public event type.
 */
import { fields, type ModelSpec } from "./field-spec.js";
import { GENERATED_MODELS } from "./generated/manifest.js";
import type * as M from "./models.js";
import { type PublicEventType } from "./models.js";

export type { Fields, ModelSpec } from "./field-spec.js";

/** SDK type name → its schema and fields, generated from the document by scripts/gen-sdk-models. */
export const MODELS: Record<string, ModelSpec> = GENERATED_MODELS;

/** Query parameters the SDK sends, per operation (checked against the operation's parameters). */
export const QUERY_PARAMS: Record<string, readonly string[]> = {
  listSandboxes: ["status", "label", "projectId", "limit", "cursor"],
  openPty: ["cols", "rows", "command", "env", "cwd", "session"],
  waitSandbox: ["status", "timeoutSeconds"],
  listSnapshots: ["projectId", "limit", "cursor"],
  listSandboxSnapshots: ["limit", "cursor"],
  listOrgs: ["limit", "cursor"],
  listPools: ["limit", "cursor"],
  listProjects: ["orgId", "limit", "cursor"],
  listKeys: ["orgId", "limit", "cursor"],
  listAudit: ["orgId", "projectId", "action", "actor", "resource", "since", "until", "limit", "cursor"],
  events: ["projectId", "sandboxId", "format", "types"],
  listWebhooks: ["projectId", "limit", "cursor"],
  listWebhookDeliveries: ["limit", "cursor"],
  uploadFile: ["path", "mode"],
  downloadFile: ["path"],
  deleteFile: ["path"],
  listFiles: ["path", "depth"],
  listProcesses: ["status"],
  processOutput: ["from", "follow"],
};

/**
 * The `data` fields of each public event type, held to the TypeScript types by the compiler and
 * to `GET /v1/events/schemas` by the events test (the schemas are served there, not as
 * components of the OpenAPI document).
 */
export const EVENT_DATA: Record<PublicEventType, Record<string, string>> = (() => {
  const operation = fields<M.SandboxOperationData>()({ operationId: "string", operation: "string", error: "object?" });
  const snapshot = fields<M.SnapshotEventData>()({ snapshotId: "string", sizeBytes: "integer?", error: "object?" });
  return {
    "sandbox.status.changed": fields<M.SandboxStatusChangedData>()({
      status: "string", statusReason: "string?", statusVersion: "integer", pool: "string?",
    }),
    "sandbox.operation.requested": operation,
    "sandbox.operation.finished": operation,
    "sandbox.operation.failed": operation,
    "sandbox.exec.started": fields<M.SandboxExecStartedData>()({ execId: "string", program: "string" }),
    "sandbox.exec.finished": fields<M.SandboxExecFinishedData>()({
      execId: "string", program: "string", exitCode: "integer?", durationMs: "integer", timedOut: "boolean",
    }),
    "sandbox.file.written": fields<M.SandboxFileWrittenData>()({ path: "string", sizeBytes: "integer" }),
    "snapshot.created": snapshot,
    "snapshot.failed": snapshot,
    "snapshot.deleted": snapshot,
    "placement.decided": fields<M.PlacementDecidedData>()({ pool: "string", region: "string?", attempt: "integer" }),
    "webhook.disabled": fields<M.WebhookDisabledData>()({ webhookId: "string", reason: "string" }),
  };
})();
