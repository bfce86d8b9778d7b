"""Typed models of what the ``/v1`` API serves and accepts.

Answers are frozen dataclasses with snake_case attributes; each keeps the whole JSON object it
came from in ``raw`` (so a field a newer server adds is reachable before the SDK knows it).
Requests are dataclasses whose fields default to :data:`UNSET` (not sent). The served OpenAPI
document is checked against these definitions by ``tests/test_openapi_drift.py``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Generic, List, Literal, Optional, TypeVar, Union

from ._codec import UNSET, Unset, json_name

T = TypeVar("T")

SandboxStatus = Literal[
    "queued", "provisioning", "running", "paused", "stopped", "terminating", "terminated", "failed"
]
SnapshotStatus = Literal["creating", "ready", "failed", "deleting"]
OrgStatus = Literal["active", "suspended"]
Scope = Literal[
    "sandboxes:read", "sandboxes:write", "sandboxes:exec", "files:read", "files:write", "admin"
]
Capability = Literal[
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
]
Classification = Literal["public", "internal", "confidential", "restricted"]
Strategy = Literal["private-first", "cheapest", "fastest", "least-loaded"]
ExternalMode = Literal["never", "allowed", "required"]
Profile = Literal["small", "medium", "large", "xlarge"]
Trust = Literal["private", "external"]
Isolation = Literal["container", "microvm"]
#: How far a pool's adapter is verified against its backend (``Pool.verified``).
Verified = Literal["live", "replayed", "fake-only", "unknown"]

#: Statuses a sandbox never leaves.
FINAL_STATUSES = frozenset({"terminated", "failed"})


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items and the cursor of the next page (``None`` at the end)."""

    items: List[T]
    next_cursor: Optional[str]


# --- sandboxes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """A sandbox's size."""

    cpu: int
    memory_mib: int = field(metadata=json_name("memoryMiB"))
    disk_gib: int = field(metadata=json_name("diskGiB"))
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Sandbox:
    """A sandbox as the API serves it (env values are never served: ``env_keys`` only)."""

    id: str
    org_id: str
    project_id: str
    status: SandboxStatus
    status_reason: Optional[str]
    pool: Optional[str]
    resources: Resources
    capabilities: List[str]
    classification: str
    region: Optional[str]
    labels: Dict[str, str]
    template: Optional[str]
    env_keys: List[str]
    ttl_seconds: int
    idle_timeout_seconds: Optional[int]
    priority: int
    attempts: int
    created_at: _dt.datetime
    started_at: Optional[_dt.datetime]
    expires_at: Optional[_dt.datetime]
    ended_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = _raw()


@dataclass
class ResourcesSpec:
    """Requested size; an unset part gets the default."""

    cpu: Union[int, None, Unset] = UNSET
    memory_mib: Union[int, None, Unset] = field(default=UNSET, metadata=json_name("memoryMiB"))
    disk_gib: Union[int, None, Unset] = field(default=UNSET, metadata=json_name("diskGiB"))


@dataclass
class CreateSandboxRequest:
    """The body of ``POST /v1/sandboxes`` and ``POST /v1/placement/dry-run``."""

    project_id: Union[str, None, Unset] = UNSET
    template: Union[str, None, Unset] = UNSET
    resources: Union[ResourcesSpec, None, Unset] = UNSET
    profile: Union[Profile, None, Unset] = UNSET
    env: Union[Dict[str, str], None, Unset] = UNSET
    labels: Union[Dict[str, str], None, Unset] = UNSET
    ttl_seconds: Union[int, None, Unset] = UNSET
    idle_timeout_seconds: Union[int, None, Unset] = UNSET
    capabilities: Union[List[Capability], None, Unset] = UNSET
    classification: Union[Classification, None, Unset] = UNSET
    region: Union[str, None, Unset] = UNSET
    strategy: Union[Strategy, None, Unset] = UNSET
    external: Union[ExternalMode, None, Unset] = UNSET
    priority: Union[int, None, Unset] = UNSET
    from_snapshot: Union[str, None, Unset] = UNSET


@dataclass
class UpdateSandboxRequest:
    """The body of ``PATCH /v1/sandboxes/{id}``: ``idle_timeout_seconds=None`` clears it."""

    ttl_seconds: Union[int, None, Unset] = UNSET
    idle_timeout_seconds: Union[int, None, Unset] = UNSET
    labels: Union[Dict[str, str], None, Unset] = UNSET


@dataclass
class ExecRequest:
    """The body of ``POST …/exec`` and ``…/exec/stream``."""

    command: List[str]
    env: Union[Dict[str, str], Unset] = UNSET
    cwd: Union[str, None, Unset] = UNSET
    stdin: Union[str, None, Unset] = UNSET
    stdin_base64: Union[str, None, Unset] = UNSET
    timeout_seconds: Union[int, None, Unset] = UNSET
    output_encoding: Union[Literal["utf8", "base64"], None, Unset] = UNSET


@dataclass(frozen=True)
class ExecResult:
    """A buffered exec's outcome (each stream keeps 1 MiB; ``*_truncated`` says if cut)."""

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class ExecStdout:
    """A chunk of the command's standard output, as the server delivered it."""

    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ExecStderr:
    """A chunk of the command's standard error."""

    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ExecExit:
    """The last event of a streamed exec (exit code 124 on timeout)."""

    exit_code: int
    duration_ms: int
    raw: Dict[str, Any] = _raw()


ExecEvent = Union[ExecStdout, ExecStderr, ExecExit]


@dataclass(frozen=True)
class FileInfo:
    """An entry of ``GET …/files/list``."""

    path: str
    type: str
    size: int
    mode: int
    modified_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Snapshot:
    """A snapshot; fork or restore with ``sandboxes.create(from_snapshot=snapshot.id)``."""

    id: str
    org_id: str
    project_id: str
    sandbox_id: str
    pool: str
    name: Optional[str]
    status: SnapshotStatus
    status_reason: Optional[str]
    created_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass
class SnapshotRequest:
    name: Union[str, None, Unset] = UNSET


@dataclass
class PortRequest:
    port: int
    expires_seconds: Union[int, None, Unset] = UNSET


@dataclass(frozen=True)
class ExposedPort:
    """``POST …/ports`` when done: the URL reaching the port."""

    url: str
    expires_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class PendingOperation:
    """A 202 for work still in progress at the server's bound (it completes anyway)."""

    operation: str
    status: str
    raw: Dict[str, Any] = _raw()


# --- placement ------------------------------------------------------------------------------

Decision = Literal["placed", "waiting", "rejected"]


@dataclass(frozen=True)
class PoolVerdict:
    """One pool considered by a placement, and why it was or was not eligible."""

    name: str
    eligible: bool
    reason: Optional[str]
    score: Optional[float]
    raw: Dict[str, Any] = _raw()


#: The name this model had before the document typed it (``PoolVerdict`` there).
PoolCandidate = PoolVerdict


@dataclass(frozen=True)
class EffectivePolicy:
    """The placement policy merged over its levels, as a placement applied it.
    ``external_forbidden_by`` names the level that forbids external pools (``None``: none)."""

    allowed_classifications: Optional[List[str]]
    pool_classifications: Dict[str, List[str]]
    allowed_regions: Optional[List[str]]
    external_forbidden_by: Optional[Literal["global", "org", "project"]]
    external_pools: List[str]
    denied_pools: List[str]
    default_strategy: Strategy
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Placement:
    """``GET …/placement``: ``decision`` ``placed`` (with ``pool``) or ``waiting`` (with
    ``reason``), the pools considered and the policy applied."""

    decision: Decision
    pool: Optional[str]
    code: Optional[str]
    reason: Optional[str]
    decided_at: _dt.datetime
    pools: List[PoolVerdict]
    policy: EffectivePolicy
    #: What a waiting sandbox waits behind: its org's or project's quota, or a pool's cap.
    wall: Optional[Literal["org", "project", "pool"]]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class DryRun:
    """``POST /v1/placement/dry-run``: ``placed`` | ``waiting`` | ``rejected``."""

    decision: Decision
    pool: Optional[str]
    code: Optional[str]
    reason: Optional[str]
    pools: List[PoolVerdict]
    raw: Dict[str, Any] = _raw()


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusEvent:
    """A sandbox status change from ``GET /v1/events``; ``seq`` is its SSE ``id:`` (resume
    after it with ``after=seq``)."""

    seq: int = field(metadata={"local": True})
    sandbox_id: str
    org_id: str
    project_id: str
    status: SandboxStatus
    status_reason: Optional[str]
    pool: Optional[str]
    status_version: int
    at: _dt.datetime
    raw: Dict[str, Any] = _raw()


# --- tenancy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Org:
    id: str
    name: str
    status: OrgStatus
    created_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass
class CreateOrgRequest:
    name: str


@dataclass
class UpdateOrgRequest:
    name: Union[str, Unset] = UNSET
    status: Union[OrgStatus, Unset] = UNSET


@dataclass(frozen=True)
class Project:
    id: str
    org_id: str
    name: str
    created_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass
class CreateProjectRequest:
    name: str
    org_id: Union[str, Unset] = UNSET


@dataclass
class UpdateProjectRequest:
    name: str


@dataclass(frozen=True)
class Key:
    """An API key's record (never its secret or hash)."""

    id: str
    org_id: str
    project_id: Optional[str]
    name: str
    scopes: List[Scope]
    created_at: _dt.datetime
    expires_at: Optional[_dt.datetime]
    revoked_at: Optional[_dt.datetime]
    last_used_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class CreatedKey:
    """A new key, with its secret ``key`` shown this once (kept out of ``repr``)."""

    id: str
    org_id: str
    project_id: Optional[str]
    name: str
    scopes: List[Scope]
    created_at: _dt.datetime
    expires_at: Optional[_dt.datetime]
    revoked_at: Optional[_dt.datetime]
    last_used_at: Optional[_dt.datetime]
    key: str = field(repr=False)
    raw: Dict[str, Any] = _raw()


@dataclass
class CreateKeyRequest:
    name: str
    scopes: List[Scope]
    org_id: Union[str, Unset] = UNSET
    project_id: Union[str, Unset] = UNSET
    expires_at: Union[_dt.datetime, None, Unset] = UNSET


@dataclass
class SandboxLimit:
    """The largest single sandbox a quota allows."""

    cpu: int
    memory_mib: int = field(metadata=json_name("memoryMiB"))
    disk_gib: int = field(metadata=json_name("diskGiB"))


@dataclass
class Quota:
    """A quota at one level; ``None`` is no limit at this level. Sent whole by ``PUT``."""

    max_active: Optional[int] = None
    max_cpu: Optional[int] = None
    max_memory_mib: Optional[int] = field(default=None, metadata=json_name("maxMemoryMiB"))
    max_disk_gib: Optional[int] = field(default=None, metadata=json_name("maxDiskGiB"))
    max_queued: Optional[int] = None
    max_queue_seconds: Optional[int] = None
    max_sandbox: Optional[SandboxLimit] = None


@dataclass(frozen=True)
class QuotaView:
    """``GET …/quota``: the level's own quota, the effective (merged) one, and the usage now."""

    quota: Quota
    effective: Quota
    usage: Dict[str, Any]
    raw: Dict[str, Any] = _raw()


@dataclass
class Policy:
    """A placement policy at one level (docs/placement.md); ``None`` does not restrict."""

    _omit_none: ClassVar[bool] = True

    allow_external: Optional[bool] = None
    allowed_classifications: Optional[List[Classification]] = None
    allowed_regions: Optional[List[str]] = None
    default_strategy: Optional[Strategy] = None
    denied_pools: Optional[List[str]] = None
    external_pools: Optional[List[str]] = None
    pool_classifications: Optional[Dict[str, List[Classification]]] = None


# --- pools, audit, trust --------------------------------------------------------------------


@dataclass(frozen=True)
class PoolHealth:
    name: str
    healthy: bool
    capabilities: List[str]
    error: Optional[str]
    checked_at: _dt.datetime
    checked_by: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Pool:
    """A pool with its health (``GET /v1/admin/pools``)."""

    name: str
    kind: str
    trust: Trust
    region: Optional[str]
    max_concurrent: Optional[int]
    isolation: Optional[Isolation]
    cost_per_cpu_hour: float
    typical_create_seconds: Optional[float]
    settings: Any
    source: str
    created_at: _dt.datetime
    updated_at: _dt.datetime
    capabilities: List[str]
    #: As the API process's adapter last detected it; ``None`` before its first call.
    backend_version: Optional[str]
    verified: Verified
    verified_basis: str
    healthy: bool
    health: Optional[PoolHealth]
    used_slots: int
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class PoolRecord:
    """A pool's stored record (create/update answers)."""

    name: str
    kind: str
    trust: Trust
    region: Optional[str]
    max_concurrent: Optional[int]
    isolation: Optional[Isolation]
    cost_per_cpu_hour: float
    typical_create_seconds: Optional[float]
    settings: Any
    source: str
    created_at: _dt.datetime
    updated_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass
class PoolRequest:
    """Create (``name`` and ``kind`` required) or patch a pool."""

    name: Union[str, None, Unset] = UNSET
    kind: Union[str, None, Unset] = UNSET
    trust: Union[Trust, None, Unset] = UNSET
    region: Union[str, None, Unset] = UNSET
    max_concurrent: Union[int, None, Unset] = UNSET
    isolation: Union[Isolation, None, Unset] = UNSET
    cost_per_cpu_hour: Union[float, None, Unset] = UNSET
    typical_create_seconds: Union[float, None, Unset] = UNSET
    settings: Union[Dict[str, Any], Unset] = UNSET


@dataclass
class WarmResources:
    """A warm class's resources, all three given (a class fixes them whole)."""

    cpu: int
    memory_mib: int = field(metadata=json_name("memoryMiB"))
    disk_gib: int = field(metadata=json_name("diskGiB"))


@dataclass
class WarmClass:
    """One warm class of a pool (``pools.set_warm``): instances kept ready so that a create
    asking for the same ``template`` and ``resources`` is answered from one. Unset fields take
    the server's defaults (``max_size``: ``size``; ``max_age_seconds``: 3600; ``template``:
    the pool's default; ``resources``: a create's defaults)."""

    name: str
    size: int
    refill_per_second: float
    max_size: Union[int, None, Unset] = UNSET
    max_age_seconds: Union[int, Unset] = UNSET
    template: Union[str, None, Unset] = UNSET
    resources: Union[WarmResources, None, Unset] = UNSET


@dataclass(frozen=True)
class WarmClassStatus:
    """A pool's warm class as served: the class and its instances being created and ready."""

    name: str
    size: int
    max_size: Optional[int]
    refill_per_second: float
    max_age_seconds: int
    template: Optional[str]
    resources: Optional[Resources]
    ready: int
    creating: int
    claims_per_minute: float
    hit_ratio: Optional[float]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class WarmClasses:
    """``GET /v1/admin/pools/{name}/warm``: the pool's warm classes in matching order."""

    classes: List[WarmClassStatus]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class AuditEvent:
    """One audit record (``GET /v1/audit``); ``key_id`` is the signing key of its segment."""

    seq: int
    chain: str
    chain_seq: int
    org_id: Optional[str]
    project_id: Optional[str]
    actor: str
    action: str
    resource: str
    outcome: str
    request_id: Optional[str]
    at: _dt.datetime
    detail: Any
    prev_hash: str
    hash: str
    key_id: Optional[str]
    raw: Dict[str, Any] = _raw()


AuditProblemKind = Literal[
    "hash_mismatch",
    "broken_link",
    "missing",
    "duplicate",
    "checkpoint_mismatch",
    "truncated",
    "bad_checkpoint",
    "unknown_key",
]


@dataclass(frozen=True)
class AuditProblem:
    """One thing a verification found wrong (``seq`` ``None``: not one record's)."""

    kind: AuditProblemKind
    chain: str
    chain_seq: int
    seq: Optional[int]
    message: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class VerifiedSegment:
    """A segment boundary a verification crossed (records signed with a lost key before it)."""

    seq: int
    at: _dt.datetime
    key_id: Optional[str]
    reason: str
    lost_key_ids: List[str]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Verification:
    """``GET /v1/admin/audit/verify``: ``ok`` when every chain holds."""

    ok: bool
    chains: int
    records: int
    checkpoints: int
    unchained_records: int
    first_bad: Optional[AuditProblem]
    problems: List[AuditProblem]
    unverifiable_records: int
    unverifiable_checkpoints: int
    unknown_key_ids: List[str]
    segments: List[VerifiedSegment]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class ChainHead:
    """A chain's last record as a checkpoint signed it."""

    chain: str
    chain_seq: int
    hash: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class CheckpointSegment:
    """Set on the checkpoint that starts a segment: why, and which keys were lost."""

    reason: str
    lost_key_ids: List[str]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Checkpoint:
    """A signed checkpoint of every chain head (``POST /v1/admin/audit/checkpoints``)."""

    seq: int
    at: _dt.datetime
    heads: List[ChainHead]
    prev_hash: str
    hash: str
    key_id: Optional[str]
    segment: Optional[CheckpointSegment]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class AuditSegment:
    """``POST /v1/admin/audit/segments``: the checkpoint starting the segment, and the
    verification made before it."""

    checkpoint: Checkpoint
    report: Verification
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class TrustCredential:
    """A credential a pool's settings refer to: where it comes from, never its value."""

    kind: Literal["env", "file", "secret", "inline"]
    setting: str
    reference: str
    name: Optional[str]
    fingerprint: Optional[str]
    updated_by: Optional[str]
    updated_at: Optional[_dt.datetime]
    problem: Optional[str]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class TrustPool:
    """A pool in the trust report: its trust, isolation, egress, endpoint and credentials."""

    name: str
    kind: str
    trust: Trust
    region: Optional[str]
    isolation: str
    egress: str
    endpoint: Optional[str]
    credentials: List[TrustCredential]
    source: Literal["config", "api"]
    healthy: bool
    health: Optional[PoolHealth]
    warm: List[WarmClassStatus]
    backend_version: Optional[str]
    verified: Verified
    verified_basis: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class ExternalPlacement:
    """An organization's sandboxes placed on an external pool, and the policy that allowed it."""

    org_id: str
    org_name: Optional[str]
    pool: str
    sandboxes: int
    first_at: _dt.datetime
    last_at: _dt.datetime
    policy: Optional[EffectivePolicy]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class TrustReport:
    """``GET /v1/admin/trust-report``: per pool and organization, where work may go."""

    generated_at: _dt.datetime
    installation_id: str
    telemetry: str
    pools: List[TrustPool]
    external_placements: List[ExternalPlacement]
    not_enforced: List[str]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Health:
    status: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class Secret:
    """A stored backend secret: its name and fingerprint, never the value."""

    name: str
    fingerprint: str
    updated_by: str
    updated_at: _dt.datetime
    created_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass
class SecretRequest:
    value: str = field(repr=False)


@dataclass
class AuditSegmentRequest:
    reason: str


# --- operators' summaries -------------------------------------------------------------------


@dataclass(frozen=True)
class MetricsSummary:
    """``GET /v1/admin/metrics/summary``: this API process's counters as JSON (the
    dashboard's charts). ``enabled`` is ``False``, and the maps empty, when the process keeps
    no metrics; the counters belong to the one process that answered, not the installation."""

    generated_at: _dt.datetime
    enabled: bool
    #: ``differently_admissions_total`` by outcome.
    admissions: Dict[str, float]
    #: ``differently_activations_total`` by pool.
    activations: Dict[str, float]
    #: ``differently_queue_depth`` by organization.
    queue_depth: Dict[str, float]
    raw: Dict[str, Any] = _raw()


QueueWall = Literal["org", "project", "pool", "unknown"]


@dataclass(frozen=True)
class QueueReason:
    """How many of an organization's queued sandboxes wait for one stated reason."""

    reason: str
    count: int
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class QueueOrg:
    """One organization in the fair queue: how deep, since when, and behind which walls."""

    org_id: str
    org_name: Optional[str]
    depth: int
    oldest_queued_at: _dt.datetime
    oldest_sandbox_id: str
    #: Queued sandboxes per wall (``org`` · ``project`` · ``pool`` · ``unknown``).
    walls: Dict[QueueWall, int]
    reasons: List[QueueReason]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class QueueReport:
    """``GET /v1/admin/queue``: the fair queue per organization, deepest first
    (``truncated`` when the server stopped reading rows)."""

    generated_at: _dt.datetime
    total: int
    truncated: bool
    orgs: List[QueueOrg]
    raw: Dict[str, Any] = _raw()


# --- public events (docs/events.md) ---------------------------------------------------------

PublicEventType = Literal[
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
]
EventCause = Literal["user", "ttl", "idle", "reconciler", "quota", "admin", "backend"]

#: The envelope's major version this SDK reads; a newer one is refused (docs/events.md).
PUBLIC_EVENT_VERSION = 1


@dataclass(frozen=True)
class PublicEventActor:
    """Who caused a ``cause: "user"`` event: the key's public id, never the key."""

    key_id: str
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class PublicEvent:
    """One public event: the same JSON on ``GET /v1/events?format=public``, on NATS and in a
    webhook's body. ``type`` and ``cause`` are open enumerations (a newer server may add
    values: ignore the ones you do not know); ``data``'s fields depend on ``type``.

    ``seq`` is the SSE ``id:`` (the stream sequence, resume after it with ``after=seq``);
    ``None`` for an event that did not come from the SSE stream (a webhook's)."""

    seq: Optional[int] = field(metadata={"local": True})
    version: int
    #: Stable: the same change always has the same id (the webhook's ``webhook-id``); opaque.
    id: str
    type: PublicEventType
    time: _dt.datetime
    org_id: str
    project_id: str
    #: ``None`` only for project-level events (``webhook.disabled``).
    sandbox_id: Optional[str]
    cause: EventCause
    actor: Optional[PublicEventActor]
    data: Dict[str, Any]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class EventTypeSchema:
    """One public event type and its JSON Schema (draft 2020-12)."""

    type: str
    schema: Dict[str, Any]
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class EventSchemaList:
    """``GET /v1/events/schemas``: the envelope's schema and every type's."""

    version: int
    envelope: Dict[str, Any]
    items: List[EventTypeSchema]
    raw: Dict[str, Any] = _raw()


@dataclass
class EventCredentialsRequest:
    """The body of ``POST /v1/events/credentials`` (``ttl_seconds`` 60-86400; 3600 unset)."""

    project_id: Union[str, None, Unset] = UNSET
    ttl_seconds: Union[int, None, Unset] = UNSET


@dataclass(frozen=True)
class EventCredentials:
    """NATS credentials for an organization's (or project's) public events; ``token`` is
    shown this once (kept out of ``repr``). Connect with it as the NATS token and with
    ``inbox_prefix``; subscribe to ``subscribe``; replay from ``stream``."""

    id: str
    token: str = field(repr=False)
    expires_at: _dt.datetime
    org_id: str
    project_id: Optional[str]
    subscribe: str
    inbox_prefix: str
    stream: str
    consumer_create: str
    raw: Dict[str, Any] = _raw()


# --- webhooks (docs/webhooks.md) ------------------------------------------------------------


@dataclass(frozen=True)
class Webhook:
    """A project's webhook (never its secret). ``event_types`` empty: every type."""

    id: str
    org_id: str
    project_id: str
    url: str
    event_types: List[str]
    description: Optional[str]
    enabled: bool
    disabled_reason: Optional[str]
    consecutive_failures: int
    failing_since: Optional[_dt.datetime]
    #: Until then the secret replaced by the last rotation signs next to the new one.
    previous_secret_expires_at: Optional[_dt.datetime]
    created_at: _dt.datetime
    updated_at: _dt.datetime
    raw: Dict[str, Any] = _raw()


@dataclass(frozen=True)
class WebhookWithSecret:
    """A created or rotated webhook with its signing ``secret`` (``whsec_<base64>``), shown
    this once and kept out of ``repr``; pass it to :func:`differently.verify_webhook`."""

    id: str
    org_id: str
    project_id: str
    url: str
    event_types: List[str]
    description: Optional[str]
    enabled: bool
    disabled_reason: Optional[str]
    consecutive_failures: int
    failing_since: Optional[_dt.datetime]
    previous_secret_expires_at: Optional[_dt.datetime]
    created_at: _dt.datetime
    updated_at: _dt.datetime
    secret: str = field(repr=False)
    raw: Dict[str, Any] = _raw()


WebhookDeliveryStatus = Literal["pending", "succeeded", "failed"]


@dataclass(frozen=True)
class WebhookDelivery:
    """One event's delivery to one webhook, with its last attempt's outcome."""

    id: str
    webhook_id: str
    event_id: str
    event_type: str
    status: WebhookDeliveryStatus
    attempts: int
    next_attempt_at: Optional[_dt.datetime]
    response_code: Optional[int]
    latency_ms: Optional[int]
    last_error: Optional[str]
    #: The first 1 KiB of the receiver's answer.
    response_body: Optional[str]
    created_at: _dt.datetime
    updated_at: _dt.datetime
    delivered_at: Optional[_dt.datetime]
    raw: Dict[str, Any] = _raw()


@dataclass
class CreateWebhookRequest:
    """The body of ``POST /v1/webhooks``; ``project_id`` defaults to the key's project."""

    url: str
    project_id: Union[str, None, Unset] = UNSET
    event_types: Union[List[str], Unset] = UNSET
    description: Union[str, None, Unset] = UNSET


@dataclass
class UpdateWebhookRequest:
    """The body of ``PATCH /v1/webhooks/{id}``: ``description=None`` clears it,
    ``enabled=True`` re-enables (forgetting the failures that disabled it)."""

    url: Union[str, Unset] = UNSET
    event_types: Union[List[str], Unset] = UNSET
    description: Union[str, None, Unset] = UNSET
    enabled: Union[bool, Unset] = UNSET
