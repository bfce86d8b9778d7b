/**
 * Every operation the SDK calls, by the OpenAPI `operationId`, with its method and path template.
 *
 * The one place paths are spelled: the OpenAPI test checks each entry against the served
 * document (and lists served operations missing here), so a moved route fails a test.
 */
export const ROUTES = {
  health: { method: "GET", path: "/healthz" },
  ready: { method: "GET", path: "/readyz" },
  checkpointAudit: { method: "POST", path: "/v1/admin/audit/checkpoints" },
  exportAudit: { method: "GET", path: "/v1/admin/audit/export" },
  segmentAudit: { method: "POST", path: "/v1/admin/audit/segments" },
  verifyAudit: { method: "GET", path: "/v1/admin/audit/verify" },
  metricsSummary: { method: "GET", path: "/v1/admin/metrics/summary" },
  getGlobalPolicy: { method: "GET", path: "/v1/admin/policies/global" },
  putGlobalPolicy: { method: "PUT", path: "/v1/admin/policies/global" },
  listPools: { method: "GET", path: "/v1/admin/pools" },
  createPool: { method: "POST", path: "/v1/admin/pools" },
  deletePool: { method: "DELETE", path: "/v1/admin/pools/{name}" },
  getPool: { method: "GET", path: "/v1/admin/pools/{name}" },
  updatePool: { method: "PATCH", path: "/v1/admin/pools/{name}" },
  getWarmClasses: { method: "GET", path: "/v1/admin/pools/{name}/warm" },
  putWarmClasses: { method: "PUT", path: "/v1/admin/pools/{name}/warm" },
  listSecrets: { method: "GET", path: "/v1/admin/secrets" },
  putSecret: { method: "PUT", path: "/v1/admin/secrets/{name}" },
  adminQueue: { method: "GET", path: "/v1/admin/queue" },
  trustReport: { method: "GET", path: "/v1/admin/trust-report" },
  listAudit: { method: "GET", path: "/v1/audit" },
  events: { method: "GET", path: "/v1/events" },
  createEventCredentials: { method: "POST", path: "/v1/events/credentials" },
  revokeEventCredentials: { method: "DELETE", path: "/v1/events/credentials/{id}" },
  listEventSchemas: { method: "GET", path: "/v1/events/schemas" },
  getEventSchema: { method: "GET", path: "/v1/events/schemas/{type}" },
  listKeys: { method: "GET", path: "/v1/keys" },
  createKey: { method: "POST", path: "/v1/keys" },
  revokeKey: { method: "DELETE", path: "/v1/keys/{id}" },
  getKey: { method: "GET", path: "/v1/keys/{id}" },
  openapi: { method: "GET", path: "/v1/openapi.json" },
  listOrgs: { method: "GET", path: "/v1/orgs" },
  createOrg: { method: "POST", path: "/v1/orgs" },
  deleteOrg: { method: "DELETE", path: "/v1/orgs/{id}" },
  getOrg: { method: "GET", path: "/v1/orgs/{id}" },
  updateOrg: { method: "PATCH", path: "/v1/orgs/{id}" },
  getOrgPolicy: { method: "GET", path: "/v1/orgs/{id}/policy" },
  putOrgPolicy: { method: "PUT", path: "/v1/orgs/{id}/policy" },
  getOrgQuota: { method: "GET", path: "/v1/orgs/{id}/quota" },
  putOrgQuota: { method: "PUT", path: "/v1/orgs/{id}/quota" },
  dryRunPlacement: { method: "POST", path: "/v1/placement/dry-run" },
  listProjects: { method: "GET", path: "/v1/projects" },
  createProject: { method: "POST", path: "/v1/projects" },
  deleteProject: { method: "DELETE", path: "/v1/projects/{id}" },
  getProject: { method: "GET", path: "/v1/projects/{id}" },
  updateProject: { method: "PATCH", path: "/v1/projects/{id}" },
  getProjectPolicy: { method: "GET", path: "/v1/projects/{id}/policy" },
  putProjectPolicy: { method: "PUT", path: "/v1/projects/{id}/policy" },
  getProjectQuota: { method: "GET", path: "/v1/projects/{id}/quota" },
  putProjectQuota: { method: "PUT", path: "/v1/projects/{id}/quota" },
  listSandboxes: { method: "GET", path: "/v1/sandboxes" },
  createSandbox: { method: "POST", path: "/v1/sandboxes" },
  deleteSandbox: { method: "DELETE", path: "/v1/sandboxes/{id}" },
  getSandbox: { method: "GET", path: "/v1/sandboxes/{id}" },
  updateSandbox: { method: "PATCH", path: "/v1/sandboxes/{id}" },
  exec: { method: "POST", path: "/v1/sandboxes/{id}/exec" },
  execStream: { method: "POST", path: "/v1/sandboxes/{id}/exec/stream" },
  deleteFile: { method: "DELETE", path: "/v1/sandboxes/{id}/files" },
  downloadFile: { method: "GET", path: "/v1/sandboxes/{id}/files" },
  uploadFile: { method: "PUT", path: "/v1/sandboxes/{id}/files" },
  makeDirectory: { method: "POST", path: "/v1/sandboxes/{id}/files/directories" },
  listFiles: { method: "GET", path: "/v1/sandboxes/{id}/files/list" },
  keepalive: { method: "POST", path: "/v1/sandboxes/{id}/keepalive" },
  openPty: { method: "GET", path: "/v1/sandboxes/{id}/pty" },
  pauseSandbox: { method: "POST", path: "/v1/sandboxes/{id}/pause" },
  listProcesses: { method: "GET", path: "/v1/sandboxes/{id}/processes" },
  startProcess: { method: "POST", path: "/v1/sandboxes/{id}/processes" },
  killProcess: { method: "DELETE", path: "/v1/sandboxes/{id}/processes/{pid}" },
  getProcess: { method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}" },
  processOutput: { method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}/output" },
  resizeProcess: { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/resize" },
  signalProcess: { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/signal" },
  closeProcessStdin: { method: "DELETE", path: "/v1/sandboxes/{id}/processes/{pid}/stdin" },
  writeProcessStdin: { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/stdin" },
  getPlacement: { method: "GET", path: "/v1/sandboxes/{id}/placement" },
  exposePort: { method: "POST", path: "/v1/sandboxes/{id}/ports" },
  resumeSandbox: { method: "POST", path: "/v1/sandboxes/{id}/resume" },
  listSandboxSnapshots: { method: "GET", path: "/v1/sandboxes/{id}/snapshots" },
  createSnapshot: { method: "POST", path: "/v1/sandboxes/{id}/snapshots" },
  startSandbox: { method: "POST", path: "/v1/sandboxes/{id}/start" },
  stopSandbox: { method: "POST", path: "/v1/sandboxes/{id}/stop" },
  waitSandbox: { method: "GET", path: "/v1/sandboxes/{id}/wait" },
  listSnapshots: { method: "GET", path: "/v1/snapshots" },
  deleteSnapshot: { method: "DELETE", path: "/v1/snapshots/{id}" },
  getSnapshot: { method: "GET", path: "/v1/snapshots/{id}" },
  listWebhooks: { method: "GET", path: "/v1/webhooks" },
  createWebhook: { method: "POST", path: "/v1/webhooks" },
  deleteWebhook: { method: "DELETE", path: "/v1/webhooks/{id}" },
  getWebhook: { method: "GET", path: "/v1/webhooks/{id}" },
  updateWebhook: { method: "PATCH", path: "/v1/webhooks/{id}" },
  listWebhookDeliveries: { method: "GET", path: "/v1/webhooks/{id}/deliveries" },
  redeliverWebhook: { method: "POST", path: "/v1/webhooks/{id}/deliveries/{deliveryId}/redeliver" },
  rotateWebhookSecret: { method: "POST", path: "/v1/webhooks/{id}/rotate-secret" },
} as const satisfies Record<string, { method: string; path: string }>;

export type OperationId = keyof typeof ROUTES;

/**
 * Creating POSTs that take an `Idempotency-Key`: the SDK sends a fresh one per call (or the
 * caller's), which makes retrying them safe, except for SHOWS_SECRET_ONCE.
 */
export const IDEMPOTENT_CREATES: ReadonlySet<OperationId> = new Set<OperationId>([
  "createSandbox",
  "createOrg",
  "createProject",
  "createSnapshot",
  "createPool",
  "createKey",
  "createWebhook",
]);

/**
 * Creates whose answer holds a secret shown only once: they get an `Idempotency-Key` but are
 * never retried, because a replay answers 409 (naming the id, never the secret), so a retry
 * after a lost answer would turn a success into an error that hides the secret for good.
 */
export const SHOWS_SECRET_ONCE: ReadonlySet<OperationId> = new Set<OperationId>(["createKey", "createWebhook"]);

/** Fills `{id}`/`{name}` in a template, each value percent-encoded. */
export function fillPath(template: string, params: Record<string, string>): string {
  return template.replace(/\{(\w+)\}/g, (_, name: string) => {
    const v = params[name];
    if (v === undefined || v === "") throw new TypeError(`missing path parameter ${name}`);
    return encodeURIComponent(v);
  });
}
