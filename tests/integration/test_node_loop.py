"""csi/loop.py on real loop devices: attach is idempotent, capacity follows the file, detach is clean."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csi import devices, loop, loopfind
from csi.backends.local.devices import LoopDevices
from csi.failures import NotFoundError
from csi.mount import Mounter
from tests.conftest import REPO, require_root, require_tool
from tests.integration.conftest import loop_filesystem, write_mbr

MiB = 1024**2


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[str]:
    require_root()
    path = tmp_path / "vol.img"
    with open(path, "wb") as fh:
        fh.truncate(32 * MiB)
    yield str(path)
    loop.detach_file(str(path))
    assert loopfind.devices_for(os.stat(path)) == [], "loop device leaked"


def test_attach_reuses_the_device_bound_to_the_file(backing: str) -> None:
    first = loop.attach(backing)
    assert first.startswith("/dev/loop")
    assert loop.attach(backing) == first
    assert loop.backing_file(first) == backing


def test_attach_gives_distinct_files_distinct_devices(backing: str, tmp_path: Path) -> None:
    other = tmp_path / "other.img"
    other.write_bytes(b"\0" * MiB)
    try:
        a, b = loop.attach(backing), loop.attach(str(other))
        assert a != b
        assert loop.backing_file(a) == backing and loop.backing_file(b) == str(other)
    finally:
        loop.detach_file(str(other))


def test_a_broken_device_of_someone_else_does_not_fail_the_scan(backing: str, tmp_path: Path) -> None:
    """A device whose backing file sits on a shut-down filesystem answers LOOP_GET_STATUS64 with EIO."""
    xfs_io = require_tool("xfs_io")
    ours = loop.attach(backing)
    with loop_filesystem(tmp_path, "xfs", 300 * MiB) as mnt:
        inner = mnt / "inner.img"
        inner.write_bytes(b"\0" * MiB)
        broken = subprocess.run(
            ["losetup", "--find", "--show", str(inner)], check=True, capture_output=True, text=True
        ).stdout.strip()
        try:
            subprocess.run([xfs_io, "-x", "-c", "shutdown", str(mnt)], check=True)
            assert loopfind.status(broken) is None
            assert loopfind.devices_for(os.stat(backing)) == [ours]
            assert loopfind.bound_files()[(os.stat(backing).st_dev, os.stat(backing).st_ino)] == [ours]
        finally:
            subprocess.run(["losetup", "-d", broken], check=False)


def test_a_read_only_flag_left_on_a_free_device_is_not_inherited(backing: str) -> None:
    for _ in range(5):  # the kernel hands out the lowest free device; another process may take it first
        ctl = os.open("/dev/loop-control", os.O_RDWR)
        try:
            free = f"/dev/loop{fcntl.ioctl(ctl, loop.LOOP_CTL_GET_FREE)}"
        finally:
            os.close(ctl)
        devices.set_device_readonly(free, True)
        try:
            device = loop.attach(backing)
            readonly = devices.device_readonly(device)
            if device == free:
                break
            loop.detach_file(backing)
        finally:
            devices.set_device_readonly(free, False)
    else:
        pytest.fail("the free loop device was taken by another process every time")
    assert not readonly


def test_maps_is_true_for_the_bound_inode_only(backing: str, tmp_path: Path) -> None:
    device = loop.attach(backing)
    alias = tmp_path / "alias.img"
    alias.symlink_to(backing)
    assert loop.maps(device, backing) and loop.maps(device, str(alias))
    impostor = tmp_path / "impostor.img"
    os.rename(backing, impostor)  # same path name, another inode behind it
    with open(backing, "wb") as fh:
        fh.truncate(32 * MiB)
    try:
        assert not loop.maps(device, backing)
        assert loop.maps(device, str(impostor))
    finally:
        loop.detach_file(str(impostor))
    assert not loop.maps(device, str(impostor))  # unbound
    assert not loop.maps(device, str(tmp_path / "gone.img"))


def test_family_is_the_device_and_its_partitions(backing: str, tmp_path: Path) -> None:
    write_mbr(backing, 2048, 8 * MiB // 512)
    device = loop.attach(backing)
    part = devices.partition_path(device, 1)
    Mounter().add_partitions(device)  # as staging does where the kernel's own scan made no node
    assert os.path.exists(part)
    other = tmp_path / "other.img"
    other.write_bytes(b"\0" * MiB)
    try:
        stranger = loop.attach(str(other))
        members = devices.family(device)
        assert members == {devices.rdev(device), devices.rdev(part)}
        assert devices.family(part) == {devices.rdev(part)}, "a partition has no partitions of its own"
        assert devices.rdev(stranger) not in members
        assert devices.belongs(devices.rdev(part), device) and not devices.belongs(
            devices.rdev(part), stranger
        )
        assert not devices.belongs((0, devices.rdev(device)[1]), device), "major 0 is never a device"
        assert devices.family(backing) == frozenset(), "a regular file is no block device"
        assert devices.family(str(tmp_path / "gone")) == frozenset()
    finally:
        loop.detach_file(str(other))


def test_refresh_capacity_picks_up_a_grown_file(backing: str) -> None:
    device = loop.attach(backing)
    assert loop.device_size(device) == 32 * MiB
    os.truncate(backing, 48 * MiB)
    loop.refresh_capacity(device)
    assert loop.device_size(device) == 48 * MiB


def test_detach_is_idempotent(backing: str) -> None:
    device = loop.attach(backing)
    loop.detach_file(backing)
    assert loop.backing_file(device) != backing
    loop.detach_file(backing)


def test_a_file_unlinked_while_bound_is_found_and_detached_by_the_path_it_had(backing: str) -> None:
    """A volume deleted while staged: its device outlives the file, and only sysfs still names it."""
    device = loop.attach(backing)
    os.unlink(backing)
    try:
        assert loop.backing_file(device) == backing + loopfind.UNLINKED
        assert loop.backed_by(backing) == [] and loop.backed_by(backing, unlinked=True) == [device]
        loop.detach_file(backing)
        assert loop.backed_by(backing, unlinked=True) == [], "detached"
        loop.detach_file(backing)  # idempotent
    finally:
        if loop.backing_file(device) == backing + " (deleted)":  # only this device, still over that file
            subprocess.run(["losetup", "-d", device], check=False)
        open(backing, "wb").close()  # for the fixture's own check


def _no_scan() -> list[str]:
    raise AssertionError("scanned the loop devices")


def test_a_file_nobody_holds_needs_no_scan(backing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel grants a write lease only on a file no other open file refers to, and a bound device
    holds its backing file open: so an unheld file is bound nowhere, found without reading sysfs."""
    with monkeypatch.context() as scans:
        scans.setattr(loopfind, "bound_devices", _no_scan)
        assert loop.unheld(backing) and loop.devices_of(backing) == [] and loop.bound(backing) is None
        assert loop.backed_by(backing) == []
        device = loop.attach(backing)
    assert not loop.unheld(backing), "a bound device holds its file"
    assert loop.attach(backing) == device == loop.bound(backing), "found by the scan"
    loop.detach_file(backing)
    with monkeypatch.context() as scans:
        scans.setattr(loopfind, "bound_devices", _no_scan)
        assert loop.unheld(backing)
        loop.detach_file(backing)


def test_the_backends_device_is_proved_again_not_searched_for(
    backing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend remembers the device it proved for a file: later lookups and the release prove
    it again with one ioctl instead of scanning every loop device on the node."""
    devices = LoopDevices()
    size = os.stat(backing).st_size
    first = devices.resolve("v", backing, size, {})
    with monkeypatch.context() as scans:
        scans.setattr(loopfind, "bound_devices", _no_scan)
        assert devices.resolve("v", backing, size, {}) == first == devices.prepared("v", backing, size)
        devices.release(backing)
        assert loop.backing_file(first) != backing and devices.prepared("v", backing, size) is None


def test_a_remembered_device_that_moved_on_is_not_trusted(backing: str, tmp_path: Path) -> None:
    """Rebound to another file behind the backend's back, the remembered device is forgotten: the
    lookup finds the file's own device, and the release leaves the other file's device alone."""
    devices = LoopDevices()
    size = os.stat(backing).st_size
    first = devices.resolve("v", backing, size, {})
    other = tmp_path / "other.img"
    other.write_bytes(b"\0" * MiB)
    loop.detach_file(backing)
    fd = os.open(other, os.O_RDWR)
    try:
        assert loop._configure(first, fd, 0, str(other)), f"{first} serves another file now"
    finally:
        os.close(fd)
    try:
        second = loop.attach(backing)
        assert second != first and devices.prepared("v", backing, size) == second
        devices.release(backing)
        assert loopfind.devices_for(os.stat(backing)) == []
        assert loop.backing_file(first) == str(other), "the other file's device stays"
    finally:
        loop.detach_file(str(other))


def test_a_release_detaches_every_device_over_the_file(backing: str) -> None:
    devices = LoopDevices()
    first = devices.resolve("v", backing, os.stat(backing).st_size, {})
    extra = subprocess.run(
        ["losetup", "--find", "--show", backing], capture_output=True, text=True, check=True
    ).stdout.strip()  # a second device over the same file, bound by someone else
    try:
        devices.release(backing)
        assert loopfind.devices_for(os.stat(backing)) == [], f"{first} and {extra} both released"
    finally:
        if loop.maps(extra, backing):
            subprocess.run(["losetup", "-d", extra], check=False)


@pytest.mark.parametrize(
    "refusal",
    [errno.EAGAIN, errno.EINVAL, errno.EACCES],
    ids=["held-open-elsewhere", "leases-disabled", "not-owner"],
)
def test_without_a_lease_the_scan_still_finds_the_device(
    backing: str, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    device = loop.attach(backing)
    real = fcntl.fcntl

    def refused(fd: int, cmd: int, *args: Any) -> Any:
        if cmd == fcntl.F_SETLEASE:
            raise OSError(refusal, os.strerror(refusal))
        return real(fd, cmd, *args)

    monkeypatch.setattr(fcntl, "fcntl", refused)
    assert not loop.unheld(backing)
    assert loop.attach(backing) == device == loop.bound(backing)
    loop.detach_file(backing)
    assert loop.backing_file(device) != backing


# A process asking `unheld` whose lease the kernel keeps for a second: time for another to open the file.
_SLOW_LEASE = """
import fcntl, sys, time
from csi import loopfind
real = fcntl.fcntl
def slow(fd, cmd, arg=0):
    out = real(fd, cmd, arg)
    if cmd == fcntl.F_SETLEASE and arg == fcntl.F_WRLCK:
        print("leased", flush=True)
        time.sleep(1)
    return out
fcntl.fcntl = slow
print(loopfind.unheld(sys.argv[1]), flush=True)
"""


def test_an_open_while_the_lease_is_held_waits_and_the_asker_lives_on(backing: str) -> None:
    """The kernel signals a lease holder when another process opens its file (SIGIO by default, which
    ends a process that does not handle it): the driver must live through that, and the open wait."""
    asker = subprocess.Popen(
        [sys.executable, "-c", _SLOW_LEASE, backing], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert asker.stdout is not None and asker.stdout.readline() == "leased\n"
        started = time.monotonic()
        with open(backing, "rb"):
            waited = time.monotonic() - started
        assert asker.wait(30) == 0, f"the asker died (signal {-asker.returncode})"
        assert asker.stdout.read() == "True\n" and waited > 0.2, "the open waited for the lease"
    finally:
        asker.kill()
        asker.wait()


def test_a_file_this_process_cannot_read_is_still_found(
    backing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = loop.attach(backing)

    def refused(path: str, flags: int = os.O_RDONLY) -> int | None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(loopfind, "open_file", refused)
    assert loop.devices_of(backing) == [device] and not loop.unheld(backing)


def test_a_file_open_elsewhere_is_held(backing: str, tmp_path: Path) -> None:
    with open(backing, "rb"):
        assert not loop.unheld(backing)
    assert loop.unheld(backing)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not loop.unheld(str(fifo)) and loop.devices_of(str(fifo)) == [], "never opened to block"
    assert not loop.unheld(str(tmp_path)) and not loop.unheld(str(tmp_path / "missing"))


def test_attach_of_a_missing_file_is_not_found(tmp_path: Path) -> None:
    require_root()
    with pytest.raises(NotFoundError):
        loop.attach(str(tmp_path / "missing.img"))


def test_autoclear_and_direct_io_are_off(backing: str) -> None:
    info = loopfind.status(loop.attach(backing))
    assert info is not None
    assert not info.lo_flags & loop.LO_FLAGS_AUTOCLEAR
    assert not info.lo_flags & loop.LO_FLAGS_DIRECT_IO


# What a kernel without the loop ioctls answers (the module then falls back to losetup).
_MISSING_IOCTLS = {loop.LOOP_CONFIGURE, loop.LOOP_SET_FD, loop.LOOP_CLR_FD, loop.LOOP_SET_CAPACITY}


def test_losetup_does_the_work_when_the_ioctls_are_missing(
    backing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fcntl.ioctl

    def old_kernel(fd: int, request: int, *args: Any) -> Any:
        if request in _MISSING_IOCTLS:
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        return real(fd, request, *args)

    monkeypatch.setattr(fcntl, "ioctl", old_kernel)  # the module csi.loop calls
    device = loop.attach(backing)
    assert loop.backing_file(device) == backing
    os.truncate(backing, 48 * MiB)
    loop.refresh_capacity(device)
    assert loop.device_size(device) == 48 * MiB
    loop.detach_file(backing)
    assert loopfind.devices_for(os.stat(backing)) == []


def test_attach_waits_for_a_delete_holding_the_file_and_binds_no_file_it_set_aside(backing: str) -> None:
    """The local backend's DeleteVolume sets the file aside holding an exclusive flock of it (devices.
    unused): an attach that opened the file before must not bind it after (a loop device over a file
    being deleted), in this process or another."""
    aside = backing + ".deleting"
    outcome: dict[str, object] = {}

    def attach() -> None:
        try:
            outcome["device"] = loop.attach(backing)
        except NotFoundError as exc:
            outcome["error"] = exc

    fd = os.open(backing, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        attaching = threading.Thread(target=attach)
        attaching.start()
        attaching.join(0.5)
        assert attaching.is_alive(), f"bound while a delete held the file: {outcome}"
        os.rename(backing, aside)
    finally:
        os.close(fd)
    attaching.join()
    try:
        assert isinstance(outcome.get("error"), NotFoundError), outcome
        assert loopfind.devices_for(os.stat(aside)) == [], "no device over the file set aside"
    finally:
        loop.detach_file(aside)
        os.rename(aside, backing)
