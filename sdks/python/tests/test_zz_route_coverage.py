"""Run last (conftest orders it): every operation the served OpenAPI document lists was called
through the SDK during this session — the Python column of the route table in issue #22."""

from __future__ import annotations

import re

from .conftest import Server


def test_every_operation_is_called_through_the_sdk(server: Server) -> None:
    sent = set(server.sent)
    missing = []
    for path, item in server.openapi["paths"].items():
        rx = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")
        for method in item:
            if not any(m == method.upper() and rx.match(p) for m, p in sent):
                missing.append(f"{method.upper()} {path}")
    assert not missing, (
        "operations no test called through the SDK (run the whole suite; a new route needs "
        f"an SDK method and a test): {missing}"
    )
