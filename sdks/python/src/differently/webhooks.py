"""Verifying the webhook requests Differently sends (docs/webhooks.md).

Deliveries are signed as the Standard Webhooks specification defines: ``webhook-signature``
holds ``v1,<base64 HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}")>`` (several,
space-separated, while a rotated-out secret still signs), where ``key`` is the base64 after
``whsec_``. Written here with the standard library so a receiver needs no extra package; any
Standard Webhooks library verifies the same requests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Mapping, Optional, Union

from ._core import public_event
from .errors import ProtocolError, WebhookVerificationError
from .models import PublicEvent

#: How far ``webhook-timestamp`` may be from the receiver's clock (the specification's 5 min):
#: an older request is a replay, whatever its signature.
DEFAULT_TOLERANCE_SECONDS = 300

_SECRET_PREFIX = "whsec_"


def _key(secret: str) -> bytes:
    raw = secret[len(_SECRET_PREFIX):] if secret.startswith(_SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        raise WebhookVerificationError(
            "invalid_secret", "the secret is not 'whsec_' followed by base64 (as create and rotate-secret answer it)"
        )
    return key


def _header(headers: Mapping[str, str], name: str) -> str:
    # Header names are case-insensitive; a plain dict from a framework may keep any case.
    for k, v in headers.items():
        if k.lower() == name:
            return v
    raise WebhookVerificationError("missing_header", f"the request has no {name} header")


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: Union[bytes, str]) -> str:
    """The ``v1,<base64>`` signature of one request (what the server sends; for tests)."""
    payload = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    signed = f"{msg_id}.{timestamp}.".encode("utf-8") + payload
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: Union[bytes, str],
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: Optional[float] = None,
) -> PublicEvent:
    """Checks a webhook request against the webhook's ``secret`` and returns its event.

    ``headers`` are the request's (any case), ``body`` its exact bytes (text is taken as
    UTF-8: verify before any JSON re-encoding). Raises :class:`WebhookVerificationError` when
    a header is missing, the timestamp is more than ``tolerance_seconds`` from ``now`` (default:
    this clock), or no signature matches (compared in constant time). During a secret rotation
    either secret verifies. Drop duplicates by the event's ``id`` (``webhook-id``)."""
    msg_id = _header(headers, "webhook-id")
    raw_ts = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(raw_ts.strip())
    except ValueError:
        raise WebhookVerificationError(
            "invalid_timestamp", "webhook-timestamp is not Unix seconds"
        ) from None
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance_seconds:
        raise WebhookVerificationError(
            "timestamp_out_of_tolerance",
            f"webhook-timestamp is {int(clock - timestamp)} s from this clock "
            f"(more than {tolerance_seconds} s): a replay, or a clock to fix",
        )
    expected = sign_webhook(secret, msg_id, timestamp, body).encode("ascii")
    matched = False
    for candidate in signatures.split():
        # Every candidate is compared (no early exit), each in constant time.
        if candidate.startswith("v1,") and hmac.compare_digest(candidate.encode("ascii", "replace"), expected):
            matched = True
    if not matched:
        raise WebhookVerificationError(
            "invalid_signature", "no v1 signature in webhook-signature matches this secret and body"
        )
    payload = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    try:
        value = json.loads(payload)
    except ValueError as e:
        raise ProtocolError("a verified webhook body that is not JSON") from e
    return public_event(value, None)

