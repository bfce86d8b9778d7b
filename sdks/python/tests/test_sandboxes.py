"""Sandboxes against a real ``differently dev``: create with every field, wait, list with
filters and pages, update, lifecycle, placement, exec buffered and streamed, ports, delete."""

from __future__ import annotations

import time
from typing import Any, List

import pytest

from differently import (
    Client,
    ConflictError,
    ExecExit,
    ExecStderr,
    ExecStdout,
    ExposedPort,
    NoEligiblePoolError,
    NotFoundError,
    ResourcesSpec,
    SandboxEndedError,
    UnsupportedOperationError,
    ValidationError,
    WaitTimeoutError,
)


def test_create_with_every_field_then_running(client: Client, tag: str) -> None:
    project = next(iter(client.projects.list()))
    sbx = client.sandboxes.create(
        project_id=project.id,
        template="python:3.11",
        resources=ResourcesSpec(cpu=2, memory_mib=512, disk_gib=1),
        env={"GREETING": "hello", "SECRET_TOKEN": "s3cr3t-value"},
        labels={"test": tag, "team": "sdk"},
        ttl_seconds=600,
        idle_timeout_seconds=300,
        capabilities=["exec", "files"],
        classification="internal",
        strategy="private-first",
        external="never",
        priority=5,
    )
    try:
        assert sbx.id.startswith("sbx_")
        assert sbx.status in ("queued", "provisioning", "running")
        assert sbx.project_id == project.id
        assert (sbx.resources.cpu, sbx.resources.memory_mib, sbx.resources.disk_gib) == (2, 512, 1)
        assert sbx.labels == {"test": tag, "team": "sdk"}
        assert sorted(sbx.env_keys) == ["GREETING", "SECRET_TOKEN"]
        assert "s3cr3t-value" not in repr(sbx.raw), "env values are never served"
        assert sbx.template == "python:3.11"
        assert (sbx.ttl_seconds, sbx.idle_timeout_seconds, sbx.priority) == (600, 300, 5)
        assert sbx.classification == "internal"
        running = client.sandboxes.wait(sbx, "running", timeout=30)
        assert running.status == "running" and running.pool == "local"
        assert running.started_at is not None and running.expires_at is not None
        assert client.sandboxes.get(sbx.id).status == "running"
        out = client.sandboxes.exec(running, ["sh", "-c", 'printf %s "$GREETING"'])
        assert out.stdout == "hello"
    finally:
        client.sandboxes.delete(sbx)


def test_profile_and_region_are_sent(client: Client, tag: str) -> None:
    medium = client.sandboxes.create(profile="medium", labels={"test": tag})
    assert (medium.resources.cpu, medium.resources.memory_mib) == (2, 4096)  # not the default
    client.sandboxes.delete(medium)
    # The devhost pool has no region: a sandbox asking for one has nowhere to go.
    with pytest.raises(NoEligiblePoolError) as e:
        client.sandboxes.create(region="eu-west-1", labels={"test": tag})
    assert (e.value.status, e.value.code) == (422, "no_eligible_pool")


def test_region_is_sent(client: Client, tag: str) -> None:
    # The devhost pool has no region, so asking for one leaves no eligible pool: the field
    # reached placement. The dry run says so without creating anything.
    dry = client.placement.dry_run(region="eu-west-1", labels={"test": tag})
    assert dry.decision == "rejected"
    assert dry.pools and dry.pools[0].name == "local" and not dry.pools[0].eligible
    assert "region" in (dry.pools[0].reason or "")


def test_idempotent_create_replays(client: Client, tag: str) -> None:
    a = client.sandboxes.create(labels={"test": tag}, idempotency_key=f"idem-{tag}")
    b = client.sandboxes.create(labels={"test": tag}, idempotency_key=f"idem-{tag}")
    assert a.id == b.id
    with pytest.raises(ConflictError) as e:
        client.sandboxes.create(labels={"test": "other"}, idempotency_key=f"idem-{tag}")
    assert e.value.status == 409
    client.sandboxes.delete(a)


def test_exec_exit_codes_env_cwd_stdin_timeout(client: Client, sandbox: Any) -> None:
    ok = client.sandboxes.exec(sandbox, ["sh", "-c", "echo out; echo err >&2"])
    assert (ok.exit_code, ok.stdout, ok.stderr) == (0, "out\n", "err\n")
    assert ok.duration_ms >= 0 and not ok.stdout_truncated
    three = client.sandboxes.exec(sandbox, ["sh", "-c", "exit 3"])
    assert three.exit_code == 3
    env = client.sandboxes.exec(sandbox, ["sh", "-c", 'printf %s "$A-$B"'], env={"A": "1", "B": "two"})
    assert env.stdout == "1-two"
    client.files.upload(sandbox, "/work/dir/marker.txt", b"here")
    cwd = client.sandboxes.exec(sandbox, ["cat", "marker.txt"], cwd="/work/dir")
    assert (cwd.exit_code, cwd.stdout) == (0, "here")
    text = client.sandboxes.exec(sandbox, ["cat"], stdin="line one\nline two\n")
    assert text.stdout == "line one\nline two\n"
    raw = bytes(range(256))
    binary = client.sandboxes.exec(sandbox, ["sh", "-c", "od -An -tx1 | tr -d ' \\n'"], stdin=raw)
    assert binary.stdout == raw.hex()
    b64 = client.sandboxes.exec(sandbox, ["printf", "\\377\\001"], output_base64=True)
    assert b64.stdout == "/wE="
    slow = client.sandboxes.exec(sandbox, ["sleep", "10"], timeout_seconds=1)
    assert slow.exit_code == 124


@pytest.mark.parametrize("transport", ["frames", "sse"])
def test_exec_stream_lines_in_order(client: Client, sandbox: Any, transport: str) -> None:
    script = "for i in $(seq 1 200); do echo line-$i; done; echo oops >&2; exit 3"
    out = bytearray()
    err = bytearray()
    events: List[Any] = []
    with client.sandboxes.exec_stream(sandbox, ["sh", "-c", script], transport=transport) as s:
        for ev in s:
            events.append(ev)
            if isinstance(ev, ExecStdout):
                out += ev.data
            elif isinstance(ev, ExecStderr):
                err += ev.data
    assert out.decode().splitlines() == [f"line-{i}" for i in range(1, 201)]
    assert err == b"oops\n"
    assert isinstance(events[-1], ExecExit) and events[-1].exit_code == 3
    assert sum(isinstance(e, ExecExit) for e in events) == 1
    assert s.exit_code == 3


def test_exec_stream_exact_bytes_env_cwd_stdin(client: Client, sandbox: Any) -> None:
    client.files.upload(sandbox, "/s/in.bin", bytes(range(256)))
    got = bytearray()
    with client.sandboxes.exec_stream(
        sandbox,
        ["sh", "-c", 'cat in.bin; printf %s "$X"; cat'],
        env={"X": "ex"},
        cwd="/s",
        stdin=b"\x00\xff",
    ) as s:
        for ev in s:
            if isinstance(ev, ExecStdout):
                got += ev.data
    assert bytes(got) == bytes(range(256)) + b"ex" + b"\x00\xff"
    assert s.exit_code == 0


def test_exec_stream_produces_output_before_the_end(client: Client, sandbox: Any) -> None:
    # The first chunk arrives while the command still runs: it really is streamed.
    started = time.monotonic()
    first_at = None
    with client.sandboxes.exec_stream(sandbox, ["sh", "-c", "echo first; sleep 2; echo last"]) as s:
        for ev in s:
            if isinstance(ev, ExecStdout) and first_at is None:
                first_at = time.monotonic() - started
    total = time.monotonic() - started
    assert first_at is not None and first_at < 1.5 <= total


def test_exec_stream_close_early_cancels(client: Client, sandbox: Any) -> None:
    with client.sandboxes.exec_stream(sandbox, ["sh", "-c", "echo go; sleep 30"]) as s:
        for ev in s:
            assert isinstance(ev, ExecStdout)
            break
    # Hanging up killed the command: the sandbox is free for the next one at once.
    assert client.sandboxes.exec(sandbox, ["echo", "next"]).stdout == "next\n"


def test_list_filters_and_pagination(client: Client, tag: str) -> None:
    made = [client.sandboxes.create(labels={"test": tag, "n": str(i)}) for i in range(5)]
    other = client.sandboxes.create(labels={"test": tag + "-other"})
    ids = sorted(s.id for s in made)
    try:
        listed = list(client.sandboxes.list(label={"test": tag}, page_size=2))
        assert sorted(s.id for s in listed) == ids
        assert len(listed) == len({s.id for s in listed}), "no sandbox twice across pages"
        assert [s.id for s in client.sandboxes.list(label=f"n=3")] and all(
            s.labels.get("n") == "3" for s in client.sandboxes.list(label="n=3")
        )
        first = client.sandboxes.list_page(label={"test": tag}, limit=2)
        assert len(first.items) == 2 and first.next_cursor is not None
        second = client.sandboxes.list_page(label={"test": tag}, limit=2, cursor=first.next_cursor)
        assert {s.id for s in first.items}.isdisjoint(s.id for s in second.items)
        for s in made:
            client.sandboxes.wait(s, "running", timeout=30)
        running = {s.id for s in client.sandboxes.list(status="running", label={"test": tag})}
        assert running == set(ids)
        client.sandboxes.delete(made[0])
        client.sandboxes.wait(made[0], "terminated", timeout=30)
        running = {s.id for s in client.sandboxes.list(status="running", label={"test": tag})}
        assert running == set(ids[0:0] + [i for i in ids if i != made[0].id])
        project = made[0].project_id
        assert made[1].id in {s.id for s in client.sandboxes.list(project_id=project, label={"test": tag})}
    finally:
        for s in made[1:] + [other]:
            client.sandboxes.delete(s)


def test_several_labels_must_all_match(client: Client, tag: str) -> None:
    a = client.sandboxes.create(labels={"test": tag, "role": "web", "tier": "1"})
    b = client.sandboxes.create(labels={"test": tag, "role": "web", "tier": "2"})
    c = client.sandboxes.create(labels={"test": tag, "role": "db", "tier": "1"})
    try:
        def ids(label: Any) -> List[str]:
            return sorted(s.id for s in client.sandboxes.list(label=label))

        assert ids({"test": tag}) == sorted([a.id, b.id, c.id])
        # Two labels AND: only the sandbox carrying both, from a mapping or from strings.
        assert ids({"test": tag, "role": "web", "tier": "1"}) == [a.id]
        assert ids([f"test={tag}", "role=web"]) == sorted([a.id, b.id])
        assert ids([f"test={tag}", "tier=1"]) == sorted([a.id, c.id])
        assert ids({"test": tag, "role": "db", "tier": "2"}) == []
        page = client.sandboxes.list_page(label={"test": tag, "role": "db"})
        assert [s.id for s in page.items] == [c.id]
        with pytest.raises(ValueError, match="key=value"):
            client.sandboxes.list_page(label=["role"])
    finally:
        for s in (a, b, c):
            client.sandboxes.delete(s)


def test_update_ttl_labels_idle(client: Client, sandbox: Any, tag: str) -> None:
    before = client.sandboxes.get(sandbox)
    time.sleep(1.1)
    renewed = client.sandboxes.update(sandbox, ttl_seconds=7200)
    assert renewed.ttl_seconds == 7200
    assert renewed.expires_at is not None and before.expires_at is not None
    assert renewed.expires_at > before.expires_at
    relabeled = client.sandboxes.update(sandbox, labels={"test": tag, "stage": "two"})
    assert relabeled.labels == {"test": tag, "stage": "two"}
    idle = client.sandboxes.update(sandbox, idle_timeout_seconds=120)
    assert idle.idle_timeout_seconds == 120
    untouched = client.sandboxes.update(sandbox, ttl_seconds=7200)
    assert untouched.idle_timeout_seconds == 120, "an unset field is left alone"
    cleared = client.sandboxes.update(sandbox, idle_timeout_seconds=None)
    assert cleared.idle_timeout_seconds is None
    with pytest.raises(ValidationError) as e:
        client.sandboxes.update(sandbox, ttl_seconds=0)
    assert e.value.field == "ttlSeconds"


def test_keepalive_pause_resume_stop_start(client: Client, sandbox: Any) -> None:
    client.sandboxes.keepalive(sandbox)  # 204; raises on any error
    paused = client.sandboxes.pause(sandbox)
    assert paused.status == "paused"
    assert client.sandboxes.pause(sandbox).status == "paused", "pausing again is a no-op"
    with pytest.raises(ConflictError) as e:
        client.sandboxes.exec(sandbox, ["true"])
    assert e.value.code == "conflict"
    resumed = client.sandboxes.resume(sandbox)
    assert resumed.status == "running"
    assert client.sandboxes.exec(sandbox, ["echo", "back"]).stdout == "back\n"
    # devhost has no lifecycle.stop: stop and start are 501 with the capability named.
    with pytest.raises(UnsupportedOperationError) as e2:
        client.sandboxes.stop(sandbox)
    assert e2.value.status == 501 and e2.value.details.get("capability") == "lifecycle.stop"
    with pytest.raises(UnsupportedOperationError):
        client.sandboxes.start(sandbox)


def test_placement_explanation(client: Client, sandbox: Any) -> None:
    p = client.sandboxes.placement(sandbox)
    assert p.decision == "placed" and p.pool == "local"
    assert p.pools and p.pools[0].eligible and p.pools[0].score is not None
    assert client.placement.explain(sandbox.id).pool == "local"
    dry = client.placement.dry_run(resources=ResourcesSpec(cpu=1))
    assert dry.decision == "placed" and dry.pool == "local"


def test_expose_port(client: Client, sandbox: Any) -> None:
    # devhost exposes ports only without bubblewrap (under it the sandbox has no network):
    # the pool's advertised capabilities say which answer is right.
    if "ports.expose" in client.pools.get("local").capabilities:
        port = client.sandboxes.expose_port(sandbox, 8080, expires_seconds=60)
        assert isinstance(port, ExposedPort)
        assert port.url.endswith(":8080")
    else:
        with pytest.raises(UnsupportedOperationError) as unsupported:
            client.sandboxes.expose_port(sandbox, 8080, expires_seconds=60)
        assert unsupported.value.details.get("capability") == "ports.expose"
    with pytest.raises(ValidationError) as e:
        client.sandboxes.expose_port(sandbox, 70000)
    assert e.value.field == "port"


def test_wait_timeout_and_ended(client: Client, tag: str) -> None:
    sbx = client.sandboxes.create(labels={"test": tag})
    client.sandboxes.wait(sbx, "running", timeout=30)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as e:
        client.sandboxes.wait(sbx, "paused", timeout=1)
    assert 0.9 <= time.monotonic() - started < 10
    assert e.value.last.status == "running"
    client.sandboxes.delete(sbx)
    with pytest.raises(SandboxEndedError) as ended:
        client.sandboxes.wait(sbx, "running", timeout=30)
    assert ended.value.sandbox.status == "terminated"


def test_delete_then_gone(client: Client, tag: str) -> None:
    sbx = client.sandboxes.wait(client.sandboxes.create(labels={"test": tag}), timeout=30)
    deleted = client.sandboxes.delete(sbx)
    assert deleted.status in ("terminating", "terminated")
    done = client.sandboxes.wait(sbx, "terminated", timeout=30)
    assert done.ended_at is not None
    with pytest.raises(ConflictError) as e:
        client.sandboxes.exec(sbx, ["true"])
    assert e.value.details.get("status") == "terminated"
    assert sbx.id not in {s.id for s in client.sandboxes.list(status="running", label={"test": tag})}


def test_missing_sandbox_is_not_found(client: Client) -> None:
    with pytest.raises(NotFoundError) as e:
        client.sandboxes.get("sbx_00000000000000000000000000")
    assert e.value.status == 404 and e.value.code == "not_found"
    assert e.value.request_id
