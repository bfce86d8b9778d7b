//! The route catalogue: every operation the API serves, with who may call it, what it
//! takes and what it answers.

use differently_core::tenancy::Scope;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// No key needed (health, readiness, this document).
    Public,
    /// A key with this scope; tenant-scoped (another organization's things are 404).
    Scope(Scope),
    /// A key with either scope.
    EitherScope(Scope, Scope),
    /// An admin key, or a key of the organization the route is about (its own org,
    /// projects and keys; reading its quotas and policies).
    OwnOrgOrAdmin,
    /// An admin key only.
    Admin,
}

/// A query parameter: name, JSON type, description.
pub(super) type Param = (&'static str, &'static str, &'static str);

/// What a route takes as its body.
#[derive(Debug, Clone, Copy)]
pub(super) enum Body {
    None,
    /// JSON matching the named component schema.
    Json(&'static str),
    /// Raw bytes (file upload).
    Bytes,
}

/// One successful answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Answer {
    /// JSON matching the named component schema.
    Json(u16, &'static str),
    /// No body.
    Empty(u16),
    /// A stream of events (and, for exec streams, binary frames when asked), described.
    Stream(&'static str),
    /// Raw bytes (file download), 206 for a range.
    Bytes,
    /// JSON lines (audit export).
    JsonLines,
    /// `101 Switching Protocols` to a WebSocket, described.
    Upgrade(&'static str),
}

/// One operation of the catalogue.
pub(super) struct Op {
    pub(super) method: &'static str,
    pub(super) path: &'static str,
    pub(super) id: &'static str,
    pub(super) tag: &'static str,
    pub(super) summary: &'static str,
    pub(super) access: Access,
    pub(super) query: &'static [Param],
    pub(super) body: Body,
    pub(super) answers: &'static [Answer],
    /// Errors beyond the ones every route of its kind can answer.
    pub(super) errors: &'static [u16],
    /// Honours `Idempotency-Key`.
    pub(super) idempotent: bool,
}

/// An operation with no query, no body, no answers yet.
fn op(
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    access: Access,
    summary: &'static str,
) -> Op {
    Op {
        method,
        path,
        id,
        tag,
        summary,
        access,
        query: &[],
        body: Body::None,
        answers: &[],
        errors: &[],
        idempotent: false,
    }
}

impl Op {
    fn query(mut self, query: &'static [Param]) -> Op {
        self.query = query;
        self
    }
    fn body(mut self, body: Body) -> Op {
        self.body = body;
        self
    }
    fn answers(mut self, answers: &'static [Answer]) -> Op {
        self.answers = answers;
        self
    }
    fn errors(mut self, errors: &'static [u16]) -> Op {
        self.errors = errors;
        self
    }
    fn idempotent(mut self) -> Op {
        self.idempotent = true;
        self
    }
}

const PAGE: [Param; 2] = [
    ("limit", "integer", "Items per page."),
    ("cursor", "string", "`nextCursor` of the previous page."),
];
const FILE_PATH: Param = (
    "path",
    "string",
    "Absolute path inside the sandbox, without `..`.",
);
const SANDBOX_LIST_QUERY: [Param; 5] = [
    ("status", "string", "Only sandboxes with this status."),
    (
        "label",
        "string",
        "`key=value`: only sandboxes carrying this label; repeat it for several (all must match).",
    ),
    ("projectId", "string", "Only sandboxes of this project."),
    PAGE[0],
    PAGE[1],
];
const TENANT_LIST_QUERY: [Param; 3] = [
    (
        "orgId",
        "string",
        "The organization (admin keys; default: the key's own).",
    ),
    PAGE[0],
    PAGE[1],
];
const SNAPSHOT_LIST_QUERY: [Param; 3] = [
    ("projectId", "string", "Only snapshots of this project."),
    PAGE[0],
    PAGE[1],
];
const WEBHOOK_LIST_QUERY: [Param; 3] = [
    ("projectId", "string", "Only webhooks of this project."),
    PAGE[0],
    PAGE[1],
];
const AUDIT_QUERY: [Param; 9] = [
    (
        "orgId",
        "string",
        "The organization's chains (admin keys; default: the key's own).",
    ),
    ("projectId", "string", "Only records of this project."),
    ("action", "string", "Only this action, e.g. `sandbox.exec`."),
    ("actor", "string", "Only records of this actor."),
    ("resource", "string", "Only records about this resource id."),
    (
        "since",
        "string",
        "RFC 3339: records at or after this time.",
    ),
    ("until", "string", "RFC 3339: records before this time."),
    PAGE[0],
    PAGE[1],
];
const LIFECYCLE_ANSWERS: [Answer; 2] = [Answer::Json(200, "Sandbox"), Answer::Json(202, "Sandbox")];
const DATA_PLANE_ERRORS: [u16; 3] = [409, 501, 503];
/// Exec: a data-plane call whose request can also be well-formed but unacceptable (422).
const EXEC_ERRORS: [u16; 4] = [409, 422, 501, 503];
const PROCESS_START_ERRORS: [u16; 5] = [409, 422, 429, 501, 503];

/// Query of `openPty`.
const PTY_QUERY: [Param; 6] = [
    ("cols", "integer", "Terminal columns, 1-1000 (default 80)."),
    ("rows", "integer", "Terminal rows, 1-1000 (default 24)."),
    (
        "command",
        "array",
        "The program and its arguments, one parameter each, in order (default `sh -l`).",
    ),
    (
        "env",
        "array",
        "`NAME=value`, repeated; added to the sandbox's environment.",
    ),
    (
        "cwd",
        "string",
        "Absolute working directory inside the sandbox.",
    ),
    (
        "session",
        "string",
        "Reattach to this session (alone: the session keeps its own parameters).",
    ),
];

/// Every route the API serves.
pub(super) fn catalogue() -> Vec<Op> {
    use Access::{Admin, EitherScope, OwnOrgOrAdmin, Public};
    use Answer::{Empty, Json};
    let read = Access::Scope(Scope::SandboxesRead);
    let write = Access::Scope(Scope::SandboxesWrite);
    let exec = Access::Scope(Scope::SandboxesExec);
    let exec_or_read = Access::EitherScope(Scope::SandboxesExec, Scope::SandboxesRead);
    let files_read = Access::Scope(Scope::FilesRead);
    let files_write = Access::Scope(Scope::FilesWrite);
    vec![
        op("post", "/v1/sandboxes", "createSandbox", "sandboxes", write,
            "Admit a sandbox: 202 `queued`, or `provisioning` when placed at once. Honours `Idempotency-Key`.")
            .body(Body::Json("CreateSandboxRequest"))
            .answers(&[Json(202, "Sandbox")])
            .errors(&[404, 409, 422, 503])
        .idempotent(),
        op("get", "/v1/sandboxes", "listSandboxes", "sandboxes", read,
            "List the sandboxes the key can see.")
            .query(&SANDBOX_LIST_QUERY)
            .answers(&[Json(200, "SandboxList")])
            .errors(&[404]),
        op("get", "/v1/sandboxes/{id}", "getSandbox", "sandboxes", read,
            "Read a sandbox.")
            .answers(&[Json(200, "Sandbox")]),
        op("patch", "/v1/sandboxes/{id}", "updateSandbox", "sandboxes", write,
            "Renew the TTL, replace labels, or set the idle timeout.")
            .body(Body::Json("UpdateSandboxRequest"))
            .answers(&[Json(200, "Sandbox")])
            .errors(&[409, 422]),
        op("delete", "/v1/sandboxes/{id}", "deleteSandbox", "sandboxes", write,
            "Delete a sandbox: 202 `terminating` (the backend instance is deleted by a worker), 200 if it had already ended.")
            .answers(&[Json(202, "Sandbox"), Json(200, "Sandbox")])
            .errors(&[409]),
        op("get", "/v1/sandboxes/{id}/wait", "waitSandbox", "sandboxes", read,
            "Answer once the sandbox has `status` (default `running`) or a final one, or at the timeout; read `status`.")
            .query(&[("status", "string", "The status to wait for (default `running`)."),
                     ("timeoutSeconds", "integer", "At most this long (default 30, at most 300).")])
            .answers(&[Json(200, "Sandbox")]),
        op("get", "/v1/sandboxes/{id}/placement", "getPlacement", "placement", read,
            "The stored placement explanation.")
            .answers(&[Json(200, "Placement")]),
        op("post", "/v1/placement/dry-run", "dryRunPlacement", "placement", read,
            "Decide a create body's placement without admitting it.")
            .body(Body::Json("CreateSandboxRequest"))
            .answers(&[Json(200, "DryRun")])
            .errors(&[404, 422]),
        op("post", "/v1/sandboxes/{id}/exec", "exec", "data plane", exec,
            "Run a command and answer its output (each stream keeps 1 MiB; exit code 124 on timeout).")
            .body(Body::Json("ExecRequest"))
            .answers(&[Json(200, "ExecResult")])
            .errors(&EXEC_ERRORS),
        op("post", "/v1/sandboxes/{id}/exec/stream", "execStream", "data plane", exec,
            "Run a command and stream its output.")
            .body(Body::Json("ExecRequest"))
            .answers(&[Answer::Stream("SSE `stdout`/`stderr`/`exit`/`error` events; with `Accept: application/vnd.differently.exec-stream`, binary frames (8-byte header: type, 3 zero bytes, u32 BE length; 1 stdout, 2 stderr, 3 exit JSON, 4 error JSON, 0 heartbeat).")])
            .errors(&EXEC_ERRORS),
        op("post", "/v1/sandboxes/{id}/processes", "startProcess", "data plane", exec,
            "Start a background process: it outlives this request and is attached to, fed stdin and signalled by pid (docs/processes.md).")
            .body(Body::Json("StartProcess"))
            .answers(&[Json(201, "Process")])
            .errors(&PROCESS_START_ERRORS),
        op("get", "/v1/sandboxes/{id}/processes", "listProcesses", "data plane", exec_or_read,
            "This sandbox's processes, running and recently ended, newest first.")
            .query(&[("status", "string", "Only processes in this state.")])
            .answers(&[Json(200, "ProcessList")])
            .errors(&[422, 503]),
        op("get", "/v1/sandboxes/{id}/processes/{pid}", "getProcess", "data plane", exec_or_read,
            "One process.")
            .answers(&[Json(200, "Process")])
            .errors(&[503]),
        op("delete", "/v1/sandboxes/{id}/processes/{pid}", "killProcess", "data plane", exec,
            "Kill a process (`KILL`); an ended one is fine.")
            .answers(&[Empty(204)])
            .errors(&[409, 503]),
        op("get", "/v1/sandboxes/{id}/processes/{pid}/output", "processOutput", "data plane", exec,
            "Attach to a process's output from byte offset `from` (clamped to the output kept; the response header `Differently-Output-From` says where it starts); closing the stream detaches.")
            .query(&[("from", "integer", "Byte offset of the whole output to start at (SSE events carry the offset after them as `id`)."),
                ("follow", "boolean", "Stream until the process ends (default); `false`: send what is kept now and close.")])
            .answers(&[Answer::Stream("SSE `stdout`/`stderr` (with `id:` byte offsets)/`exit`/`error` events; with `Accept: application/vnd.differently.exec-stream`, binary frames as exec/stream's.")])
            .errors(&[422, 503]),
        op("post", "/v1/sandboxes/{id}/processes/{pid}/stdin", "writeProcessStdin", "data plane", exec,
            "Write the raw request body (at most 1 MiB) to the process's stdin.")
            .body(Body::Bytes)
            .answers(&[Empty(204)])
            .errors(&[409, 413, 503]),
        op("delete", "/v1/sandboxes/{id}/processes/{pid}/stdin", "closeProcessStdin", "data plane", exec,
            "Close the process's stdin (end of input).")
            .answers(&[Empty(204)])
            .errors(&[409, 503]),
        op("post", "/v1/sandboxes/{id}/processes/{pid}/signal", "signalProcess", "data plane", exec,
            "Send a signal to the process.")
            .body(Body::Json("SignalProcess"))
            .answers(&[Empty(204)])
            .errors(&[409, 422, 503]),
        op("post", "/v1/sandboxes/{id}/processes/{pid}/resize", "resizeProcess", "data plane", exec,
            "Resize a terminal process's terminal.")
            .body(Body::Json("TerminalSize"))
            .answers(&[Empty(204)])
            .errors(&[409, 422, 503]),
        op("get", "/v1/sandboxes/{id}/pty", "openPty", "data plane", exec,
            "Open an interactive terminal (WebSocket; see docs/api.md, Terminal).")
            .query(&PTY_QUERY)
            .answers(&[Answer::Upgrade("WebSocket. Server first sends text `{\"type\":\"session\",\"id\",\"graceSeconds\"}`; binary frames are terminal bytes both ways; client text frames `{\"type\":\"resize\",\"cols\",\"rows\"}` and `{\"type\":\"signal\",\"signal\":\"INT|TERM|KILL|HUP\"}`; the server ends with text `{\"type\":\"exit\",\"exitCode\"}` or `{\"type\":\"error\",\"code\",\"message\"}` and a close (4001 when another connection took the session over).")])
            .errors(&DATA_PLANE_ERRORS),
        op("put", "/v1/sandboxes/{id}/files", "uploadFile", "data plane", files_write,
            "Write a file from the raw request body.")
            .query(&[FILE_PATH, ("mode", "string", "Octal permission bits, e.g. `644`.")])
            .body(Body::Bytes)
            .answers(&[Empty(204)])
            .errors(&[409, 413, 422, 501, 503]),
        op("get", "/v1/sandboxes/{id}/files", "downloadFile", "data plane", files_read,
            "Read a file; one `Range: bytes=…` is honoured (206).")
            .query(&[FILE_PATH])
            .answers(&[Answer::Bytes])
            .errors(&[409, 416, 422, 501, 503]),
        op("delete", "/v1/sandboxes/{id}/files", "deleteFile", "data plane", files_write,
            "Delete a file.")
            .query(&[FILE_PATH])
            .answers(&[Empty(204)])
            .errors(&[409, 422, 501, 503]),
        op("post", "/v1/sandboxes/{id}/files/directories", "makeDirectory", "data plane", files_write,
            "Make a directory and its missing parents (`mkdir -p`): 201 when made, 200 when one was already there.")
            .body(Body::Json("MakeDirectory"))
            .answers(&[Json(201, "Directory"), Json(200, "Directory")])
            .errors(&[409, 422, 501, 503]),
        op("get", "/v1/sandboxes/{id}/files/list", "listFiles", "data plane", files_read,
            "List a directory.")
            .query(&[FILE_PATH, ("depth", "integer", "Levels to descend (default 1).")])
            .answers(&[Json(200, "FileList")])
            .errors(&[409, 422, 501, 503]),
        op("post", "/v1/sandboxes/{id}/keepalive", "keepalive", "data plane", EitherScope(Scope::SandboxesExec, Scope::SandboxesWrite),
            "Count as activity (resets the idle clock).")
            .answers(&[Empty(204)])
            .errors(&[409, 503]),
        op("post", "/v1/sandboxes/{id}/pause", "pauseSandbox", "lifecycle", write,
            "Pause: 200 when done or already paused, 202 if still in progress.")
            .answers(&LIFECYCLE_ANSWERS)
            .errors(&DATA_PLANE_ERRORS),
        op("post", "/v1/sandboxes/{id}/resume", "resumeSandbox", "lifecycle", write,
            "Resume a paused sandbox.")
            .answers(&LIFECYCLE_ANSWERS)
            .errors(&DATA_PLANE_ERRORS),
        op("post", "/v1/sandboxes/{id}/stop", "stopSandbox", "lifecycle", write,
            "Stop (releases CPU and memory from the quota).")
            .answers(&LIFECYCLE_ANSWERS)
            .errors(&DATA_PLANE_ERRORS),
        op("post", "/v1/sandboxes/{id}/start", "startSandbox", "lifecycle", write,
            "Start a stopped sandbox; 429 `quota_exceeded` when its CPU or memory has no room.")
            .answers(&LIFECYCLE_ANSWERS)
            .errors(&DATA_PLANE_ERRORS),
        op("post", "/v1/sandboxes/{id}/ports", "exposePort", "lifecycle", write,
            "Expose a port of the sandbox at a URL.")
            .body(Body::Json("PortRequest"))
            .answers(&[Json(200, "PortAnswer"), Json(202, "PendingOperation")])
            .errors(&[409, 422, 501, 503]),
        op("post", "/v1/sandboxes/{id}/snapshots", "createSnapshot", "snapshots", write,
            "Snapshot a sandbox (202; waits up to 10 s for it to be ready).")
            .body(Body::Json("SnapshotRequest"))
            .answers(&[Json(202, "Snapshot")])
            .errors(&[409, 422, 501, 503])
        .idempotent(),
        op("get", "/v1/sandboxes/{id}/snapshots", "listSandboxSnapshots", "snapshots", read,
            "The sandbox's snapshots.")
            .query(&PAGE)
            .answers(&[Json(200, "SnapshotList")]),
        op("get", "/v1/snapshots", "listSnapshots", "snapshots", read,
            "Snapshots the key can see.")
            .query(&SNAPSHOT_LIST_QUERY)
            .answers(&[Json(200, "SnapshotList")])
            .errors(&[404]),
        op("get", "/v1/snapshots/{id}", "getSnapshot", "snapshots", read,
            "Read a snapshot.")
            .answers(&[Json(200, "Snapshot")]),
        op("delete", "/v1/snapshots/{id}", "deleteSnapshot", "snapshots", write,
            "Delete a snapshot: 204 when gone, 202 if still pending.")
            .answers(&[Empty(204), Json(202, "Snapshot")])
            .errors(&[409, 503]),
        op("get", "/v1/events", "events", "events", read,
            "Sandbox events as SSE (`id:` the stream sequence); resume with `Last-Event-ID`. `format=public`: `event:` the public type, `data:` a `PublicEvent`; `format=status` (default): `event: status` with a `StatusEvent`.")
            .query(&[("projectId", "string", "Only this project's sandboxes."),
                     ("sandboxId", "string", "Only this sandbox."),
                     ("after", "integer", "Resume after this sequence (as `Last-Event-ID`)."),
                     ("types", "string", "`format=public` only (400 otherwise): comma-separated types or prefixes (`sandbox.exec.*`)."),
                     ("format", "string", "`public` (the event contract) or `status` (the default, status changes only).")])
            .answers(&[Answer::Stream("SSE: `status` events carrying `StatusEvent`, or (`format=public`) one event per public type carrying `PublicEvent`.")])
            .errors(&[404]),
        op("post", "/v1/events/credentials", "createEventCredentials", "events", read,
            "NATS credentials for the key's org (or project) public events: subscribe to `subscribe`, replay from `stream` through consumers filtered inside it; the token is shown once. 501 without a NATS auth callout (`differently dev`).")
            .body(Body::Json("EventCredentialsRequest"))
            .answers(&[Json(201, "EventCredentials")])
            .errors(&[404, 422, 501, 503]),
        op("delete", "/v1/events/credentials/{id}", "revokeEventCredentials", "events", read,
            "Revoke event credentials: new connections are refused at once, open ones end within 5 minutes.")
            .answers(&[Empty(204)])
            .errors(&[404, 501, 503]),
        op("get", "/v1/events/schemas", "listEventSchemas", "events", read,
            "The JSON Schema of every public event type, and of their envelope.")
            .answers(&[Json(200, "EventSchemaList")]),
        op("get", "/v1/events/schemas/{type}", "getEventSchema", "events", read,
            "The JSON Schema of one public event type (e.g. `sandbox.status.changed`).")
            .answers(&[Json(200, "EventSchema")])
            .errors(&[404]),
        op("post", "/v1/orgs", "createOrg", "tenancy", Admin,
            "Create an organization.")
            .body(Body::Json("CreateOrgRequest"))
            .answers(&[Json(201, "Org")])
            .errors(&[409, 422])
        .idempotent(),
        op("get", "/v1/orgs", "listOrgs", "tenancy", OwnOrgOrAdmin,
            "List organizations (an org-bound key sees its own).")
            .query(&PAGE)
            .answers(&[Json(200, "OrgList")]),
        op("get", "/v1/orgs/{id}", "getOrg", "tenancy", OwnOrgOrAdmin,
            "Read an organization.")
            .answers(&[Json(200, "Org")]),
        op("patch", "/v1/orgs/{id}", "updateOrg", "tenancy", Admin,
            "Rename, suspend or reactivate an organization.")
            .body(Body::Json("UpdateOrgRequest"))
            .answers(&[Json(200, "Org")])
            .errors(&[409, 422]),
        op("delete", "/v1/orgs/{id}", "deleteOrg", "tenancy", Admin,
            "Delete an organization that has nothing left in it.")
            .answers(&[Empty(204)])
            .errors(&[409]),
        op("get", "/v1/orgs/{id}/quota", "getOrgQuota", "tenancy", OwnOrgOrAdmin,
            "The organization's quota and usage.")
            .answers(&[Json(200, "QuotaView")]),
        op("put", "/v1/orgs/{id}/quota", "putOrgQuota", "tenancy", Admin,
            "Replace the organization's quota.")
            .body(Body::Json("Quota"))
            .answers(&[Json(200, "QuotaView")])
            .errors(&[422]),
        op("post", "/v1/projects", "createProject", "tenancy", OwnOrgOrAdmin,
            "Create a project.")
            .body(Body::Json("CreateProjectRequest"))
            .answers(&[Json(201, "Project")])
            .errors(&[404, 409, 422])
        .idempotent(),
        op("get", "/v1/projects", "listProjects", "tenancy", OwnOrgOrAdmin,
            "List an organization's projects.")
            .query(&TENANT_LIST_QUERY)
            .answers(&[Json(200, "ProjectList")])
            .errors(&[404]),
        op("get", "/v1/projects/{id}", "getProject", "tenancy", OwnOrgOrAdmin,
            "Read a project.")
            .answers(&[Json(200, "Project")]),
        op("patch", "/v1/projects/{id}", "updateProject", "tenancy", OwnOrgOrAdmin,
            "Rename a project.")
            .body(Body::Json("UpdateProjectRequest"))
            .answers(&[Json(200, "Project")])
            .errors(&[409, 422]),
        op("delete", "/v1/projects/{id}", "deleteProject", "tenancy", OwnOrgOrAdmin,
            "Delete a project that has nothing left in it.")
            .answers(&[Empty(204)])
            .errors(&[409]),
        op("get", "/v1/projects/{id}/quota", "getProjectQuota", "tenancy", OwnOrgOrAdmin,
            "The project's quota and usage.")
            .answers(&[Json(200, "QuotaView")]),
        op("put", "/v1/projects/{id}/quota", "putProjectQuota", "tenancy", Admin,
            "Replace the project's quota (within its organization's).")
            .body(Body::Json("Quota"))
            .answers(&[Json(200, "QuotaView")])
            .errors(&[422]),
        op("post", "/v1/keys", "createKey", "tenancy", OwnOrgOrAdmin,
            "Create an API key; the answer is the only time its secret is shown.")
            .body(Body::Json("CreateKeyRequest"))
            .answers(&[Json(201, "CreatedKey")])
            .errors(&[404, 409, 422])
        .idempotent(),
        op("get", "/v1/keys", "listKeys", "tenancy", OwnOrgOrAdmin,
            "List an organization's keys (never secrets or hashes).")
            .query(&TENANT_LIST_QUERY)
            .answers(&[Json(200, "KeyList")])
            .errors(&[404]),
        op("get", "/v1/keys/{id}", "getKey", "tenancy", OwnOrgOrAdmin,
            "Read a key's record.")
            .answers(&[Json(200, "Key")]),
        op("delete", "/v1/keys/{id}", "revokeKey", "tenancy", OwnOrgOrAdmin,
            "Revoke a key; answers its record with `revokedAt`.")
            .answers(&[Json(200, "Key")]),
        op("get", "/v1/admin/policies/global", "getGlobalPolicy", "policy", Admin,
            "The installation's placement policy.")
            .answers(&[Json(200, "Policy")]),
        op("put", "/v1/admin/policies/global", "putGlobalPolicy", "policy", Admin,
            "Replace the installation's placement policy.")
            .body(Body::Json("Policy"))
            .answers(&[Json(200, "Policy")])
            .errors(&[422]),
        op("get", "/v1/orgs/{id}/policy", "getOrgPolicy", "policy", OwnOrgOrAdmin,
            "The organization's placement policy.")
            .answers(&[Json(200, "Policy")]),
        op("put", "/v1/orgs/{id}/policy", "putOrgPolicy", "policy", Admin,
            "Replace the organization's placement policy (it can only narrow the global one).")
            .body(Body::Json("Policy"))
            .answers(&[Json(200, "Policy")])
            .errors(&[422]),
        op("get", "/v1/projects/{id}/policy", "getProjectPolicy", "policy", OwnOrgOrAdmin,
            "The project's placement policy.")
            .answers(&[Json(200, "Policy")]),
        op("put", "/v1/projects/{id}/policy", "putProjectPolicy", "policy", Admin,
            "Replace the project's placement policy (it can only narrow its organization's).")
            .body(Body::Json("Policy"))
            .answers(&[Json(200, "Policy")])
            .errors(&[422]),
        op("post", "/v1/admin/pools", "createPool", "pools", Admin,
            "Register a pool (backend type, endpoint, credentials reference, capabilities).")
            .body(Body::Json("PoolRequest"))
            .answers(&[Json(201, "PoolRecord")])
            .errors(&[409, 422])
        .idempotent(),
        op("get", "/v1/admin/pools", "listPools", "pools", Admin,
            "Pools with health, capabilities and source, by name.")
            .query(&PAGE)
            .answers(&[Json(200, "PoolList")]),
        op("get", "/v1/admin/pools/{name}", "getPool", "pools", Admin,
            "Read a pool.")
            .answers(&[Json(200, "Pool")]),
        op("patch", "/v1/admin/pools/{name}", "updatePool", "pools", Admin,
            "Change a pool.")
            .body(Body::Json("PoolRequest"))
            .answers(&[Json(200, "PoolRecord")])
            .errors(&[409, 422]),
        op("delete", "/v1/admin/pools/{name}", "deletePool", "pools", Admin,
            "Remove a pool that runs nothing.")
            .answers(&[Empty(204)])
            .errors(&[409]),
        op("get", "/v1/admin/pools/{name}/warm", "getWarmClasses", "pools", Admin,
            "The pool's warm classes, each with its ready and creating instances.")
            .answers(&[Json(200, "WarmClasses")]),
        op("put", "/v1/admin/pools/{name}/warm", "putWarmClasses", "pools", Admin,
            "Replace the pool's warm classes (audited as `pool.warm.set`). Instances of removed \
            or shrunk classes are retired by the scheduler.")
            .body(Body::Json("WarmClassesRequest"))
            .answers(&[Json(200, "WarmClasses")])
            .errors(&[422]),
        op("get", "/v1/audit", "listAudit", "audit", read,
            "Audit records of the key's organization (any, for admin keys).")
            .query(&AUDIT_QUERY)
            .answers(&[Json(200, "AuditList")])
            .errors(&[404]),
        op("get", "/v1/admin/audit/verify", "verifyAudit", "audit", Admin,
            "Verify every audit chain against its hashes and checkpoints.")
            .answers(&[Json(200, "Verification")]),
        op("get", "/v1/admin/audit/export", "exportAudit", "audit", Admin,
            "Every audit record as JSON lines.")
            .answers(&[Answer::JsonLines]),
        op("post", "/v1/admin/audit/checkpoints", "checkpointAudit", "audit", Admin,
            "Sign every audit chain's head now (204 when nothing changed since the last checkpoint).")
            .answers(&[Json(201, "Checkpoint"), Empty(204)]),
        op("post", "/v1/admin/audit/segments", "segmentAudit", "audit", Admin,
            "After a lost audit key: sign every chain's head with the current key as a checkpoint \
            that starts a new segment. Earlier records keep their links checked and are counted \
            as unverifiable; nothing is rewritten. 409 when every signature already verifies.")
            .body(Body::Json("AuditSegmentRequest"))
            .answers(&[Json(201, "AuditSegment")])
            .errors(&[409, 422]),
        op("get", "/v1/admin/secrets", "listSecrets", "operators", Admin,
            "Stored backend secrets, as names and fingerprints only.")
            .answers(&[Json(200, "SecretList")]),
        op("put", "/v1/admin/secrets/{name}", "putSecret", "operators", Admin,
            "Store or replace a backend secret (never served back).")
            .body(Body::Json("SecretRequest"))
            .answers(&[Json(200, "Secret")])
            .errors(&[409, 422]),
        op("get", "/v1/admin/trust-report", "trustReport", "operators", Admin,
            "Where work may go and why, per pool and per organization.")
            .answers(&[Json(200, "TrustReport")]),
        op("get", "/v1/admin/queue", "adminQueue", "operators", Admin,
            "The fair queue per organization: depth, oldest, and the wall each waits behind.")
            .answers(&[Json(200, "QueueReport")]),
        op("get", "/v1/admin/metrics/summary", "metricsSummary", "operators", Admin,
            "This process's admission, activation and queue-depth counters, as JSON.")
            .answers(&[Json(200, "MetricsSummary")]),
        op("post", "/v1/webhooks", "createWebhook", "webhooks", write,
            "Create a project's webhook; the answer is the only time its signing secret is shown.")
            .body(Body::Json("CreateWebhookRequest"))
            .answers(&[Json(201, "WebhookWithSecret")])
            .errors(&[404, 409, 422])
        .idempotent(),
        op("get", "/v1/webhooks", "listWebhooks", "webhooks", read,
            "The webhooks of the key's organization (of its project, for a project-bound key).")
            .query(&WEBHOOK_LIST_QUERY)
            .answers(&[Json(200, "WebhookList")]),
        op("get", "/v1/webhooks/{id}", "getWebhook", "webhooks", read,
            "Read a webhook (never its secret).")
            .answers(&[Json(200, "Webhook")]),
        op("patch", "/v1/webhooks/{id}", "updateWebhook", "webhooks", write,
            "Change a webhook's URL, filter or description, or disable and re-enable it.")
            .body(Body::Json("UpdateWebhookRequest"))
            .answers(&[Json(200, "Webhook")])
            .errors(&[422]),
        op("delete", "/v1/webhooks/{id}", "deleteWebhook", "webhooks", write,
            "Delete a webhook and its delivery log.")
            .answers(&[Empty(204)]),
        op("post", "/v1/webhooks/{id}/rotate-secret", "rotateWebhookSecret", "webhooks", write,
            "A new signing secret, shown once; the replaced one keeps signing next to it for the \
            configured overlap.")
            .answers(&[Json(200, "WebhookWithSecret")])
            .errors(&[409]),
        op("get", "/v1/webhooks/{id}/deliveries", "listWebhookDeliveries", "webhooks", read,
            "The webhook's delivery log, newest first.")
            .query(&PAGE)
            .answers(&[Json(200, "WebhookDeliveryList")]),
        op("post", "/v1/webhooks/{id}/deliveries/{deliveryId}/redeliver", "redeliverWebhook",
            "webhooks", write,
            "Send a delivery again now, with the same `webhook-id`.")
            .answers(&[Json(202, "WebhookDelivery")]),
        op("get", "/healthz", "health", "health", Public,
            "The process is up.")
            .answers(&[Json(200, "Health")]),
        op("get", "/readyz", "ready", "health", Public,
            "The store answers (503 while it does not).")
            .answers(&[Json(200, "Health")])
            .errors(&[503]),
        op("get", "/v1/openapi.json", "openapi", "health", Public,
            "This document.")
            .answers(&[Json(200, "OpenApi")]),

    ]
}
