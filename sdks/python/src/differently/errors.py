"""One exception hierarchy for everything the SDK raises.

Every error the server answers is the JSON envelope
``{"error": {"code", "message", "details", "requestId"}}``; :class:`APIError` carries all of it
(plus the HTTP status), and a subclass per stable ``code`` lets callers catch what they can
handle (``except NotFoundError``) without string matching. Nothing here ever holds the API key.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type


class DifferentlyError(Exception):
    """The base of every exception this SDK raises."""


class APIError(DifferentlyError):
    """The server answered with an error envelope (any status >= 400).

    ``code`` is the stable machine-readable code (``not_found``, ``validation_failed``, …),
    ``field`` the JSON path of the offending input when the server names one
    (``details.field``), ``request_id`` the request's id (the ``X-Request-Id`` header, also in
    the audit records the request wrote), ``retry_after`` the server's ``Retry-After`` in seconds.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: Optional[Mapping[str, Any]] = None,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
        method: Optional[str] = None,
        path: Optional[str] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.details: Dict[str, Any] = dict(details or {})
        field = self.details.get("field")
        self.field: Optional[str] = field if isinstance(field, str) else None
        self.request_id = request_id
        self.retry_after = retry_after
        self.method = method
        self.path = path
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"{self.method} {self.path}: " if self.method and self.path else ""
        field = f" (field {self.field})" if self.field else ""
        rid = f" [request {self.request_id}]" if self.request_id else ""
        return f"{where}{self.status} {self.code}: {self.message}{field}{rid}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"message={self.message!r}, field={self.field!r}, request_id={self.request_id!r})"
        )


class InvalidArgumentError(APIError):
    """400 ``invalid_argument``: malformed JSON, unknown fields, bad query values."""


class AuthenticationError(APIError):
    """401 ``unauthenticated``: no key, or the key is unknown, revoked or expired."""


class PermissionDeniedError(APIError):
    """403 ``permission_denied``: the key lacks the scope, or its organization is suspended."""


class NotFoundError(APIError):
    """404 ``not_found``: absent, or another tenant's (the same answer, by design)."""


class MethodNotAllowedError(APIError):
    """405 ``method_not_allowed``."""


class RequestTimeoutError(APIError):
    """408 ``request_timeout``: the body did not arrive in time."""


class ConflictError(APIError):
    """409 ``conflict``: illegal transition, concurrent change, idempotency key reused."""


class PayloadTooLargeError(APIError):
    """413 ``payload_too_large`` (``details.limitBytes`` says the limit)."""


class UriTooLongError(APIError):
    """414 ``uri_too_long``."""


class ValidationError(APIError):
    """422 ``validation_failed`` (also the base of the other 422 codes)."""


class NoEligiblePoolError(ValidationError):
    """422 ``no_eligible_pool``: policy or capabilities leave no pool."""


class UnsupportedCapabilityError(ValidationError):
    """422 ``unsupported_capability``."""


class RateLimitError(APIError):
    """429 ``rate_limited`` (``retry_after`` says when to come back)."""


class QuotaExceededError(APIError):
    """429 ``quota_exceeded``: the message names the quota and its limit."""


class ServerError(APIError):
    """500 ``internal``, or any 5xx without a more specific code."""


class UnsupportedOperationError(APIError):
    """501 ``unsupported_operation``: the sandbox's pool cannot do this."""


class UnavailableError(APIError):
    """503 ``provider_unavailable``: the backend or the database is unreachable for now."""


class InsufficientCapacityError(APIError):
    """503 ``insufficient_capacity``: no room anywhere right now."""


_BY_CODE: Dict[str, Type[APIError]] = {
    "invalid_argument": InvalidArgumentError,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "method_not_allowed": MethodNotAllowedError,
    "request_timeout": RequestTimeoutError,
    "conflict": ConflictError,
    "payload_too_large": PayloadTooLargeError,
    "uri_too_long": UriTooLongError,
    "validation_failed": ValidationError,
    "no_eligible_pool": NoEligiblePoolError,
    "unsupported_capability": UnsupportedCapabilityError,
    "rate_limited": RateLimitError,
    "quota_exceeded": QuotaExceededError,
    "internal": ServerError,
    "unsupported_operation": UnsupportedOperationError,
    "provider_unavailable": UnavailableError,
    "insufficient_capacity": InsufficientCapacityError,
}

_BY_STATUS: Dict[int, Type[APIError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    408: RequestTimeoutError,
    409: ConflictError,
    413: PayloadTooLargeError,
    414: UriTooLongError,
    422: ValidationError,
    429: RateLimitError,
    501: UnsupportedOperationError,
    503: UnavailableError,
}

#: Every error code the SDK knows (checked against the served OpenAPI document by a test).
KNOWN_CODES = frozenset(_BY_CODE)


def error_class(status: int, code: str) -> Type[APIError]:
    """The exception class for an answer: by stable code first, then by status."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    if status >= 500:
        return _BY_STATUS.get(status, ServerError)
    return _BY_STATUS.get(status, APIError)


class NetworkError(DifferentlyError):
    """The request did not get an answer: refused, reset, DNS, TLS, or a cut stream.

    The message says where and what to do; the underlying transport exception is the
    ``__cause__``.
    """


class NetworkTimeoutError(NetworkError):
    """No answer within the client's timeout."""


class StreamCutError(NetworkError):
    """A stream ended without its closing frame (the connection was lost mid-stream)."""


class ExecStreamError(DifferentlyError):
    """A streamed exec ended with an ``error`` event/frame: the backend failed mid-stream."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"exec stream failed: {code}: {message}")


class PtyError(DifferentlyError):
    """A terminal ended with an ``error`` frame: the backend failed (e.g. a ``cwd`` that does
    not exist), a frame was refused (``field`` names what), or another connection took the
    session over (``code`` ``conflict``, close code 4001)."""

    def __init__(self, code: str, message: str, field: Optional[str] = None) -> None:
        self.code = code
        self.message = message
        self.field = field
        super().__init__(f"terminal failed: {code}: {message}")


class WaitTimeoutError(DifferentlyError):
    """A wait for a status ran out of time; ``last`` is what the resource looked like then."""

    def __init__(self, message: str, last: Any) -> None:
        self.last = last
        super().__init__(message)


class SandboxEndedError(DifferentlyError):
    """The sandbox reached a final status (``terminated``/``failed``) other than the one awaited."""

    def __init__(self, message: str, sandbox: Any) -> None:
        self.sandbox = sandbox
        super().__init__(message)


class ProtocolError(DifferentlyError):
    """The server's answer did not have the shape this SDK expects (a version mismatch)."""


class WebhookVerificationError(DifferentlyError):
    """A webhook request did not verify (:func:`differently.verify_webhook`): answer it 4xx
    and do not act on it. ``code`` is stable: ``missing_header``, ``invalid_timestamp``,
    ``timestamp_out_of_tolerance``, ``invalid_secret``, ``invalid_signature``. The message
    never holds the secret or a signature."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"webhook not verified: {code}: {message}")
