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
from csi.backends.base import DiskOptions
from csi.backends.local import LocalBackend
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
