/**
 * Wire types of the `/v1` API (JSON, camelCase), as `GET /v1/openapi.json` describes them.
 *
 * Each schema-backed type has a field manifest in `manifest.ts` that the compiler holds to the
 * type and a test holds to the served OpenAPI document, so a renamed or retyped field fails the
 * build or the test instead of drifting.
 */
import type { ErrorCode } from "./errors.js";

export const SANDBOX_STATUSES = [
  "queued",
  "provisioning",
  "running",
  "paused",
  "stopped",
  "terminating",
  "terminated",
  "failed",
] as const;
export type SandboxStatus = (typeof SANDBOX_STATUSES)[number];
/** Statuses a sandbox never leaves. */
export const FINAL_STATUSES: readonly SandboxStatus[] = ["terminated", "failed"];

export const SNAPSHOT_STATUSES = ["creating", "ready", "failed", "deleting"] as const;
export type SnapshotStatus = (typeof SNAPSHOT_STATUSES)[number];

export const SCOPES = [
  "sandboxes:read",
  "sandboxes:write",
  "sandboxes:exec",
  "files:read",
  "files:write",
  "admin",
] as const;
export type Scope = (typeof SCOPES)[number];

export const CAPABILITIES = [
  "exec",
  "files",
  "exec.stream",
  "exec.pty",
  "lifecycle.pause",
  "lifecycle.stop",
  "snapshots",
  "ports.expose",
  "network.egress-control",
  "gpu",
] as const;
export type Capability = (typeof CAPABILITIES)[number];

export const CLASSIFICATIONS = ["public", "internal", "confidential", "restricted"] as const;
export type Classification = (typeof CLASSIFICATIONS)[number];
export const EXTERNAL_MODES = ["never", "allowed", "required"] as const;
export type ExternalMode = (typeof EXTERNAL_MODES)[number];
export const PROFILES = ["small", "medium", "large", "xlarge"] as const;
export type Profile = (typeof PROFILES)[number];
export const STRATEGIES = ["private-first", "cheapest", "fastest", "least-loaded"] as const;
export type Strategy = (typeof STRATEGIES)[number];
export const ORG_STATUSES = ["active", "suspended"] as const;
export type OrgStatus = (typeof ORG_STATUSES)[number];

/** One page of a list: `{items, nextCursor}`; `nextCursor` null on the last page. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

export interface Resources {
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}

export interface Sandbox {
  id: string;
  orgId: string;
  projectId: string;
  status: SandboxStatus;
  statusReason: string | null;
  pool: string | null;
  resources: Resources;
  capabilities: string[];
  classification: string;
  region: string | null;
  labels: Record<string, string>;
  template: string | null;
  /** Names of the env variables given at create; values are never returned. */
  envKeys: string[];
  ttlSeconds: number;
  idleTimeoutSeconds: number | null;
  priority: number;
  attempts: number;
  createdAt: string;
  startedAt: string | null;
  expiresAt: string | null;
  endedAt: string | null;
}

/** `POST /v1/sandboxes` (and `POST /v1/placement/dry-run`): every field optional. */
export interface CreateSandboxRequest {
  projectId?: string | null;
  template?: string | null;
  resources?: { cpu?: number | null; memoryMiB?: number | null; diskGiB?: number | null } | null;
  profile?: Profile | null;
  env?: Record<string, string> | null;
  labels?: Record<string, string> | null;
  ttlSeconds?: number | null;
  idleTimeoutSeconds?: number | null;
  capabilities?: Capability[] | null;
  classification?: Classification | null;
  region?: string | null;
  strategy?: Strategy | null;
  external?: ExternalMode | null;
  priority?: number | null;
  /** Restore or fork: a ready snapshot's id. */
  fromSnapshot?: string | null;
}

/** `PATCH /v1/sandboxes/{id}`; `idleTimeoutSeconds: null` clears it. */
export interface UpdateSandboxRequest {
  ttlSeconds?: number | null;
  idleTimeoutSeconds?: number | null;
  labels?: Record<string, string> | null;
}

/** `GET /v1/sandboxes` filters. */
export interface ListSandboxesParams {
  status?: SandboxStatus;
  /** `{k: v, …}` → one `label=k=v` each; a sandbox must carry every pair to be listed. */
  labels?: Record<string, string>;
  projectId?: string;
  limit?: number;
  cursor?: string;
}

export interface ExecRequest {
  command: string[];
  env?: Record<string, string>;
  cwd?: string | null;
  stdin?: string | null;
  stdinBase64?: string | null;
  timeoutSeconds?: number | null;
  outputEncoding?: "utf8" | "base64" | null;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
}

export interface ExecExit {
  exitCode: number;
  durationMs: number;
}

export interface StreamErrorBody {
  code: string;
  message: string;
}

export interface FileEntry {
  path: string;
  type: string;
  size: number;
  mode: number;
  modifiedAt: string | null;
}

export interface FileList {
  items: FileEntry[];
}

export interface Snapshot {
  id: string;
  orgId: string;
  projectId: string;
  sandboxId: string;
  pool: string;
  name: string | null;
  status: SnapshotStatus;
  statusReason: string | null;
  createdAt: string;
}

export interface SnapshotRequest {
  name?: string | null;
}

export interface PortRequest {
  port: number;
  expiresSeconds?: number | null;
}

export interface PortAnswer {
  url: string;
  expiresAt: string | null;
}

/** A 202 answer: the change goes on in the background. */
export interface PendingOperation {
  operation: string;
  status: string;
}

export const DECISIONS = ["placed", "waiting", "rejected"] as const;
export type Decision = (typeof DECISIONS)[number];

/** One pool's verdict in a placement or dry run: eligible or why not, and its score. */
export interface PoolVerdict {
  name: string;
  eligible: boolean;
  reason?: string;
  /** 0–100, for eligible pools. */
  score?: number;
}

/** The former name of PoolVerdict. */
export type PlacementPool = PoolVerdict;

/** The policy in force for a placement, merged global → org → project. */
export interface EffectivePolicy {
  allowedClassifications: string[] | null;
  allowedRegions: string[] | null;
  defaultStrategy: Strategy;
  deniedPools: string[];
  /** Which level forbade external pools, or null when none did. */
  externalForbiddenBy: "global" | "org" | "project" | null;
  externalPools: string[];
  poolClassifications: Record<string, string[]>;
}

/** `GET /v1/sandboxes/{id}/placement`: the stored decision and why. */
export interface Placement {
  decision: Decision;
  pool?: string;
  /** The error code of a rejection (e.g. `no_eligible_pool`). */
  code?: ErrorCode;
  reason?: string;
  decidedAt: string;
  policy: EffectivePolicy;
  pools: PoolVerdict[];
  /** What a waiting sandbox waits behind: its org's or project's quota, or a pool's cap. */
  wall?: "org" | "project" | "pool";
}

/** `POST /v1/placement/dry-run`: what a create would decide now, changing nothing. */
export interface DryRun {
  decision: Decision;
  pool?: string;
  code?: ErrorCode;
  reason?: string;
  pools: PoolVerdict[];
}

/** `event: status` on `/v1/events`. */
export interface StatusEvent {
  sandboxId: string;
  orgId: string;
  projectId: string;
  status: SandboxStatus;
  statusReason: string | null;
  pool: string | null;
  statusVersion: number;
  at: string;
}

export interface Org {
  id: string;
  name: string;
  status: OrgStatus;
  createdAt: string;
}

export interface CreateOrgRequest {
  name: string;
}

export interface UpdateOrgRequest {
  name?: string;
  status?: OrgStatus;
}

export interface Project {
  id: string;
  orgId: string;
  name: string;
  createdAt: string;
}

export interface CreateProjectRequest {
  orgId?: string;
  name: string;
}

export interface UpdateProjectRequest {
  name: string;
}

export interface Key {
  id: string;
  orgId: string;
  projectId: string | null;
  name: string;
  scopes: Scope[];
  createdAt: string;
  expiresAt: string | null;
  revokedAt: string | null;
  lastUsedAt: string | null;
}

/** The answer to `POST /v1/keys`: the only time `key` (the secret) is shown. */
export interface CreatedKey extends Key {
  key: string;
}

export interface CreateKeyRequest {
  orgId?: string;
  projectId?: string;
  name: string;
  scopes: Scope[];
  expiresAt?: string | null;
}

export interface Quota {
  maxActive?: number | null;
  maxCpu?: number | null;
  maxMemoryMiB?: number | null;
  maxDiskGiB?: number | null;
  maxQueued?: number | null;
  maxQueueSeconds?: number | null;
  maxSandbox?: Resources | null;
}

export interface QuotaView {
  quota: Quota;
  effective: Quota;
  /** What the scope uses now: active, queued, cpu, memoryMiB, diskGiB. */
  usage: Record<string, number>;
}

export interface Policy {
  allowExternal?: boolean | null;
  allowedClassifications?: Classification[] | null;
  allowedRegions?: string[] | null;
  defaultStrategy?: Strategy | null;
  deniedPools?: string[];
  externalPools?: string[] | null;
  poolClassifications?: Record<string, Classification[]>;
}

export interface PoolHealth {
  name: string;
  healthy: boolean;
  capabilities: string[];
  error: string | null;
  checkedAt: string;
  checkedBy: string;
}

export interface PoolRecord {
  name: string;
  kind: string;
  trust: "private" | "external";
  region: string | null;
  maxConcurrent: number | null;
  isolation: "container" | "microvm" | null;
  costPerCpuHour: number;
  typicalCreateSeconds: number | null;
  /** Adapter settings: credential references, never credentials. */
  settings: unknown;
  source: "config" | "api";
  createdAt: string;
  updatedAt: string;
}

/** How far a pool's adapter is verified against its backend (`Pool.verified`). */
export const VERIFIED = ["live", "replayed", "fake-only", "unknown"] as const;
export type Verified = (typeof VERIFIED)[number];

export interface Pool extends PoolRecord {
  capabilities: string[];
  /** As the API process's adapter last detected it; null before its first call. */
  backendVersion: string | null;
  verified: Verified;
  verifiedBasis: string;
  healthy: boolean;
  health: PoolHealth | null;
  usedSlots: number;
}

export interface PoolRequest {
  name?: string | null;
  kind?: string | null;
  trust?: "private" | "external" | null;
  region?: string | null;
  maxConcurrent?: number | null;
  isolation?: "container" | "microvm" | null;
  costPerCpuHour?: number | null;
  typicalCreateSeconds?: number | null;
  settings?: unknown;
}

/** A warm class's resources, all three given (a class fixes them whole). */
export interface WarmResources {
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}

/**
 * One warm class of a pool (`pools.setWarm`): instances kept ready so that a create asking for
 * the same `template` and `resources` is answered from one. Left out: `maxSize` = `size`,
 * `maxAgeSeconds` = 3600, `template` = the pool's default, `resources` = a create's defaults.
 */
export interface WarmClass {
  name: string;
  size: number;
  maxSize?: number | null;
  refillPerSecond: number;
  maxAgeSeconds?: number;
  template?: string | null;
  resources?: WarmResources | null;
}

/** The body of `PUT /v1/admin/pools/{name}/warm`: every class, in matching order. */
export interface WarmClassesRequest {
  classes: WarmClass[];
}

/** A warm class as served, with its instances being created and ready. */
export interface WarmClassStatus {
  name: string;
  size: number;
  maxSize?: number | null;
  refillPerSecond: number;
  maxAgeSeconds: number;
  template?: string | null;
  resources?: WarmResources | null;
  ready: number;
  creating: number;
  /** Instances claimed per minute over the last 10 minutes. */
  claimsPerMinute: number;
  /** Share of the matching creates of the last 10 minutes answered warm; null when none. */
  hitRatio: number | null;
}

/** `GET /v1/admin/pools/{name}/warm`. */
export interface WarmClasses {
  classes: WarmClassStatus[];
}

/** A stored backend secret: name and fingerprint, never the value. */
export interface Secret {
  name: string;
  /** `sha256:` and 16 hex digits of the value's hash: enough to tell values apart, not to recover one. */
  fingerprint: string;
  updatedBy: string;
  updatedAt: string;
  createdAt: string;
}

/** One audit record of a hash chain. */
export interface AuditEvent {
  seq: number;
  chain: string;
  chainSeq: number;
  orgId: string | null;
  projectId: string | null;
  actor: string;
  action: string;
  resource: string;
  outcome: string;
  requestId: string | null;
  at: string;
  /** What else matters; never a secret, exec arguments or env values. */
  detail: unknown;
  prevHash: string;
  hash: string;
  /** The signing key's id (absent on records older than signing). */
  keyId?: string;
}

export interface ListAuditParams {
  orgId?: string;
  projectId?: string;
  action?: string;
  actor?: string;
  resource?: string;
  since?: string;
  until?: string;
  limit?: number;
  cursor?: string;
}

export const AUDIT_PROBLEM_KINDS = [
  "hash_mismatch",
  "broken_link",
  "missing",
  "duplicate",
  "checkpoint_mismatch",
  "truncated",
  "bad_checkpoint",
  "unknown_key",
] as const;
export type AuditProblemKind = (typeof AUDIT_PROBLEM_KINDS)[number];

/** One thing audit verification found wrong. */
export interface AuditProblem {
  kind: AuditProblemKind;
  chain: string;
  chainSeq: number;
  seq: number | null;
  message: string;
}

/** A segment boundary recorded in the log (after a signing key was lost). */
export interface VerificationSegment {
  seq: number;
  at: string;
  keyId: string | null;
  reason: string;
  lostKeyIds: string[];
}

/** `GET /v1/admin/audit/verify`: every chain checked. */
export interface Verification {
  ok: boolean;
  chains: number;
  records: number;
  checkpoints: number;
  unchainedRecords: number;
  firstBad: AuditProblem | null;
  problems: AuditProblem[];
  unverifiableRecords: number;
  unverifiableCheckpoints: number;
  unknownKeyIds: string[];
  segments: VerificationSegment[];
}

/** A chain head as a checkpoint signs it. */
export interface CheckpointHead {
  chain: string;
  chainSeq: number;
  hash: string;
}

/** A segment's reason, on the checkpoint that starts it. */
export interface CheckpointSegment {
  reason: string;
  lostKeyIds: string[];
}

/** `POST /v1/admin/audit/checkpoints` (201): a signed record of every chain head. */
export interface Checkpoint {
  seq: number;
  at: string;
  heads: CheckpointHead[];
  prevHash: string;
  hash: string;
  keyId?: string;
  segment?: CheckpointSegment;
}

/** `POST /v1/admin/audit/segments`: the checkpoint starting the segment and the verification before it. */
export interface AuditSegment {
  checkpoint: Checkpoint;
  report: Verification;
}

export const CREDENTIAL_KINDS = ["env", "file", "secret", "inline"] as const;
export type CredentialKind = (typeof CREDENTIAL_KINDS)[number];

/** One credential reference of a pool's settings, described (never its value). */
export interface TrustCredential {
  kind: CredentialKind;
  setting: string;
  reference: string;
  name: string | null;
  fingerprint: string | null;
  updatedBy: string | null;
  updatedAt: string | null;
  /** Why the reference does not resolve, when it does not. */
  problem: string | null;
}

/** A pool as the trust report describes it. */
export interface TrustPool {
  name: string;
  kind: string;
  trust: "private" | "external";
  region: string | null;
  isolation: string;
  egress: string;
  endpoint: string | null;
  credentials: TrustCredential[];
  source: "config" | "api";
  healthy: boolean;
  health: PoolHealth | null;
  /** Warm capacity per class: instances created ahead of any tenant. */
  warm: WarmClassStatus[];
  backendVersion: string | null;
  verified: Verified;
  verifiedBasis: string;
}

/** Sandboxes of one org that went to one external pool. */
export interface ExternalPlacement {
  orgId: string;
  orgName: string | null;
  pool: string;
  sandboxes: number;
  firstAt: string;
  lastAt: string;
  policy: EffectivePolicy | null;
}

/** `GET /v1/admin/trust-report`: where work may go, under which policy, with which credentials. */
export interface TrustReport {
  generatedAt: string;
  installationId: string;
  telemetry: string;
  pools: TrustPool[];
  externalPlacements: ExternalPlacement[];
  /** What Differently does not enforce, in words. */
  notEnforced: string[];
}

export interface Health {
  status: string;
}

/** `GET /v1/admin/metrics/summary`: this API process's counters, for the dashboard's charts. */
export interface MetricsSummary {
  generatedAt: string;
  /** `false` (and empty maps) when the process keeps no metrics. */
  enabled: boolean;
  /** `differently_admissions_total` by outcome (`admitted`, …). */
  admissions: Record<string, number>;
  /** `differently_activations_total` by pool. */
  activations: Record<string, number>;
  /** `differently_queue_depth` by org (`other` for the rest). */
  queueDepth: Record<string, number>;
}

export const QUEUE_WALLS = ["org", "project", "pool", "unknown"] as const;
/** What a queued sandbox waits behind; `unknown` past the first 500 rows read. */
export type QueueWall = (typeof QUEUE_WALLS)[number];

/** One waiting reason and how many queued sandboxes give it. */
export interface QueueReason {
  reason: string;
  count: number;
}

/** One organization's part of the fair queue. */
export interface QueueOrg {
  orgId: string;
  orgName: string | null;
  depth: number;
  oldestQueuedAt: string;
  oldestSandboxId: string;
  walls: Partial<Record<QueueWall, number>>;
  reasons: QueueReason[];
}

/** `GET /v1/admin/queue`: the fair queue per organization, deepest first. */
export interface QueueReport {
  generatedAt: string;
  total: number;
  /** More queued rows than the report reads (10 000). */
  truncated: boolean;
  orgs: QueueOrg[];
}

export const PUBLIC_EVENT_TYPES = [
  "sandbox.status.changed",
  "sandbox.operation.requested",
  "sandbox.operation.finished",
  "sandbox.operation.failed",
  "sandbox.exec.started",
  "sandbox.exec.finished",
  "sandbox.file.written",
  "snapshot.created",
  "snapshot.failed",
  "snapshot.deleted",
  "placement.decided",
  "webhook.disabled",
] as const;
export type PublicEventType = (typeof PUBLIC_EVENT_TYPES)[number];

export const EVENT_CAUSES = ["user", "ttl", "idle", "reconciler", "quota", "admin", "backend"] as const;
/** Who decided a change (docs/events.md). */
export type EventCause = (typeof EVENT_CAUSES)[number];

/** `{code, message}` of a failed operation or snapshot. */
export interface EventError {
  code: string;
  message: string;
}

export interface SandboxStatusChangedData {
  status: SandboxStatus;
  statusReason: string | null;
  /** Apply a change only when this is above the last one applied for the sandbox. */
  statusVersion: number;
  pool: string | null;
}

export interface SandboxOperationData {
  operationId: string;
  /** `pause`, `resume`, `snapshot`, … */
  operation: string;
  /** Set on `sandbox.operation.failed`. */
  error: EventError | null;
}

export interface SandboxExecStartedData {
  execId: string;
  /** The program's name only: never arguments, env values or stdin. */
  program: string;
}

export interface SandboxExecFinishedData {
  execId: string;
  program: string;
  /** `null` when killed or timed out. */
  exitCode: number | null;
  durationMs: number;
  timedOut?: boolean;
}

export interface SandboxFileWrittenData {
  path: string;
  sizeBytes: number;
}

export interface SnapshotEventData {
  snapshotId: string;
  sizeBytes: number | null;
  error: EventError | null;
}

export interface PlacementDecidedData {
  pool: string;
  region: string | null;
  attempt: number;
}

export interface WebhookDisabledData {
  webhookId: string;
  reason: string;
}

/** The `data` of each public event type. */
export interface PublicEventData {
  "sandbox.status.changed": SandboxStatusChangedData;
  "sandbox.operation.requested": SandboxOperationData;
  "sandbox.operation.finished": SandboxOperationData;
  "sandbox.operation.failed": SandboxOperationData;
  "sandbox.exec.started": SandboxExecStartedData;
  "sandbox.exec.finished": SandboxExecFinishedData;
  "sandbox.file.written": SandboxFileWrittenData;
  "snapshot.created": SnapshotEventData;
  "snapshot.failed": SnapshotEventData;
  "snapshot.deleted": SnapshotEventData;
  "placement.decided": PlacementDecidedData;
  "webhook.disabled": WebhookDisabledData;
}

/** One public event of type `T`: the versioned envelope of docs/events.md. */
export interface PublicEventOf<T extends PublicEventType> {
  /** The envelope's major version; the SDK knows 1. */
  version: 1;
  /** Stable: the same change always has the same id (de-duplicate on it). Opaque. */
  id: string;
  type: T;
  /** When the change was committed. */
  time: string;
  orgId: string;
  projectId: string;
  /** `null` only for project-level events (`webhook.disabled`). */
  sandboxId: string | null;
  cause: EventCause;
  /** The key's public id for `cause: "user"` (never the key); `null` otherwise. */
  actor: { keyId: string } | null;
  data: PublicEventData[T];
}

/**
 * A public event, narrowed by `type` (`if (e.type === "sandbox.exec.finished") e.data.exitCode`).
 * A newer server may send types this SDK does not know yet (the contract adds types without a
 * new version): such an event arrives as it is, so give a `switch` a `default`.
 */
export type PublicEvent = { [T in PublicEventType]: PublicEventOf<T> }[PublicEventType];

/** Whether `type` is one this SDK version has a typed `data` for. */
export function isKnownEventType(type: string): type is PublicEventType {
  return (PUBLIC_EVENT_TYPES as readonly string[]).includes(type);
}

/** `GET /v1/events/schemas`: the JSON Schema (draft 2020-12) of the envelope and of each type. */
export interface EventSchemaList {
  version: number;
  envelope: Record<string, unknown>;
  items: { type: string; schema: Record<string, unknown> }[];
}

/** `POST /v1/events/credentials` (not under `differently dev`: 501). */
export interface EventCredentialsRequest {
  /** 60 … 86400; default 3600. */
  ttlSeconds?: number | null;
  /** Narrow to one project's subjects (a project-bound key always is). */
  projectId?: string | null;
}

/** NATS credentials for the org's (or project's) public subjects; `token` is shown once. */
export interface EventCredentials {
  id: string;
  /** The NATS token (a secret: shown this once, never logged by the SDK). */
  token: string;
  expiresAt: string;
  orgId: string;
  projectId: string | null;
  /** The subject filter the credential may subscribe to. */
  subscribe: string;
  /** Connect with this inbox prefix (the credential may use no other). */
  inboxPrefix: string;
  stream: string;
  /** The JetStream API subject pattern for creating a named consumer. */
  consumerCreate: string;
}

/** A project's webhook (`docs/webhooks.md`); the secret is never part of it. */
export interface Webhook {
  id: string;
  orgId: string;
  projectId: string;
  url: string;
  /** Exact types, prefixes (`sandbox.exec.*`) or `*`; empty: every type. */
  eventTypes: string[];
  description: string | null;
  enabled: boolean;
  /** Why it was disabled automatically (after failing long enough). */
  disabledReason: string | null;
  consecutiveFailures: number;
  failingSince: string | null;
  /** Until when the secret replaced by the last rotation still signs next to the new one. */
  previousSecretExpiresAt: string | null;
  createdAt: string;
  updatedAt: string;
}

/** The answer to create and rotate-secret: the only time `secret` (`whsec_<base64>`) is shown. */
export interface WebhookWithSecret extends Webhook {
  secret: string;
}

export interface CreateWebhookRequest {
  /** Defaults to the key's project. */
  projectId?: string | null;
  /** `https://…` (`http` and private addresses only where the operator allows them). */
  url: string;
  eventTypes?: string[];
  description?: string | null;
}

/** `PATCH /v1/webhooks/{id}`; `enabled: true` re-enables and forgets the failure run. */
export interface UpdateWebhookRequest {
  url?: string;
  eventTypes?: string[];
  description?: string | null;
  enabled?: boolean;
}

export const DELIVERY_STATUSES = ["pending", "succeeded", "failed"] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

/** One event's delivery to one webhook, with its last attempt. */
export interface WebhookDelivery {
  id: string;
  webhookId: string;
  /** The event's `id`, sent as `webhook-id` on every attempt. */
  eventId: string;
  eventType: string;
  status: DeliveryStatus;
  attempts: number;
  nextAttemptAt: string | null;
  responseCode: number | null;
  latencyMs: number | null;
  lastError: string | null;
  /** The first 1 KiB of the receiver's answer. */
  responseBody: string | null;
  createdAt: string;
  updatedAt: string;
  deliveredAt: string | null;
}
