/**
 * Wire types of the `/v1` API (JSON, camelCase), as `GET /v1/openapi.json` describes them.
 *
 * The types are generated from the OpenAPI document (`docs/openapi.json`, itself generated from
 * the server's Rust types) into `generated/models.ts` by `scripts/gen-sdk-models`, with a field
 * manifest (`generated/manifest.ts`) that the compiler holds to each type and a test holds to the
 * served document. This module re-exports them and adds what a generator cannot: pages, list
 * filters, former names, and the public events typed by their `type`.
 */
import type { EventCause, PoolVerdict, PublicEventType, SandboxStatus } from "./generated/models.js";
import { PUBLIC_EVENT_TYPES } from "./generated/models.js";

export * from "./generated/models.js";

/** Statuses a sandbox never leaves. */
export const FINAL_STATUSES: readonly SandboxStatus[] = ["terminated", "failed"];

/** One page of a list: `{items, nextCursor}`; `nextCursor` null on the last page. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
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

/** The former name of PoolVerdict. */
export type PlacementPool = PoolVerdict;

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
