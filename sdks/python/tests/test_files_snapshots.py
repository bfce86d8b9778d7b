"""Files and snapshots against a real ``differently dev``."""

from __future__ import annotations

import io
import os
from typing import Any, Iterator

import pytest

from differently import (
    AsyncClient,
    Client,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    ValidationError,
)


def test_files_round_trip(client: Client, sandbox: Any) -> None:
    payload = os.urandom(300_000) + bytes(range(256))
    client.files.upload(sandbox, "/data/blob.bin", payload, mode=0o600)
    assert client.files.download(sandbox, "/data/blob.bin") == payload
    assert client.files.download(sandbox, "/data/blob.bin", offset=10, length=5) == payload[10:15]
    assert client.files.download(sandbox, "/data/blob.bin", offset=len(payload) - 3) == payload[-3:]
    sink = io.BytesIO()
    assert client.files.download_to(sandbox, "/data/blob.bin", sink) == len(payload)
    assert sink.getvalue() == payload
    info = client.files.stat(sandbox, "/data/blob.bin")
    assert (info.type, info.size, info.mode & 0o777) == ("file", len(payload), 0o600)
    assert info.modified_at is not None
    d = client.files.stat(sandbox, "/data")
    assert d.type == "dir"
    # The command in the sandbox sees the same bytes.
    digest = client.sandboxes.exec(sandbox, ["sh", "-c", "wc -c < data/blob.bin"]).stdout.strip()
    assert int(digest) == len(payload)


def test_upload_text_file_object_and_chunks(client: Client, sandbox: Any) -> None:
    client.files.upload(sandbox, "/t/text.txt", "héllo\n")
    assert client.files.download(sandbox, "/t/text.txt") == "héllo\n".encode()
    client.files.upload(sandbox, "/t/from-file.bin", io.BytesIO(b"x" * 700_000))
    assert client.files.stat(sandbox, "/t/from-file.bin").size == 700_000

    def chunks() -> Iterator[bytes]:
        for i in range(4):
            yield bytes([65 + i]) * 1000

    client.files.upload(sandbox, "/t/chunks.bin", chunks())
    assert client.files.download(sandbox, "/t/chunks.bin") == b"A" * 1000 + b"B" * 1000 + b"C" * 1000 + b"D" * 1000


def test_list_exists_delete(client: Client, sandbox: Any) -> None:
    client.files.upload(sandbox, "/tree/a/one.txt", b"1")
    client.files.upload(sandbox, "/tree/a/b/two.txt", b"22")
    shallow = {f.path for f in client.files.list(sandbox, "/tree")}
    assert shallow == {"/tree/a"}
    deep = {f.path: f for f in client.files.list(sandbox, "/tree", depth=3)}
    assert set(deep) == {"/tree/a", "/tree/a/one.txt", "/tree/a/b", "/tree/a/b/two.txt"}
    assert deep["/tree/a/b/two.txt"].size == 2 and deep["/tree/a/b"].type == "dir"
    assert client.files.exists(sandbox, "/tree/a/one.txt")
    assert not client.files.exists(sandbox, "/tree/none")
    with pytest.raises(ValidationError):
        client.files.delete(sandbox, "/tree/a")  # not empty
    client.files.delete(sandbox, "/tree/a/one.txt")
    assert not client.files.exists(sandbox, "/tree/a/one.txt")
    with pytest.raises(NotFoundError):
        client.files.download(sandbox, "/tree/a/one.txt")
    with pytest.raises(NotFoundError):
        client.files.stat(sandbox, "/tree/a/one.txt")
    client.files.delete(sandbox, "/tree/a/b/two.txt")
    client.files.delete(sandbox, "/tree/a/b")
    assert [f.path for f in client.files.list(sandbox, "/tree", depth=2)] == ["/tree/a"]


def test_make_dir(client: Client, sandbox: Any) -> None:
    made = client.files.make_dir(sandbox, "/mk/a/b", mode=0o750)
    assert (made.path, made.created) == ("/mk/a/b", True)
    assert client.files.stat(sandbox, "/mk/a/b").type == "dir"
    assert client.files.stat(sandbox, "/mk/a/b").mode & 0o7777 == 0o750
    assert client.files.stat(sandbox, "/mk/a").mode & 0o7777 == 0o755  # parents: 755
    # The command in the sandbox sees it.
    seen = client.sandboxes.exec(sandbox, ["stat", "-c", "%F %a", "/mk/a/b"]).stdout
    assert seen == "directory 750\n"
    # Already there: not made again, its mode left alone.
    again = client.files.make_dir(sandbox, "/mk/a/b", mode=0o700)
    assert (again.path, again.created) == ("/mk/a/b", False)
    assert client.files.stat(sandbox, "/mk/a/b").mode & 0o7777 == 0o750
    assert client.files.make_dir(sandbox, "/mk/plain").created
    assert client.files.stat(sandbox, "/mk/plain").mode & 0o7777 == 0o755
    # A file in the way, at the path or among its parents: 409, saying which; the file kept.
    client.files.upload(sandbox, "/mk/f.txt", b"file")
    for path, reason in [("/mk/f.txt", "exists_not_directory"), ("/mk/f.txt/sub", "not_a_directory")]:
        with pytest.raises(ConflictError) as conflict:
            client.files.make_dir(sandbox, path)
        assert conflict.value.details.get("reason") == reason, conflict.value
    assert client.files.download(sandbox, "/mk/f.txt") == b"file"
    # Bad input is a 400 naming the field; nothing is made.
    with pytest.raises(InvalidArgumentError) as bad:
        client.files.make_dir(sandbox, "relative/dir")
    assert bad.value.field == "path"
    with pytest.raises(InvalidArgumentError) as bad:
        client.files.make_dir(sandbox, "/mk/bad", mode=0o17777)
    assert bad.value.field == "mode"
    assert not client.files.exists(sandbox, "/mk/bad")


@pytest.mark.anyio
async def test_make_dir_async(aclient: AsyncClient, sandbox: Any) -> None:
    made = await aclient.files.make_dir(sandbox, "/mk-async/x")
    assert (made.path, made.created) == ("/mk-async/x", True)
    assert not (await aclient.files.make_dir(sandbox, "/mk-async/x")).created


def test_bad_paths(client: Client, sandbox: Any) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        client.files.download(sandbox, "/../etc/passwd")
    assert e.value.field == "path"
    with pytest.raises(InvalidArgumentError) as e2:
        client.files.upload(sandbox, "relative.txt", b"x")
    assert e2.value.field == "path"


def test_snapshot_then_fork(client: Client, sandbox: Any, tag: str) -> None:
    client.files.upload(sandbox, "/state/counter.txt", b"41")
    snap = client.snapshots.create(sandbox, name=f"snap-{tag}")
    assert snap.id.startswith("snp_") and snap.sandbox_id == sandbox.id and snap.name == f"snap-{tag}"
    ready = client.snapshots.wait_ready(snap, timeout=30)
    assert ready.status == "ready"
    assert client.snapshots.get(snap.id).id == snap.id
    assert snap.id in {s.id for s in client.snapshots.list(sandbox=sandbox)}
    assert snap.id in {s.id for s in client.snapshots.list(project_id=sandbox.project_id, page_size=1)}
    # The original changes after the snapshot; the fork has the state at snapshot time.
    client.files.upload(sandbox, "/state/counter.txt", b"99")
    fork = client.sandboxes.create(from_snapshot=snap.id, labels={"test": tag})
    try:
        fork = client.sandboxes.wait(fork, "running", timeout=30)
        assert fork.labels.get("differently.dev/from-snapshot") == snap.id
        assert client.files.download(fork, "/state/counter.txt") == b"41"
        assert client.sandboxes.exec(fork, ["cat", "state/counter.txt"]).stdout == "41"
        assert client.files.download(sandbox, "/state/counter.txt") == b"99"
        placement = client.sandboxes.placement(fork)
        assert placement.pool == snap.pool
    finally:
        client.sandboxes.delete(fork)
        client.sandboxes.wait(fork, "terminated", timeout=30)
    assert client.snapshots.delete(snap) is None
    with pytest.raises(NotFoundError):
        client.snapshots.get(snap.id)
    with pytest.raises(NotFoundError) as e:
        client.sandboxes.create(from_snapshot=snap.id)
    assert e.value.field == "fromSnapshot"
