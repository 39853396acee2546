"""The local backend's space reserve (csi/backends/local/reserve.py) on a real filesystem, no root: it
holds allocated blocks, not a sparse length, gives them back once, and a start keeps it. What it buys
on a full filesystem is tested there: tests/reliability/test_faults.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csi.backends.local.files import space
from csi.backends.local.reserve import RESERVE_BYTES, Reserve
from tests.unit.test_local import open_backend

KiB = 1024


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512 if path.exists() else 0


def test_keep_allocates_the_whole_reserve_and_release_gives_it_back_once(tmp_path: Path) -> None:
    path = tmp_path / "state.reserve"
    reserve = Reserve(str(path), size=256 * KiB)
    reserve.keep()
    assert path.stat().st_size == 256 * KiB and allocated(path) >= 256 * KiB
    reserve.keep()  # kept already: nothing changes
    assert allocated(path) >= 256 * KiB
    assert reserve.release() is True
    assert allocated(path) == 0
    assert reserve.release() is False, "nothing left to give: a retry would have no more room"
    reserve.keep()
    assert allocated(path) >= 256 * KiB


@pytest.mark.parametrize(
    ("kept", "call"),
    [
        pytest.param(False, "keep", id="keep-allocates-nothing"),
        pytest.param(True, "make_room", id="make_room-releases-what-was-kept"),
    ],
)
def test_without_room_for_it_the_reserve_holds_nothing(tmp_path: Path, kept: bool, call: str) -> None:
    path = tmp_path / "state.reserve"
    if kept:
        Reserve(str(path), size=256 * KiB).keep()
    too_big = Reserve(str(path), size=space(str(tmp_path)).free + 1024**3)
    getattr(too_big, call)()
    assert allocated(path) == 0


def test_a_start_keeps_the_reserve(tmp_path: Path) -> None:
    data = tmp_path / "data"
    open_backend(data).close()
    assert allocated(data / "state.reserve") >= RESERVE_BYTES
