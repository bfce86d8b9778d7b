"""Organizations, projects, keys, quotas, policies, pools, audit and the trust report — and two
tenants that cannot see each other's sandboxes."""

from __future__ import annotations

from typing import Any

import pytest

from differently import (
    AuthenticationError,
    Client,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    Policy,
    Quota,
    QuotaExceededError,
    ResourcesSpec,
    SandboxLimit,
    ValidationError,
    WarmClass,
    WarmResources,
)

from .conftest import Server


def _tenant(client: Client, name: str) -> Any:
    org = client.orgs.create(f"org-{name}")
    project = client.projects.create(f"prj-{name}", org_id=org.id)
    key = client.keys.create(
        f"key-{name}",
        ["sandboxes:read", "sandboxes:write", "sandboxes:exec", "files:read", "files:write"],
        org_id=org.id,
        project_id=project.id,
    )
    return org, project, key


def test_orgs_projects_keys(client: Client, server: Server, tag: str) -> None:
    org, project, key = _tenant(client, tag)
    assert org.status == "active" and client.orgs.get(org.id).name == f"org-{tag}"
    assert org.id in {o.id for o in client.orgs.list(page_size=1)}
    assert project.org_id == org.id
    assert [p.id for p in client.projects.list(org_id=org.id)] == [project.id]
    assert client.projects.update(project, name=f"renamed-{tag}").name == f"renamed-{tag}"
    assert client.projects.get(project.id).name == f"renamed-{tag}"
    assert key.key.startswith("dly_") and key.key not in repr(key)
    assert key.project_id == project.id and "sandboxes:exec" in key.scopes
    assert client.keys.get(key.id).name == f"key-{tag}"
    assert [k.id for k in client.keys.list(org_id=org.id)] == [key.id]
    with Client(server.url, key.key) as tenant:
        sbx = tenant.sandboxes.create()
        assert sbx.org_id == org.id and sbx.project_id == project.id
        with pytest.raises(PermissionDeniedError):
            tenant.orgs.create("not-allowed")
        tenant.sandboxes.delete(sbx)
        tenant.sandboxes.wait(sbx, "terminated", timeout=30)
        revoked = client.keys.revoke(key)
        assert revoked.revoked_at is not None
        with pytest.raises(AuthenticationError) as e:
            tenant.sandboxes.get(sbx)
        assert e.value.status == 401 and e.value.code == "unauthenticated"
    suspended = client.orgs.update(org, status="suspended")
    assert suspended.status == "suspended"
    assert client.orgs.update(org, status="active", name=f"org2-{tag}").name == f"org2-{tag}"


def test_two_tenants_do_not_see_each_other(client: Client, server: Server, tag: str) -> None:
    _, _, key_a = _tenant(client, f"a-{tag}")
    _, project_b, key_b = _tenant(client, f"b-{tag}")
    with Client(server.url, key_a.key) as a, Client(server.url, key_b.key) as b:
        sbx = a.sandboxes.wait(a.sandboxes.create(labels={"test": tag}), timeout=30)
        a.files.upload(sbx, "/private.txt", b"a's")
        for call in (
            lambda: b.sandboxes.get(sbx.id),
            lambda: b.sandboxes.exec(sbx.id, ["cat", "private.txt"]),
            lambda: b.files.download(sbx.id, "/private.txt"),
            lambda: b.sandboxes.delete(sbx.id),
            lambda: b.sandboxes.placement(sbx.id),
        ):
            with pytest.raises(NotFoundError) as e:
                call()
            assert e.value.status == 404
        assert sbx.id not in {s.id for s in b.sandboxes.list()}
        assert [s.id for s in a.sandboxes.list()] == [sbx.id]
        snap = a.snapshots.wait_ready(a.snapshots.create(sbx), timeout=30)
        with pytest.raises(NotFoundError):
            b.sandboxes.create(from_snapshot=snap.id)
        with pytest.raises(NotFoundError):
            b.snapshots.get(snap.id)
        # Project-bound key b cannot name another project's events.
        with pytest.raises(NotFoundError):
            next(iter(b.events.stream(project_id=sbx.project_id, after=0)))
        a.snapshots.delete(snap)
        a.sandboxes.delete(sbx)
        a.sandboxes.wait(sbx, "terminated", timeout=30)
    # The admin cannot delete b's project while it is empty? It can: nothing lives there.
    client.projects.delete(project_b)
    with pytest.raises(NotFoundError):
        client.projects.get(project_b.id)


def test_quotas(client: Client, server: Server, tag: str) -> None:
    org, project, key = _tenant(client, f"q-{tag}")
    view = client.quotas.set_org(
        org.id, Quota(max_active=3, max_cpu=2, max_sandbox=SandboxLimit(cpu=2, memory_mib=2048, disk_gib=10))
    )
    assert view.quota.max_cpu == 2 and view.quota.max_active == 3
    assert view.quota.max_sandbox is not None and view.quota.max_sandbox.memory_mib == 2048
    assert client.quotas.get_org(org.id).effective.max_cpu == 2
    pview = client.quotas.set_project(project.id, Quota(max_active=1))
    assert pview.quota.max_active == 1
    got = client.quotas.get_project(project.id)
    assert got.quota.max_active == 1 and "active" in got.usage
    with Client(server.url, key.key) as tenant:
        with pytest.raises(QuotaExceededError) as e:
            tenant.sandboxes.create(resources=ResourcesSpec(cpu=4))
        assert e.value.status == 429 and e.value.message.startswith("resources.cpu")
        assert e.value.retry_after is None
    with pytest.raises(ValidationError) as bad:
        client.quotas.set_org(org.id, Quota(max_queue_seconds=0))
    assert bad.value.field == "maxQueueSeconds"


def test_policies(client: Client, tag: str) -> None:
    org, project, _ = _tenant(client, f"p-{tag}")
    pol = client.policies.set_org(org.id, Policy(allowed_classifications=["internal", "public"], denied_pools=[]))
    assert pol.allowed_classifications == ["internal", "public"]
    assert client.policies.get_org(org.id).allowed_classifications == ["internal", "public"]
    ppol = client.policies.set_project(project.id, Policy(default_strategy="cheapest"))
    assert ppol.default_strategy == "cheapest"
    assert client.policies.get_project(project.id).default_strategy == "cheapest"
    before = client.policies.get_global()
    assert isinstance(before, Policy)
    assert client.policies.set_global(before) == before
    with pytest.raises(ValidationError) as e:
        client.policies.set_org(org.id, Policy(denied_pools=["Not A Pool"]))
    assert (e.value.field or "").startswith("deniedPools")


def test_pools_audit_trust(client: Client, sandbox: Any) -> None:
    pools = list(client.pools.list())
    assert [p.name for p in pools] == ["local"]
    local = client.pools.get("local")
    assert local.kind == "devhost" and local.healthy and "exec.stream" in local.capabilities
    with pytest.raises(NotFoundError):
        client.pools.get("no-such-pool")
    records = list(client.audit.list(resource=sandbox.id, page_size=2))
    assert records and {r.action for r in records} >= {"sandbox.admit"}
    assert all(r.resource == sandbox.id for r in records)
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    admits = list(client.audit.list(action="sandbox.admit"))
    assert admits and all(a.action == "sandbox.admit" for a in admits)
    verification = client.audit.verify()
    assert verification.ok and verification.records > 0 and verification.first_bad is None
    lines = list(client.audit.export())
    assert any(line.get("resource") == sandbox.id for line in lines)
    report = client.trust_report()
    assert report.installation_id.startswith("inst_")
    assert [p.name for p in report.pools] == ["local"] and report.not_enforced
    assert report.pools[0].trust == "private" and report.pools[0].source in ("config", "api")
    assert client.health().status and client.ready().status


def test_project_with_live_sandbox_cannot_be_deleted(client: Client, server: Server, tag: str) -> None:
    org, project, key = _tenant(client, f"d-{tag}")
    with Client(server.url, key.key) as tenant:
        sbx = tenant.sandboxes.create()
        with pytest.raises(ConflictError) as e:
            client.projects.delete(project)
        assert e.value.status == 409
        tenant.sandboxes.delete(sbx)


def test_secrets_and_audit_checkpoints(client: Client, tag: str) -> None:
    name = f"sdk-{tag}"
    stored = client.secrets.put(name, "the-secret-value")
    assert stored.name == name and stored.fingerprint.startswith("sha256:")
    assert "the-secret-value" not in repr(stored.raw)
    assert name in {s.name for s in client.secrets.list()}
    again = client.secrets.put(name, "another-value")
    assert again.fingerprint != stored.fingerprint
    with pytest.raises(ValidationError) as e:
        client.secrets.put("Bad Name", "x")
    assert e.value.field == "name"
    first = client.audit.checkpoint()
    assert first is not None and first.heads, "a checkpoint of the session's chains"
    assert len(first.hash) == 64 and first.segment is None
    assert all(h.chain_seq >= 1 and len(h.hash) == 64 for h in first.heads)
    # Every signature verifies here, so the server refuses a segment, saying why.
    with pytest.raises(ConflictError) as c:
        client.audit.segment("sdk test")
    assert "segment" in c.value.message


def test_pool_admin_and_org_delete(client: Client, tag: str) -> None:
    name = f"sdk-{tag[:8]}"
    made = client.pools.create(name, "fake", max_concurrent=2, cost_per_cpu_hour=0.5)
    try:
        assert (made.name, made.kind, made.source, made.max_concurrent) == (name, "fake", "api", 2)
        assert made.cost_per_cpu_hour == 0.5
        patched = client.pools.update(name, max_concurrent=5, region="lab-1")
        assert (patched.max_concurrent, patched.region) == (5, "lab-1")
        assert client.pools.get(name).max_concurrent == 5
        assert name in {p.name for p in client.pools.list()}
    finally:
        client.pools.delete(name)
    with pytest.raises(NotFoundError):
        client.pools.get(name)
    org = client.orgs.create(f"short-lived-{tag}")
    client.orgs.delete(org)
    with pytest.raises(NotFoundError):
        client.orgs.get(org.id)


def test_pool_warm_classes(client: Client) -> None:
    py = WarmClass(
        "py",
        size=0,
        refill_per_second=0.5,
        max_size=2,
        template="python:3.12",
        resources=WarmResources(cpu=2, memory_mib=2048, disk_gib=5),
    )
    put = client.pools.set_warm("local", [WarmClass("default", size=0, refill_per_second=1), py])
    try:
        assert [c.name for c in put.classes] == ["default", "py"]
        default, got = put.classes
        assert (default.max_size, default.max_age_seconds, default.template) == (None, 3600, None)
        assert (default.ready, default.creating) == (0, 0)
        assert (got.max_size, got.template, got.refill_per_second) == (2, "python:3.12", 0.5)
        assert got.resources is not None and got.resources.memory_mib == 2048
        assert client.pools.get_warm("local") == put
        with pytest.raises(ValidationError) as e:
            client.pools.set_warm("local", [WarmClass("a", size=1, refill_per_second=0)])
        assert e.value.field == "classes[0].refillPerSecond"
        with pytest.raises(NotFoundError):
            client.pools.get_warm("no-such-pool")
    finally:
        cleared = client.pools.set_warm("local", [])
    assert cleared.classes == []
