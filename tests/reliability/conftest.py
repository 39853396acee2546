"""Shared helpers for the reliability suite: the real driver as a killable process group, the
state-versus-disk check, a small real filesystem to fill, and a leak check that cleans up first.

Every fixture here removes what it made (mounts, loop devices, processes) in its finalizer, and fails
the test when something was left behind, so a failing test never leaks into the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from benchmarks.common import removed
from csi import loop, loopfind
from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conformance.driver import Driver, start_driver
from tests.conftest import require_root, require_tool
from tests.integration.conftest import force_clean, leftovers

MiB = 1024**2
AM = csi_pb2.VolumeCapability.AccessMode
RETRYABLE = (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def mount_cap(fs_type: str = "ext4", mode: AM.Mode = AM.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs_type), access_mode=AM(mode=mode)
    )


def kill_group(driver: Driver) -> None:
    """SIGKILL the driver and every process it started (mkfs, mount...), as a container kill does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait(10)
    deadline = time.monotonic() + 10
    while group_alive(driver.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(driver: Driver) -> None:
    """Graceful stop (SIGTERM), then make sure nothing of the process group survives."""
    driver.stop()
    if group_alive(driver.proc.pid):
        kill_group(driver)


def retry(call: Callable[..., Any], request: Any, attempts: int = 100) -> Any:
    """Call until it stops answering ABORTED/UNAVAILABLE (an operation still settling after a restart)."""
    for _ in range(attempts):
        try:
            return call(request, timeout=60)
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE:
                raise
            time.sleep(0.1)
    raise AssertionError(f"{type(request).__name__} never succeeded")


# ---------------------------------------------------------------------------- state versus disk


@dataclass(frozen=True)
class DiskState:
    volume_rows: dict[str, int]  # id -> recorded size
    snapshot_rows: dict[str, int]
    volume_files: dict[str, int]  # id -> file size
    snapshot_files: dict[str, int]
    names: dict[str, str]  # volume name -> id


def read_state(data_dir: Path) -> DiskState:
    """The state database (read-only) and the files beside it, once a running driver has removed the
    files of the deletes it answered (benchmarks.common.removed; one still there after 10 s is read)."""
    removed(data_dir / "volumes", data_dir / "snapshots", timeout=10)
    con = sqlite3.connect(f"{(data_dir / 'state.db').as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        vols = con.execute("SELECT id, name, size FROM volumes").fetchall()
        snaps = con.execute("SELECT id, size FROM snapshots").fetchall()
    finally:
        con.close()

    def files(sub: str) -> dict[str, int]:
        d = data_dir / sub
        return {p.name.removesuffix(".img"): p.stat().st_size for p in d.iterdir()} if d.is_dir() else {}

    return DiskState(
        volume_rows={i: s for i, _, s in vols},
        snapshot_rows=dict(snaps),
        volume_files=files("volumes"),
        snapshot_files=files("snapshots"),
        names={n: i for i, n, _ in vols},
    )


def assert_consistent(data_dir: Path) -> DiskState:
    """Every record has its file (at least the recorded size) and every file has its record."""
    st = read_state(data_dir)
    assert set(st.volume_files) == set(st.volume_rows), (
        f"volume files without a record: {set(st.volume_files) - set(st.volume_rows)}; "
        f"records without a file: {set(st.volume_rows) - set(st.volume_files)}"
    )
    assert set(st.snapshot_files) == set(st.snapshot_rows), (
        f"snapshot files without a record: {set(st.snapshot_files) - set(st.snapshot_rows)}; "
        f"records without a file: {set(st.snapshot_rows) - set(st.snapshot_files)}"
    )
    for vid, size in st.volume_rows.items():
        assert st.volume_files[vid] >= size, f"{vid}: file {st.volume_files[vid]} < record {size}"
    return st


# ---------------------------------------------------------------------------- leaks


def loops_over(directory: Path) -> list[str]:
    out = []
    for dev in loopfind.bound_devices():
        backing = loop.backing_file(dev) or ""
        if backing.startswith(str(directory) + "/"):
            out.append(dev)
    return out


@pytest.fixture
def leak_check(tmp_path: Path) -> Iterator[Path]:
    """Yields tmp_path; afterwards no mount under it and no loop device over a file in it may remain."""
    yield tmp_path
    mounts, loops = leftovers(tmp_path, tmp_path)
    force_clean(tmp_path, tmp_path)
    assert not mounts and not loops, f"leaked mounts {mounts} and loop devices {loops}"


@pytest.fixture
def root_tools() -> None:
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck", "resize2fs", "mount", "umount"):
        require_tool(tool)


# ---------------------------------------------------------------------------- the driver process


@dataclass
class Proc:
    """Start/kill/restart the real driver on one workdir and data dir; tracks every process group."""

    workdir: Path
    data_dir: Path
    extra: tuple[str, ...] = ()
    current: Driver | None = None

    @property
    def record(self) -> Path:
        """Where an armed failpoint writes its name and pid before the kill."""
        return self.workdir / "failpoints.record"

    def start(self, failpoint: str = "") -> Driver:
        """Start the driver (after killing what is left of the previous one), with `failpoint` armed."""
        self.kill()
        env = {"BALLAST_FAILPOINTS": failpoint, "BALLAST_FAILPOINTS_RECORD": str(self.record)}
        self.current = start_driver(self.workdir, *self.extra, data_dir=self.data_dir, env=env)
        return self.current

    def kill(self) -> None:
        if self.current is not None:
            kill_group(self.current)

    def stop(self) -> None:
        if self.current is not None:
            stop_group(self.current)

    def restart(self) -> Driver:
        self.kill()
        return self.start()


@pytest.fixture
def proc(leak_check: Path, root_tools: None) -> Iterator[Proc]:
    """The driver (all services, local backend) in a process group; killed and leak-checked after."""
    p = Proc(workdir=leak_check, data_dir=leak_check / "data")
    try:
        yield p
    finally:
        p.kill()
        if p.current is not None:
            assert not group_alive(p.current.proc.pid), "a process of the driver outlived the test"


# ---------------------------------------------------------------------------- a small filesystem


@pytest.fixture
def small_fs(leak_check: Path, root_tools: None) -> Iterator[Path]:
    """A 64 MiB ext4 filesystem on a loop device, mounted at tmp_path/small; removed afterwards."""
    image, point = leak_check / "small.img", leak_check / "small"
    with open(image, "wb") as f:
        f.truncate(64 * MiB)
    subprocess.run(
        [require_tool("mkfs.ext4"), "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True
    )
    point.mkdir()
    device = loop.attach(str(image))
    try:
        subprocess.run([require_tool("mount"), device, str(point)], check=True, capture_output=True)
        try:
            yield point
        finally:
            force_clean(point, point)  # anything a test left mounted inside
            for _ in range(3):
                if not Mounter().unmount(str(point)):
                    break
    finally:
        loop.detach_file(str(image))


def fill(directory: Path, leave: int = 0) -> Path:
    """Allocate every free byte of `directory`'s filesystem but `leave` into one file; returns it."""
    filler = directory / "filler"
    st = os.statvfs(directory)
    size = st.f_bavail * st.f_frsize - leave
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        step = 4 * MiB
        done = 0
        while done < size:
            try:
                os.posix_fallocate(fd, done, min(step, size - done))
            except OSError:
                break
            done += step
    finally:
        os.close(fd)
    return filler


def fill_up(directory: Path) -> list[Path]:
    """fill(), then write the last few blocks fallocate left, one at a time: not a block is free
    after. Returns the files written (delete them to free the space again)."""
    filler, pad = fill(directory), directory / "pad"
    with open(pad, "ab", buffering=0) as f, contextlib.suppress(OSError):  # unbuffered: none left to flush
        while f.write(b"\0" * 4096):
            pass
    return [filler, pad]
