"""Typed models of what the ``/v1`` API serves and accepts.

Answers are frozen dataclasses with snake_case attributes; each keeps the whole JSON object it
came from in ``raw`` (so a field a newer server adds is reachable before the SDK knows it).
Requests are dataclasses whose fields default to :data:`UNSET` (not sent).

The wire models are generated from the OpenAPI document (``docs/openapi.json``, itself
generated from the server's Rust types) into ``_generated_models.py`` by
``scripts/gen-sdk-models``; this module re-exports them and adds what a generator cannot: pages,
exec's output chunks, former names and constants of the SDK. ``tests/test_openapi_drift.py``
checks them against the document the running server serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, List, Optional, TypeVar, Union

from ._generated_models import *  # noqa: F401,F403 (the wire models are this module's API)
from ._generated_models import ExecExit, PoolVerdict

T = TypeVar("T")

#: Statuses a sandbox never leaves.
FINAL_STATUSES = frozenset({"terminated", "failed"})

#: The envelope's major version this SDK reads; a newer one is refused (docs/events.md).
PUBLIC_EVENT_VERSION = 1

#: The name this model had before the document typed it (``PoolVerdict`` there).
PoolCandidate = PoolVerdict


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items and the cursor of the next page (``None`` at the end)."""

    items: List[T]
    next_cursor: Optional[str]


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


#: What a streamed exec yields: output chunks, then its exit.
ExecEvent = Union[ExecStdout, ExecStderr, ExecExit]
