/**
 * The fields of each wire type, as data the OpenAPI test compares with the served document.
 *
 * `Fields<T>` makes the compiler hold each manifest to its TypeScript type: every field present,
 * none extra, and each spec (`string`, `integer?` …, `?` = may be null) matching the field's
 * type. So the chain is: TS type ⇔ manifest (tsc) ⇔ `/v1/openapi.json` (test).
 */
import { ERROR_CODES } from "./errors.js";
import type * as M from "./models.js";
import {
  AUDIT_PROBLEM_KINDS,
  CAPABILITIES,
  CREDENTIAL_KINDS,
  DECISIONS,
  DELIVERY_STATUSES,
  EVENT_CAUSES,
  CLASSIFICATIONS,
  EXTERNAL_MODES,
  ORG_STATUSES,
  PROFILES,
  PUBLIC_EVENT_TYPES,
  SANDBOX_STATUSES,
  SCOPES,
  SNAPSHOT_STATUSES,
  STRATEGIES,
  VERIFIED,
  type PublicEventType,
} from "./models.js";

type Base<T> = [T] extends [string]
  ? "string"
  : [T] extends [number]
    ? "number"
    : [T] extends [boolean]
      ? "boolean"
      : [T] extends [readonly unknown[]]
        ? "array"
        : "object";
/** `unknown` → `any`; nullable → `<base>?`. Numbers may be `integer` or `number` on the wire. */
type Spec<T> = unknown extends T
  ? "any"
  : null extends T
    ? `${Widen<Base<Exclude<T, null | undefined>>>}?`
    : Widen<Base<Exclude<T, undefined>>>;
type Widen<B extends string> = B extends "number" ? "integer" | "number" : B;

export type Fields<T> = { [K in keyof T]-?: Spec<T[K]> };

function fields<T>() {
  return <F extends Fields<T>>(f: F & Record<Exclude<keyof F, keyof T>, never>) => f;
}

/** SDK type name → (OpenAPI schema name, field specs, enums the SDK spells out). */
export interface ModelSpec {
  schema: string;
  /** Where the object sits inside the schema (e.g. `items.items` of FileList). */
  at?: string;
  fields: Record<string, string>;
  /** Request bodies: the SDK writes these; every field must exist, nothing else checked. */
  request?: boolean;
  enums?: Record<string, readonly string[]>;
}

export const MODELS: Record<string, ModelSpec> = {
  Sandbox: {
    schema: "Sandbox",
    fields: fields<M.Sandbox>()({
      id: "string", orgId: "string", projectId: "string", status: "string", statusReason: "string?",
      pool: "string?", resources: "object", capabilities: "array", classification: "string", region: "string?",
      labels: "object", template: "string?", envKeys: "array", ttlSeconds: "integer", idleTimeoutSeconds: "integer?",
      priority: "integer", attempts: "integer", createdAt: "string", startedAt: "string?", expiresAt: "string?",
      endedAt: "string?",
    }),
    enums: { status: SANDBOX_STATUSES },
  },
  Resources: { schema: "Resources", fields: fields<M.Resources>()({ cpu: "integer", memoryMiB: "integer", diskGiB: "integer" }) },
  CreateSandboxRequest: {
    schema: "CreateSandboxRequest",
    request: true,
    fields: fields<M.CreateSandboxRequest>()({
      projectId: "string?", template: "string?", resources: "object?", profile: "string?", env: "object?",
      labels: "object?", ttlSeconds: "integer?", idleTimeoutSeconds: "integer?", capabilities: "array?",
      classification: "string?", region: "string?", strategy: "string?", external: "string?", priority: "integer?",
      fromSnapshot: "string?",
    }),
    enums: { profile: PROFILES, classification: CLASSIFICATIONS, strategy: STRATEGIES, external: EXTERNAL_MODES, "capabilities[]": CAPABILITIES },
  },
  UpdateSandboxRequest: {
    schema: "UpdateSandboxRequest",
    request: true,
    fields: fields<M.UpdateSandboxRequest>()({ ttlSeconds: "integer?", idleTimeoutSeconds: "integer?", labels: "object?" }),
  },
  ExecRequest: {
    schema: "ExecRequest",
    request: true,
    fields: fields<M.ExecRequest>()({
      command: "array", env: "object", cwd: "string?", stdin: "string?", stdinBase64: "string?",
      timeoutSeconds: "integer?", outputEncoding: "string?",
    }),
    enums: { outputEncoding: ["utf8", "base64"] },
  },
  ExecResult: {
    schema: "ExecResult",
    fields: fields<M.ExecResult>()({
      exitCode: "integer", stdout: "string", stderr: "string", stdoutTruncated: "boolean", stderrTruncated: "boolean", durationMs: "integer",
    }),
  },
  ExecExit: { schema: "ExecExit", fields: fields<M.ExecExit>()({ exitCode: "integer", durationMs: "integer" }) },
  StreamError: { schema: "StreamError", fields: fields<M.StreamErrorBody>()({ code: "string", message: "string" }) },
  FileEntry: {
    schema: "FileList",
    at: "items.items",
    fields: fields<M.FileEntry>()({ path: "string", type: "string", size: "integer", mode: "integer", modifiedAt: "string?" }),
  },
  Snapshot: {
    schema: "Snapshot",
    fields: fields<M.Snapshot>()({
      id: "string", orgId: "string", projectId: "string", sandboxId: "string", pool: "string", name: "string?",
      status: "string", statusReason: "string?", createdAt: "string",
    }),
    enums: { status: SNAPSHOT_STATUSES },
  },
  SnapshotRequest: { schema: "SnapshotRequest", request: true, fields: fields<M.SnapshotRequest>()({ name: "string?" }) },
  PortRequest: { schema: "PortRequest", request: true, fields: fields<M.PortRequest>()({ port: "integer", expiresSeconds: "integer?" }) },
  PortAnswer: { schema: "PortAnswer", fields: fields<M.PortAnswer>()({ url: "string", expiresAt: "string?" }) },
  PendingOperation: { schema: "PendingOperation", fields: fields<M.PendingOperation>()({ operation: "string", status: "string" }) },
  StatusEvent: {
    schema: "StatusEvent",
    fields: fields<M.StatusEvent>()({
      sandboxId: "string", orgId: "string", projectId: "string", status: "string", statusReason: "string?",
      pool: "string?", statusVersion: "integer", at: "string",
    }),
    enums: { status: SANDBOX_STATUSES },
  },
  Org: { schema: "Org", fields: fields<M.Org>()({ id: "string", name: "string", status: "string", createdAt: "string" }), enums: { status: ORG_STATUSES } },
  CreateOrgRequest: { schema: "CreateOrgRequest", request: true, fields: fields<M.CreateOrgRequest>()({ name: "string" }) },
  UpdateOrgRequest: { schema: "UpdateOrgRequest", request: true, fields: fields<M.UpdateOrgRequest>()({ name: "string", status: "string" }), enums: { status: ORG_STATUSES } },
  Project: { schema: "Project", fields: fields<M.Project>()({ id: "string", orgId: "string", name: "string", createdAt: "string" }) },
  CreateProjectRequest: { schema: "CreateProjectRequest", request: true, fields: fields<M.CreateProjectRequest>()({ orgId: "string", name: "string" }) },
  UpdateProjectRequest: { schema: "UpdateProjectRequest", request: true, fields: fields<M.UpdateProjectRequest>()({ name: "string" }) },
  Key: {
    schema: "Key",
    fields: fields<M.Key>()({
      id: "string", orgId: "string", projectId: "string?", name: "string", scopes: "array", createdAt: "string",
      expiresAt: "string?", revokedAt: "string?", lastUsedAt: "string?",
    }),
    enums: { "scopes[]": SCOPES },
  },
  CreatedKey: {
    schema: "CreatedKey",
    fields: fields<M.CreatedKey>()({
      id: "string", orgId: "string", projectId: "string?", name: "string", scopes: "array", createdAt: "string",
      expiresAt: "string?", revokedAt: "string?", lastUsedAt: "string?", key: "string",
    }),
  },
  CreateKeyRequest: {
    schema: "CreateKeyRequest",
    request: true,
    fields: fields<M.CreateKeyRequest>()({ orgId: "string", projectId: "string", name: "string", scopes: "array", expiresAt: "string?" }),
    enums: { "scopes[]": SCOPES },
  },
  Quota: {
    schema: "Quota",
    request: true,
    fields: fields<M.Quota>()({
      maxActive: "integer?", maxCpu: "integer?", maxMemoryMiB: "integer?", maxDiskGiB: "integer?", maxQueued: "integer?",
      maxQueueSeconds: "integer?", maxSandbox: "object?",
    }),
  },
  QuotaView: { schema: "QuotaView", fields: fields<M.QuotaView>()({ quota: "object", effective: "object", usage: "object" }) },
  Policy: {
    schema: "Policy",
    request: true,
    fields: fields<M.Policy>()({
      allowExternal: "boolean?", allowedClassifications: "array?", allowedRegions: "array?", defaultStrategy: "string?",
      deniedPools: "array", externalPools: "array?", poolClassifications: "object",
    }),
    enums: { defaultStrategy: STRATEGIES, "allowedClassifications[]": CLASSIFICATIONS },
  },
  PoolHealth: {
    schema: "PoolHealth",
    fields: fields<M.PoolHealth>()({ name: "string", healthy: "boolean", capabilities: "array", error: "string?", checkedAt: "string", checkedBy: "string" }),
  },
  PoolRecord: {
    schema: "PoolRecord",
    fields: fields<M.PoolRecord>()({
      name: "string", kind: "string", trust: "string", region: "string?", maxConcurrent: "integer?", isolation: "string?",
      costPerCpuHour: "number", typicalCreateSeconds: "number?", settings: "any", source: "string", createdAt: "string", updatedAt: "string",
    }),
  },
  Pool: {
    schema: "Pool",
    fields: fields<M.Pool>()({
      name: "string", kind: "string", trust: "string", region: "string?", maxConcurrent: "integer?", isolation: "string?",
      costPerCpuHour: "number", typicalCreateSeconds: "number?", settings: "any", source: "string", createdAt: "string", updatedAt: "string",
      capabilities: "array", backendVersion: "string?", verified: "string", verifiedBasis: "string",
      healthy: "boolean", health: "object?", usedSlots: "integer",
    }),
    enums: { verified: VERIFIED },
  },
  PoolRequest: {
    schema: "PoolRequest",
    request: true,
    fields: fields<M.PoolRequest>()({
      name: "string?", kind: "string?", trust: "string?", region: "string?", maxConcurrent: "integer?", isolation: "string?",
      costPerCpuHour: "number?", typicalCreateSeconds: "number?", settings: "any",
    }),
  },
  WarmClass: {
    schema: "WarmClass",
    request: true,
    fields: fields<M.WarmClass>()({
      name: "string", size: "integer", maxSize: "integer?", refillPerSecond: "number", maxAgeSeconds: "integer",
      template: "string?", resources: "object?",
    }),
  },
  WarmClassesRequest: {
    schema: "WarmClassesRequest",
    request: true,
    fields: fields<M.WarmClassesRequest>()({ classes: "array" }),
  },
  WarmClassStatus: {
    schema: "WarmClassStatus",
    fields: fields<M.WarmClassStatus>()({
      name: "string", size: "integer", maxSize: "integer?", refillPerSecond: "number", maxAgeSeconds: "integer",
      template: "string?", resources: "object?", ready: "integer", creating: "integer",
      claimsPerMinute: "number", hitRatio: "number?",
    }),
  },
  WarmClasses: { schema: "WarmClasses", fields: fields<M.WarmClasses>()({ classes: "array" }) },
  Health: { schema: "Health", fields: fields<M.Health>()({ status: "string" }) },
  PoolVerdict: {
    schema: "PoolVerdict",
    fields: fields<M.PoolVerdict>()({ name: "string", eligible: "boolean", reason: "string", score: "number" }),
  },
  EffectivePolicy: {
    schema: "EffectivePolicy",
    fields: fields<M.EffectivePolicy>()({
      allowedClassifications: "array?", allowedRegions: "array?", defaultStrategy: "string", deniedPools: "array",
      externalForbiddenBy: "string?", externalPools: "array", poolClassifications: "object",
    }),
    enums: { defaultStrategy: STRATEGIES, externalForbiddenBy: ["global", "org", "project"] },
  },
  Placement: {
    schema: "Placement",
    fields: fields<M.Placement>()({
      decision: "string", pool: "string", code: "string", reason: "string", decidedAt: "string", policy: "object", pools: "array",
      wall: "string",
    }),
    enums: { decision: DECISIONS, code: ERROR_CODES, wall: ["org", "project", "pool"] },
  },
  DryRun: {
    schema: "DryRun",
    fields: fields<M.DryRun>()({ decision: "string", pool: "string", code: "string", reason: "string", pools: "array" }),
    enums: { decision: DECISIONS, code: ERROR_CODES },
  },
  Secret: {
    schema: "Secret",
    fields: fields<M.Secret>()({ name: "string", fingerprint: "string", updatedBy: "string", updatedAt: "string", createdAt: "string" }),
  },
  AuditEvent: {
    schema: "AuditEvent",
    fields: fields<M.AuditEvent>()({
      seq: "integer", chain: "string", chainSeq: "integer", orgId: "string?", projectId: "string?", actor: "string",
      action: "string", resource: "string", outcome: "string", requestId: "string?", at: "string", detail: "any",
      prevHash: "string", hash: "string", keyId: "string",
    }),
  },
  AuditProblem: {
    schema: "AuditProblem",
    fields: fields<M.AuditProblem>()({ kind: "string", chain: "string", chainSeq: "integer", seq: "integer?", message: "string" }),
    enums: { kind: AUDIT_PROBLEM_KINDS },
  },
  Verification: {
    schema: "Verification",
    fields: fields<M.Verification>()({
      ok: "boolean", chains: "integer", records: "integer", checkpoints: "integer", unchainedRecords: "integer",
      firstBad: "object?", problems: "array", unverifiableRecords: "integer", unverifiableCheckpoints: "integer",
      unknownKeyIds: "array", segments: "array",
    }),
  },
  VerificationSegment: {
    schema: "Verification",
    at: "segments.items",
    fields: fields<M.VerificationSegment>()({ seq: "integer", at: "string", keyId: "string?", reason: "string", lostKeyIds: "array" }),
  },
  Checkpoint: {
    schema: "Checkpoint",
    fields: fields<M.Checkpoint>()({
      seq: "integer", at: "string", heads: "array", prevHash: "string", hash: "string", keyId: "string", segment: "object",
    }),
  },
  CheckpointHead: {
    schema: "Checkpoint",
    at: "heads.items",
    fields: fields<M.CheckpointHead>()({ chain: "string", chainSeq: "integer", hash: "string" }),
  },
  CheckpointSegment: {
    schema: "Checkpoint",
    at: "segment",
    fields: fields<M.CheckpointSegment>()({ reason: "string", lostKeyIds: "array" }),
  },
  AuditSegment: { schema: "AuditSegment", fields: fields<M.AuditSegment>()({ checkpoint: "object", report: "object" }) },
  TrustReport: {
    schema: "TrustReport",
    fields: fields<M.TrustReport>()({
      generatedAt: "string", installationId: "string", telemetry: "string", pools: "array", externalPlacements: "array", notEnforced: "array",
    }),
  },
  TrustPool: {
    schema: "TrustReport",
    at: "pools.items",
    fields: fields<M.TrustPool>()({
      name: "string", kind: "string", trust: "string", region: "string?", isolation: "string", egress: "string",
      endpoint: "string?", credentials: "array", source: "string", healthy: "boolean", health: "object?",
      warm: "array", backendVersion: "string?", verified: "string", verifiedBasis: "string",
    }),
    enums: { trust: ["private", "external"], source: ["config", "api"], verified: VERIFIED },
  },
  TrustCredential: {
    schema: "TrustReport",
    at: "pools.items.credentials.items",
    fields: fields<M.TrustCredential>()({
      kind: "string", setting: "string", reference: "string", name: "string?", fingerprint: "string?",
      updatedBy: "string?", updatedAt: "string?", problem: "string?",
    }),
    enums: { kind: CREDENTIAL_KINDS },
  },
  ExternalPlacement: {
    schema: "TrustReport",
    at: "externalPlacements.items",
    fields: fields<M.ExternalPlacement>()({
      orgId: "string", orgName: "string?", pool: "string", sandboxes: "integer", firstAt: "string", lastAt: "string", policy: "object?",
    }),
  },
  MetricsSummary: {
    schema: "MetricsSummary",
    fields: fields<M.MetricsSummary>()({
      generatedAt: "string", enabled: "boolean", admissions: "object", activations: "object", queueDepth: "object",
    }),
  },
  QueueReport: {
    schema: "QueueReport",
    fields: fields<M.QueueReport>()({ generatedAt: "string", total: "integer", truncated: "boolean", orgs: "array" }),
  },
  QueueOrg: {
    schema: "QueueReport",
    at: "orgs.items",
    fields: fields<M.QueueOrg>()({
      orgId: "string", orgName: "string?", depth: "integer", oldestQueuedAt: "string", oldestSandboxId: "string",
      walls: "object", reasons: "array",
    }),
  },
  QueueReason: {
    schema: "QueueReport",
    at: "orgs.items.reasons.items",
    fields: fields<M.QueueReason>()({ reason: "string", count: "integer" }),
  },
  PublicEvent: {
    schema: "PublicEvent",
    fields: fields<M.PublicEvent>()({
      version: "integer", id: "string", type: "string", time: "string", orgId: "string", projectId: "string",
      sandboxId: "string?", cause: "string", actor: "object?", data: "object",
    }),
    enums: { type: PUBLIC_EVENT_TYPES, cause: EVENT_CAUSES },
  },
  EventSchemaList: {
    schema: "EventSchemaList",
    fields: fields<M.EventSchemaList>()({ version: "integer", envelope: "object", items: "array" }),
  },
  EventCredentialsRequest: {
    schema: "EventCredentialsRequest",
    request: true,
    fields: fields<M.EventCredentialsRequest>()({ ttlSeconds: "integer?", projectId: "string?" }),
  },
  EventCredentials: {
    schema: "EventCredentials",
    fields: fields<M.EventCredentials>()({
      id: "string", token: "string", expiresAt: "string", orgId: "string", projectId: "string?", subscribe: "string",
      inboxPrefix: "string", stream: "string", consumerCreate: "string",
    }),
  },
  Webhook: {
    schema: "Webhook",
    fields: fields<M.Webhook>()({
      id: "string", orgId: "string", projectId: "string", url: "string", eventTypes: "array", description: "string?",
      enabled: "boolean", disabledReason: "string?", consecutiveFailures: "integer", failingSince: "string?",
      previousSecretExpiresAt: "string?", createdAt: "string", updatedAt: "string",
    }),
  },
  WebhookWithSecret: {
    schema: "WebhookWithSecret",
    fields: fields<M.WebhookWithSecret>()({
      id: "string", orgId: "string", projectId: "string", url: "string", eventTypes: "array", description: "string?",
      enabled: "boolean", disabledReason: "string?", consecutiveFailures: "integer", failingSince: "string?",
      previousSecretExpiresAt: "string?", createdAt: "string", updatedAt: "string",
      secret: "string",
    }),
  },
  CreateWebhookRequest: {
    schema: "CreateWebhookRequest",
    request: true,
    fields: fields<M.CreateWebhookRequest>()({ projectId: "string?", url: "string", eventTypes: "array", description: "string?" }),
  },
  UpdateWebhookRequest: {
    schema: "UpdateWebhookRequest",
    request: true,
    fields: fields<M.UpdateWebhookRequest>()({ url: "string", eventTypes: "array", description: "string?", enabled: "boolean" }),
  },
  WebhookDelivery: {
    schema: "WebhookDelivery",
    fields: fields<M.WebhookDelivery>()({
      id: "string", webhookId: "string", eventId: "string", eventType: "string", status: "string", attempts: "integer",
      nextAttemptAt: "string?", responseCode: "integer?", latencyMs: "integer?", lastError: "string?",
      responseBody: "string?", createdAt: "string", updatedAt: "string", deliveredAt: "string?",
    }),
    enums: { status: DELIVERY_STATUSES },
  },
};

/** Query parameters the SDK sends, per operation (checked against the operation's parameters). */
export const QUERY_PARAMS: Record<string, readonly string[]> = {
  listSandboxes: ["status", "label", "projectId", "limit", "cursor"],
  openPty: ["cols", "rows", "command", "env", "cwd", "session"],
  waitSandbox: ["status", "timeoutSeconds"],
  listSnapshots: ["projectId", "limit", "cursor"],
  listSandboxSnapshots: ["limit", "cursor"],
  listOrgs: ["limit", "cursor"],
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
