"""The dashboard's operator summaries: ``GET /v1/admin/queue`` and
``GET /v1/admin/metrics/summary``, seen while a sandbox really waits behind its org's quota."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from differently import AsyncClient, Client, PermissionDeniedError, Quota

from .conftest import Server


def test_queue_and_metrics_show_a_sandbox_waiting_behind_its_org_quota(
    client: Client, server: Server, tag: str
) -> None:
    org = client.orgs.create(f"org-queue-{tag}")
    project = client.projects.create(f"prj-queue-{tag}", org_id=org.id)
    key = client.keys.create(
        f"key-queue-{tag}", ["sandboxes:read", "sandboxes:write"], org_id=org.id, project_id=project.id
    )
    client.quotas.set_org(org.id, Quota(max_active=1, max_queued=5))
    before = client.metrics_summary()
    assert before.enabled, "differently dev keeps metrics"
    with Client(server.url, key.key) as tenant:
        running = tenant.sandboxes.create()
        waiting = tenant.sandboxes.create()
        try:
            assert waiting.status == "queued", waiting
            report = client.queue()
            assert report.generated_at.tzinfo is not None
            assert abs((dt.datetime.now(dt.timezone.utc) - report.generated_at).total_seconds()) < 60
            assert report.total >= 1 and not report.truncated
            mine = [o for o in report.orgs if o.org_id == org.id]
            assert len(mine) == 1, report.orgs
            row = mine[0]
            assert row.org_name == org.name and row.depth == 1
            assert row.oldest_sandbox_id == waiting.id
            assert row.walls == {"org": 1}
            assert [(r.reason, r.count) for r in row.reasons] == [(waiting.status_reason, 1)]
            assert "org" in (waiting.status_reason or "")
            # Deepest first.
            assert [o.depth for o in report.orgs] == sorted((o.depth for o in report.orgs), reverse=True)

            after = client.metrics_summary()
            assert after.generated_at >= before.generated_at
            assert sum(after.admissions.values()) >= sum(before.admissions.values()) + 2
            assert after.queue_depth.get(org.id) == 1.0
            assert all(isinstance(v, float) for v in after.activations.values())
        finally:
            tenant.sandboxes.delete(waiting)
            tenant.sandboxes.delete(running)
            tenant.sandboxes.wait(waiting, "terminated", timeout=30)
            tenant.sandboxes.wait(running, "terminated", timeout=30)
    deadline = time.monotonic() + 10
    while any(o.org_id == org.id for o in client.queue().orgs):
        assert time.monotonic() < deadline, "a terminated sandbox stays in the queue report"
        time.sleep(0.2)
    with Client(server.url, key.key) as tenant, pytest.raises(PermissionDeniedError):
        tenant.queue()  # an operator route: scope admin


@pytest.mark.anyio
async def test_async_summaries(aclient: AsyncClient) -> None:
    summary = await aclient.metrics_summary()
    assert summary.enabled and isinstance(summary.admissions, dict)
    report = await aclient.queue()
    assert report.total == sum(o.depth for o in report.orgs) or report.truncated
