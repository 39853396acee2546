"""LocalBackend calls that race on one volume or snapshot (no root: loop devices are faked): a delete
against an attach of its loop device, a publish, or a restore from the snapshot it deletes."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from csi import failures
from csi.backends.base import ContentSource, DiskOptions, SourceKind
from csi.backends.local import LocalBackend, files
from tests.unit.test_local import FakeLoop, MiB, open_backend, volume_files

WAIT = 0.5  # seconds a racing call gets to finish while the first is at its critical step


@pytest.fixture
def be(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = open_backend(tmp_path / "data", loop=FakeLoop())
    yield backend
    backend.close()


def _racing(call: Callable[[], object]) -> tuple[threading.Thread, dict[str, Any]]:
    """`call` started in a thread, and given WAIT seconds to finish; its outcome lands in the dict."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["ok"] = call()
        except failures.DriverError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    return thread, outcome


def test_a_delete_refuses_a_file_an_attach_is_binding(be: LocalBackend) -> None:
    """csi.loop.attach binds under a shared flock of the file (in the node's process, perhaps another):
    a delete then must not set the file aside under the device being bound (ABORTED, retried)."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    path = be.volume_path(vol.id)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        with pytest.raises(failures.BusyError, match="being attached"):
            be.delete_volume(vol.id)
        assert os.path.exists(path) and be.get_volume(vol.id).id == vol.id, "left as it was"
    finally:
        os.close(fd)
    be.delete_volume(vol.id)
    assert volume_files(Path(be.layout.data_dir)) == []


def test_a_refused_delete_never_moves_the_file_of_a_published_volume(be: LocalBackend) -> None:
    """CSI DeleteVolume: a volume in use -> FAILED_PRECONDITION, "not altered in any way": a NodeStage or
    a health check meanwhile must find its file where it is."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    path = be.volume_path(vol.id)
    be.attach(vol.id, "node-1", False)
    seen: list[bool] = []
    real = be.store.delete_volume

    def checked(volume_id: str) -> None:
        seen.append(os.path.exists(path))
        real(volume_id)

    be.store.delete_volume = checked  # type: ignore[method-assign]
    with pytest.raises(failures.FailedPreconditionError, match=r"published to node.*node-1"):
        be.delete_volume(vol.id)
    assert False not in seen, "the file was set aside while the delete was being refused"
    assert os.path.exists(path)


def test_a_publish_waits_for_a_delete_under_way(be: LocalBackend) -> None:
    """ControllerPublish racing DeleteVolume: the delete checks for attachments under the volume's lock,
    which the publish takes too, so the publish comes after it (NOT_FOUND), never between the check and
    the record (which renamed the file for a moment and refused the delete)."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    real = be.store.delete_volume
    racers: list[tuple[threading.Thread, dict[str, Any]]] = []

    def publish_meanwhile(volume_id: str) -> None:
        racers.append(_racing(lambda: be.attach(vol.id, "node-1", False)))
        real(volume_id)

    be.store.delete_volume = publish_meanwhile  # type: ignore[method-assign]
    be.delete_volume(vol.id)
    thread, outcome = racers[0]
    thread.join()
    assert isinstance(outcome.get("error"), failures.NotFoundError), outcome


def test_a_file_named_back_is_durable_before_the_error_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete whose record stays names its file back: synced, or a power loss could bring it back as
    `.deleting` while the error already told the CO the volume is there."""
    path = tmp_path / "lv-1.img"
    path.write_bytes(b"")
    synced: list[str] = []
    monkeypatch.setattr(files, "sync_dir", synced.append)
    with pytest.raises(failures.TransientError), files.doomed([str(path)]):
        raise failures.TransientError("the record could not be deleted")
    assert path.exists() and synced == [str(tmp_path)]


def test_a_restore_racing_the_delete_of_its_snapshot_is_not_found(be: LocalBackend) -> None:
    """CSI CreateVolume: "Source does not exist" -> NOT_FOUND; never FAILED_PRECONDITION for a snapshot
    file a delete has set aside but not yet unrecorded (final for external-provisioner)."""
    vol = be.create_volume("src", DiskOptions(size_bytes=MiB))
    snap = be.create_snapshot("s", vol.id, {})
    real = be.store.delete_snapshot
    racers: list[tuple[threading.Thread, dict[str, Any]]] = []
    source = ContentSource(SourceKind.SNAPSHOT, snap.id)

    def restore_meanwhile(snapshot_id: str) -> None:  # the file is set aside, the record still there
        racers.append(_racing(lambda: be.create_volume("r", DiskOptions(size_bytes=MiB, source=source))))
        real(snapshot_id)

    be.store.delete_snapshot = restore_meanwhile  # type: ignore[method-assign]
    be.delete_snapshot(snap.id)
    thread, outcome = racers[0]
    thread.join()
    assert isinstance(outcome.get("error"), failures.NotFoundError), outcome
    assert be.store.volume_by_name("r") is None


def test_a_restore_copying_a_snapshot_deleted_meanwhile_finishes(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the restore has opened the snapshot's file it copies from that, without the lock: the delete
    does not wait for the copy, and the copy does not fail for the delete."""
    vol = be.create_volume("src", DiskOptions(size_bytes=MiB))
    snap = be.create_snapshot("s", vol.id, {})
    real_reflink = files._reflink
    racers: list[tuple[threading.Thread, dict[str, Any]]] = []

    def delete_meanwhile(src_fd: int, dst_fd: int) -> bool:
        racers.append(_racing(lambda: be.delete_snapshot(snap.id)))
        return real_reflink(src_fd, dst_fd)

    monkeypatch.setattr(files, "_reflink", delete_meanwhile)
    source = ContentSource(SourceKind.SNAPSHOT, snap.id)
    restored = be.create_volume("r", DiskOptions(size_bytes=MiB, source=source))
    thread, outcome = racers[0]
    assert not thread.is_alive() and "error" not in outcome, "the delete went ahead"
    assert be.get_volume(restored.id).id == restored.id
    with pytest.raises(failures.NotFoundError):
        be.get_snapshot(snap.id)
