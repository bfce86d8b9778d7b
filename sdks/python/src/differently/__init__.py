"""Python SDK for Differently, the self-hosted sandbox control plane (``/v1`` API).

    from differently import Client
    with Client() as client:                      # DIFFERENTLY_URL, DIFFERENTLY_API_KEY
        sbx = client.sandboxes.create()
        client.sandboxes.wait(sbx)
        print(client.sandboxes.exec(sbx, ["echo", "hi"]).stdout)

:class:`AsyncClient` has the same surface with ``await``.
"""

from ._async_client import AsyncClient, AsyncEventStream, AsyncExecStream
from ._codec import UNSET, Unset
from ._core import RetryPolicy
from ._sync_client import Client, EventStream, ExecStream
from ._version import __version__
from .errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    DifferentlyError,
    ExecStreamError,
    InsufficientCapacityError,
    InvalidArgumentError,
    MethodNotAllowedError,
    NetworkError,
    NetworkTimeoutError,
    NoEligiblePoolError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    QuotaExceededError,
    RateLimitError,
    RequestTimeoutError,
    SandboxEndedError,
    ServerError,
    StreamCutError,
    UnavailableError,
    UnsupportedCapabilityError,
    UnsupportedOperationError,
    UriTooLongError,
    ValidationError,
    WaitTimeoutError,
)
from .models import (
    AuditEvent,
    CreatedKey,
    DryRun,
    ExecEvent,
    ExecExit,
    ExecResult,
    ExecStderr,
    ExecStdout,
    ExposedPort,
    FileInfo,
    Health,
    Key,
    Org,
    Page,
    PendingOperation,
    Placement,
    Policy,
    Pool,
    PoolCandidate,
    PoolHealth,
    PoolRecord,
    Project,
    Quota,
    QuotaView,
    Resources,
    ResourcesSpec,
    Sandbox,
    SandboxLimit,
    Snapshot,
    StatusEvent,
    TrustReport,
    Verification,
)

__all__ = [name for name in dir() if not name.startswith("_")] + ["__version__"]
