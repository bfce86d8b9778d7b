/**
 * One error hierarchy for everything the SDK throws, so callers can `instanceof` once.
 *
 * Never carries the API key: errors are built from the method, the path and the server's
 * envelope only (no request headers), so logging an error is always safe.
 */

/** The stable error codes the API answers (`error.code`); see docs/api.md. */
export const ERROR_CODES = [
  "invalid_argument",
  "unauthenticated",
  "permission_denied",
  "not_found",
  "conflict",
  "payload_too_large",
  "validation_failed",
  "no_eligible_pool",
  "unsupported_capability",
  "rate_limited",
  "quota_exceeded",
  "internal",
  "unsupported_operation",
  "provider_unavailable",
  "insufficient_capacity",
  "method_not_allowed",
  "request_timeout",
  "uri_too_long",
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Base of every error this SDK throws. */
export class DifferentlyError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** What the server said, as the envelope `{"error": {code, message, details, requestId}}`. */
export interface ApiErrorInit {
  status: number;
  code: string;
  message: string;
  details?: Record<string, unknown> | undefined;
  requestId?: string | undefined;
  method: string;
  path: string;
  retryAfterSeconds?: number | undefined;
}

/** The server answered with an error status. */
export class ApiError extends DifferentlyError {
  /** HTTP status. */
  readonly status: number;
  /** Stable machine code (`not_found`, `validation_failed`, …). */
  readonly code: string;
  /** The server's message, without the SDK's prefix. */
  readonly serverMessage: string;
  /** `details.field` when the server named the offending field (a JSON path or query parameter). */
  readonly field: string | undefined;
  /** Everything in `details` (`status`, `operation`, `limitBytes`, `scope`, …). */
  readonly details: Record<string, unknown>;
  /** The request id (`requestId` in the body, else the `X-Request-Id` header). */
  readonly requestId: string | undefined;
  /** `Retry-After`, in seconds, when the server sent one. */
  readonly retryAfterSeconds: number | undefined;
  readonly method: string;
  readonly path: string;

  constructor(init: ApiErrorInit) {
    const field = typeof init.details?.["field"] === "string" ? (init.details["field"] as string) : undefined;
    const where = `${init.method} ${init.path}`;
    const rid = init.requestId ? ` (request ${init.requestId})` : "";
    super(`${where}: ${init.status} ${init.code}: ${init.message}${rid}`);
    this.status = init.status;
    this.code = init.code;
    this.serverMessage = init.message;
    this.field = field;
    this.details = init.details ?? {};
    this.requestId = init.requestId;
    this.retryAfterSeconds = init.retryAfterSeconds;
    this.method = init.method;
    this.path = init.path;
  }
}

/** 400 `invalid_argument`: malformed JSON, unknown fields, bad query values. */
export class InvalidArgumentError extends ApiError {}
/** 401 `unauthenticated`. */
export class AuthenticationError extends ApiError {}
/** 403 `permission_denied`. */
export class PermissionDeniedError extends ApiError {}
/** 404 `not_found` — also what another tenant's resource looks like. */
export class NotFoundError extends ApiError {}
/** 409 `conflict`: illegal transition, concurrent change, idempotency key reuse. */
export class ConflictError extends ApiError {}
/** 413 `payload_too_large`. */
export class PayloadTooLargeError extends ApiError {}
/** 422 `validation_failed` · `no_eligible_pool` · `unsupported_capability`. */
export class ValidationError extends ApiError {}
/** 429 `rate_limited` · `quota_exceeded`. */
export class RateLimitError extends ApiError {}
/** 501 `unsupported_operation`: the sandbox's pool cannot do this. */
export class UnsupportedOperationError extends ApiError {}
/** 503 `provider_unavailable` · `insufficient_capacity`. */
export class UnavailableError extends ApiError {}
/** 500 and anything else. */
export class ServerError extends ApiError {}

const BY_STATUS: Record<number, new (init: ApiErrorInit) => ApiError> = {
  400: InvalidArgumentError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: ValidationError,
  429: RateLimitError,
  501: UnsupportedOperationError,
  503: UnavailableError,
};

/** The subclass for a status (ServerError for the rest). */
export function apiErrorFor(init: ApiErrorInit): ApiError {
  const Cls = BY_STATUS[init.status] ?? ServerError;
  return new Cls(init);
}

/** The server could not be reached (refused, reset, DNS, TLS…); says what to do. */
export class ConnectionError extends DifferentlyError {
  readonly baseUrl: string;
  constructor(message: string, baseUrl: string, cause?: unknown) {
    super(message, { cause });
    this.baseUrl = baseUrl;
  }
}

/** The SDK's own deadline (`timeoutMs`) passed before an answer. */
export class TimeoutError extends DifferentlyError {}

/** A stream reported an error mid-way (`event: error` / frame type 4). */
export class StreamError extends DifferentlyError {
  readonly code: string;
  readonly serverMessage: string;
  constructor(code: string, message: string) {
    super(`stream failed: ${code}: ${message}`);
    this.code = code;
    this.serverMessage = message;
  }
}

/** A stream ended without its final event (the connection was cut). */
export class StreamInterruptedError extends DifferentlyError {}

/** `waitFor…` gave up: the deadline passed or the resource reached another final status. */
export class WaitError extends DifferentlyError {
  /** The last state seen. */
  readonly last: unknown;
  constructor(message: string, last: unknown) {
    super(message);
    this.last = last;
  }
}
