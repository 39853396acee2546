"""csi/loopfind.py's sysfs reading, over a fake /sys/block (no root): which bound devices a path names."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from csi import loop, loopfind
from csi.backends.local.devices import LoopDevices
from csi.backends.local.files import DOOMED

FILE = "/nonexistent-ballast/volumes/lv-1.img"  # no symlink on the way: realpath keeps it


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/sys/block with loop0 over FILE, loop1 over FILE unlinked while bound, loop2 over a file whose
    name starts like FILE's, loop3 unbound (no loop/ directory), a disk that is no loop device, and
    loop4 and loop5 over FILE set aside by a delete, before and after it was removed."""
    for name, backing in (
        ("loop0", FILE),
        ("loop1", FILE + " (deleted)"),  # as the kernel names a file unlinked while bound
        ("loop2", FILE + ".old"),
        ("loop3", None),
        ("sda", None),
        ("loop4", FILE + DOOMED),  # set aside by a delete (files.doomed), not yet removed
        ("loop5", FILE + DOOMED + " (deleted)"),  # and removed since
    ):
        device = tmp_path / name
        device.mkdir()
        if backing is not None:
            (device / "loop").mkdir()
            (device / "loop" / "backing_file").write_text(backing + "\n")
    monkeypatch.setattr(loopfind, "SYS_BLOCK", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("path", "unlinked", "expected"),
    [
        pytest.param(FILE, False, ["/dev/loop0"], id="the-file-at-the-path"),
        pytest.param(FILE, True, ["/dev/loop0", "/dev/loop1"], id="and-one-unlinked-from-it"),
        pytest.param(FILE + ".old", True, ["/dev/loop2"], id="a-longer-name-is-another-file"),
        pytest.param("/nonexistent-ballast/volumes/lv-2.img", True, [], id="an-unbound-path"),
    ],
)
def test_backed_by_finds_devices_by_the_name_sysfs_gives_their_file(
    sysfs: Path, path: str, unlinked: bool, expected: list[str]
) -> None:
    assert loop.backed_by(path, unlinked=unlinked) == expected


ALL_OF_FILE = ["/dev/loop0", "/dev/loop1", "/dev/loop4", "/dev/loop5"]


@pytest.mark.parametrize(
    ("ask", "expected"),
    [
        pytest.param(lambda d: d.users(FILE), ALL_OF_FILE, id="users-refuse-a-delete"),
        pytest.param(lambda d: d.leftovers(FILE), ALL_OF_FILE, id="leftovers-an-unstage-undoes"),
        pytest.param(
            lambda d: loop.backed_by(FILE, unlinked=True, renamed=(DOOMED,)), ALL_OF_FILE, id="loop"
        ),
    ],
)
def test_a_file_a_delete_set_aside_is_still_the_volumes(
    sysfs: Path, ask: Callable[[LoopDevices], list[str]], expected: list[str]
) -> None:
    """A stage that bound a device over the file just before a delete renamed it `<file>.deleting`:
    sysfs names it so, then `<file>.deleting (deleted)`; the unstage (or the failed stage) must find it."""
    assert ask(LoopDevices(loop)) == expected


def test_release_detaches_the_devices_over_a_file_a_delete_set_aside(
    sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    detached: list[str] = []
    monkeypatch.setattr(loop, "_detach_device", lambda device, names=None: detached.append(device))
    LoopDevices(loop).release(FILE)  # no file there any more: every device sysfs names after it
    assert detached == ["/dev/loop1", "/dev/loop4", "/dev/loop5"]


def test_a_device_unbound_while_a_scan_reads_it_counts_as_unbound(
    sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process detaches loop0 between the listing and the read: sysfs answers ENODEV."""
    real_open = open

    def racing_open(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == str(sysfs / "loop0" / "loop" / "backing_file"):
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(loopfind, "open", racing_open, raising=False)  # the name csi.loopfind looks up first
    assert loop.backing_file("/dev/loop0") is None
    assert loop.backed_by(FILE, unlinked=True) == ["/dev/loop1"]
