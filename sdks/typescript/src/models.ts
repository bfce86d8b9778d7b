/**
 * Wire types of the `/v1` API (JSON, camelCase), as `GET /v1/openapi.json` describes them.
 *
 * Each schema-backed type has a field manifest in `manifest.ts` that the compiler holds to the
 * type and a test holds to the served OpenAPI document, so a renamed or retyped field fails the
 * build or the test instead of drifting.
 */

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
  /** `{k: v}` → `label=k=v`. One pair: the API takes a single label filter per request. */
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

export interface PlacementPool {
  name: string;
  eligible: boolean;
  reason?: string;
  score?: number;
}

/** `GET /v1/sandboxes/{id}/placement` (prose in the OpenAPI document; shape from docs/api.md). */
export interface Placement {
  decision: "placed" | "waiting" | "rejected";
  pool?: string | null;
  reason?: string | null;
  wall?: "org" | "project" | "pool" | null;
  decidedAt?: string;
  policy?: Record<string, unknown>;
  pools: PlacementPool[];
  [extra: string]: unknown;
}

/** `POST /v1/placement/dry-run`. */
export interface DryRun {
  decision: "placed" | "waiting" | "rejected";
  pool?: string | null;
  code?: string | null;
  reason?: string | null;
  pools: PlacementPool[];
  [extra: string]: unknown;
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

export interface Pool extends PoolRecord {
  capabilities: string[];
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

/** A stored backend secret: name and fingerprint, never the value (prose schema). */
export interface Secret {
  name: string;
  [extra: string]: unknown;
}

/** One audit record (prose schema; fields as served). */
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
  detail: unknown;
  prevHash: string;
  hash: string;
  keyId: string;
  [extra: string]: unknown;
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

/** `GET /v1/admin/audit/verify` (prose schema; fields as served). */
export interface Verification {
  ok: boolean;
  chains: number;
  records: number;
  checkpoints: number;
  firstBad: unknown;
  problems: unknown[];
  [extra: string]: unknown;
}

/** `GET /v1/admin/trust-report` (prose schema; fields as served). */
export interface TrustReport {
  generatedAt: string;
  installationId: string;
  pools: Array<Record<string, unknown>>;
  [extra: string]: unknown;
}

export interface Health {
  status: string;
}
