"""Deleted files are removed in the background (csi/backends/local/reaper.py): a delete answers without
waiting for the filesystem to free the blocks, and a space check that comes up short waits for the
removals in flight before it refuses."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from csi.backends.base import DiskOptions, MiB
from csi.backends.local import LocalBackend, files
from csi.backends.local.reaper import REAPER, Reaper


@pytest.fixture
def be(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend.open(str(tmp_path / "data"), node_id="node-1")
    yield backend
    backend.close()


class HeldUnlinks:
    """os.unlink of set-aside files waits for `release()` (10 s at most); other unlinks go through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.removed: list[str] = []
        real = os.unlink

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            if str(path).endswith(files.DOOMED):
                self.gate.wait(10)
                self.removed.append(str(path))
            real(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)

    def release(self) -> None:
        self.gate.set()
        REAPER.settle()


def written(be: LocalBackend) -> tuple[str, str]:
    """(id, file) of a new volume with data in it: a file that holds no block is removed at once."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    path = be.volume_path(vol.id)
    with open(path, "r+b") as f:
        f.write(b"data")
        os.fsync(f.fileno())
    return vol.id, path


def test_a_delete_answers_before_its_file_is_removed(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume_id, path = written(be)
    held = HeldUnlinks(monkeypatch)
    be.delete_volume(volume_id)  # would wait for the gate (and then fail below) if it removed the file itself
    assert held.removed == []
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path) + files.DOOMED]
    held.release()
    assert held.removed == [path + files.DOOMED]
    assert os.listdir(os.path.dirname(path)) == []


def test_start_up_removes_a_crashed_deletes_file_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete that died after its record went leaves `<file>.deleting`: start-up opens without
    waiting for its blocks to be freed (the first Probe waits for start-up), and the file still goes."""
    data = str(tmp_path / "data")
    be = LocalBackend.open(data, node_id="node-1")
    volume_id, path = written(be)
    be.store.delete_volume(volume_id)
    be.close()
    os.rename(path, path + files.DOOMED)
    held = HeldUnlinks(monkeypatch)
    reopened = LocalBackend.open(data, node_id="node-1")  # would wait for the gate if it unlinked itself
    try:
        assert held.removed == []
        assert os.listdir(os.path.dirname(path)) == [os.path.basename(path) + files.DOOMED]
    finally:
        held.release()
        reopened.close()
    assert held.removed == [path + files.DOOMED]
    assert os.listdir(os.path.dirname(path)) == []


def test_a_space_check_that_comes_up_short_waits_for_the_removals_in_flight(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume_id, path = written(be)
    directory = os.path.dirname(path)
    held = HeldUnlinks(monkeypatch)
    be.delete_volume(volume_id)
    files.space(directory, 1)  # enough: no wait (else the gate's 10 s, and a removal seen below)
    assert held.removed == [], "the check waited for the removal although the space sufficed"
    whole = files.space(directory).size
    with futures.ThreadPoolExecutor(1) as pool:
        short = pool.submit(files.space, directory, whole + 1)  # short whatever else runs meanwhile
        time.sleep(0.2)
        assert not short.done(), "a check that came up short did not wait for the removal in flight"
        held.gate.set()
        short.result(timeout=10)
    assert len(held.removed) == 1


def test_a_file_that_holds_no_block_is_removed_before_the_delete_answers(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))  # sparse: never written
    handed: list[str] = []
    monkeypatch.setattr(REAPER, "put", lambda paths: handed.extend(paths))
    be.delete_volume(vol.id)
    assert handed == []
    assert os.listdir(os.path.dirname(be.volume_path(vol.id))) == []


def test_a_removal_that_fails_is_logged_and_the_next_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reaper = Reaper()
    stuck, gone = tmp_path / "a-directory", tmp_path / "a-file"
    stuck.mkdir()
    gone.write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="ballast.local"):
        reaper.put([str(stuck), str(gone)])
        reaper.settle()  # True or False: the reaper's thread may be done before it is asked
    assert stuck.is_dir() and not gone.exists()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"could not remove {stuck} (removed at the next start)"
    ]
    assert not reaper.settle(), "nothing in flight: settle() says so"


def test_settle_waits_only_for_what_was_handed_over_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady stream of deletes a space check still returns: it waits for the removals it
    found in flight, not for the ones handed over while it waits."""
    first, later = tmp_path / "first", tmp_path / "later"
    gates = {str(first): threading.Event(), str(later): threading.Event()}
    real = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        gates[str(path)].wait(10)
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    first.write_bytes(b"x")
    later.write_bytes(b"x")
    reaper = Reaper()
    reaper.put([str(first)])
    with futures.ThreadPoolExecutor(1) as pool:
        settled = pool.submit(reaper.settle)
        time.sleep(0.1)
        reaper.put([str(later)])
        gates[str(first)].set()
        assert settled.result(timeout=5) is True
        assert later.exists(), "settle() returned only once the later removal was done too"
    gates[str(later)].set()
    reaper.settle()
    assert not later.exists()
