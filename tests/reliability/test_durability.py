"""Power loss: an acknowledged CreateVolume, CreateSnapshot or ControllerExpandVolume is on stable storage
before its reply is sent, in the order docs/recovery.md ("Power loss") documents.

The driver runs under strace, which records every fsync/fdatasync (with the path of its descriptor) and
every message written to a socket, with timestamps. For each operation the trace must show, before the
reply leaves (the first socket write carrying the reply's bytes): the new file's fsync, then its
directory's, then the state database's WAL sync -- or, for an expand, the WAL sync, then the file's.

Where the kernel has device-mapper, test_acknowledged_work_survives_dropped_writes also puts the data dir
on a dm-flakey target, drops every write that was not flushed when the replies came, remounts, and
finds everything that was acknowledged.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from csi import loop
from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conformance.driver import Driver, start_driver
from tests.conftest import require_tool
from tests.csiclient import CsiClient, connect
from tests.reliability.conftest import MiB, assert_consistent, kill_group, mount_cap

pytestmark = [pytest.mark.root, pytest.mark.slow]
SYNCS = ("fsync", "fdatasync")
LINE = re.compile(r"^(\d+)\s+(\d+\.\d+) (\w+)\((\d+)<([^>]*)>(.*)$")
HEX = re.compile(r"\\x([0-9a-f]{2})")


@dataclass(frozen=True)
class Syscall:
    seq: int
    time: float
    name: str
    path: str  # what the descriptor names (a file, a directory, socket:[inode])
    data: bytes  # the bytes of a socket write


def _bytes(text: str) -> bytes:
    return bytes(int(h, 16) for h in HEX.findall(text))


def parse(trace: Path) -> list[Syscall]:
    """The trace's syscalls in time order (strace -f -ttt -y -xx)."""
    calls = []
    for line in trace.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            path = _bytes(m.group(5)).decode(errors="replace")
            data = _bytes(m.group(6)) if m.group(3).startswith("send") else b""
            calls.append((float(m.group(2)), m.group(3), path, data))
    calls.sort(key=lambda c: c[0])
    return [Syscall(i, t, name, path, data) for i, (t, name, path, data) in enumerate(calls)]


def traced_until(trace: Path, reply: bytes, timeout: float = 30.0) -> list[Syscall]:
    """The trace once it holds the socket write carrying `reply`. strace writes its file on its own
    schedule, behind the traced process under load, so the reply reaching the client does not mean
    the trace shows it yet."""
    deadline = time.monotonic() + timeout
    while True:
        calls = parse(trace)
        if any(c.name.startswith("send") and reply in c.data for c in calls) or time.monotonic() > deadline:
            return calls
        time.sleep(0.05)


def first(calls: list[Syscall], after: Syscall | None, what: str, match: object) -> Syscall:
    """The first call after `after` that `match`es (a sync of a path, or a send carrying bytes)."""
    start = after.seq + 1 if after else 0
    for call in calls[start:]:
        if isinstance(match, bytes):
            if call.name.startswith("send") and match in call.data:
                return call
        elif call.name in SYNCS and call.path == match:
            return call
    raise AssertionError(f"no {what} after {after}")


@dataclass
class Traced:
    driver: Driver
    client: CsiClient
    trace: Path
    data: Path


@pytest.fixture
def traced(leak_check: Path, root_tools: None) -> Iterator[Traced]:
    strace = require_tool("strace")
    trace = leak_check / "trace"
    wrapper = [
        strace, "-f", "-qq", "-e", "signal=none", "-ttt", "-y", "-xx", "-s", "4096",
        "-e", "trace=fsync,fdatasync,sendmsg,sendto,write,writev", "-o", str(trace),
    ]  # fmt: skip
    driver = start_driver(leak_check, "--log-level", "warning", wrapper=wrapper)
    client = connect(driver.endpoint)
    try:
        yield Traced(driver, client, trace, driver.data_dir)
    finally:
        client.close()
        kill_group(driver)


def _reply_frame(message: bytes) -> bytes:
    """The gRPC length-prefixed frame of a reply: what the server writes to the socket."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _create(t: Traced, name: str, **source: str) -> str:
    req = csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
        volume_capabilities=[mount_cap()],
    )
    if "volume" in source:
        req.volume_content_source.volume.volume_id = source["volume"]
    return str(t.client.controller.CreateVolume(req, timeout=60).volume.volume_id)


def assert_file_dir_record_reply(t: Traced, kind: str, object_id: str) -> None:
    """fsync(<kind>/<id>.img) < fsync(<kind>/) < WAL sync < the reply carrying the id."""
    calls = traced_until(t.trace, object_id.encode())
    directory = str(t.data / kind)
    file_sync = first(calls, None, f"fsync of the new {kind} file", f"{directory}/{object_id}.img")
    dir_sync = first(calls, file_sync, f"fsync of {directory}", directory)
    wal_sync = first(calls, dir_sync, "sync of the state database's WAL", str(t.data / "state.db-wal"))
    reply = first(calls, None, "reply", object_id.encode())
    assert reply.seq > wal_sync.seq, "the reply left before the record was durable"


def test_create_and_clone_sync_file_then_directory_then_record_before_the_reply(traced: Traced) -> None:
    volume = _create(traced, "durable")
    assert_file_dir_record_reply(traced, "volumes", volume)
    clone = _create(traced, "durable-clone", volume=volume)
    assert_file_dir_record_reply(traced, "volumes", clone)
    assert_consistent(traced.data)


def test_snapshot_syncs_file_then_directory_then_record_before_the_reply(traced: Traced) -> None:
    volume = _create(traced, "snapped")
    snap = traced.client.controller.CreateSnapshot(
        csi_pb2.CreateSnapshotRequest(name="durable-snap", source_volume_id=volume), timeout=60
    ).snapshot.snapshot_id
    assert_file_dir_record_reply(traced, "snapshots", snap)


def test_expand_records_then_syncs_the_grown_file_before_the_reply(traced: Traced) -> None:
    volume = _create(traced, "grown")
    request = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume, capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB)
    )
    reply = traced.client.controller.ControllerExpandVolume(request, timeout=60)
    assert reply.capacity_bytes == 64 * MiB
    calls = traced_until(traced.trace, _reply_frame(reply.SerializeToString()))
    path = str(traced.data / "volumes" / f"{volume}.img")
    created = first(calls, None, "fsync at create", path)
    wal = first(calls, created, "sync of the new size", str(traced.data / "state.db-wal"))
    wal = first(calls, wal, "sync of the new size", str(traced.data / "state.db-wal"))  # past the create's
    grown = first(calls, wal, "fsync of the grown file", path)
    sent = first(calls, created, "expand reply", _reply_frame(reply.SerializeToString()))
    assert grown.seq < sent.seq, "the reply left before the grown file was synced"
    assert os.stat(path).st_size == 64 * MiB


# ---------------------------------------------------------------------------- dm-flakey (kernels with it)


def _device_mapper() -> str:
    """dmsetup's path when this kernel offers dm-flakey; otherwise skip, saying why.

    The skip is about the kernel, not a tool: without device-mapper in the running kernel there is no
    target to drop writes with, and CI cannot install a kernel. (dmsetup itself is a tool: when the
    kernel has the target, a missing dmsetup fails in CI like any other.) The strace tests above check
    the order of writes on every kernel.
    """
    if os.path.exists("/sbin/modprobe") or os.path.exists("/usr/sbin/modprobe"):
        subprocess.run(["modprobe", "-q", "dm_flakey"], capture_output=True, check=False)
    if not os.path.exists("/dev/mapper/control") and "device-mapper" not in Path("/proc/misc").read_text():
        pytest.skip("this kernel has no device-mapper (no /dev/mapper/control, modprobe dm_flakey failed)")
    dmsetup = require_tool("dmsetup")
    targets = subprocess.run([dmsetup, "targets"], capture_output=True, text=True, check=False).stdout
    if "flakey" not in targets:
        pytest.skip("this kernel's device-mapper has no flakey target (CONFIG_DM_FLAKEY is off)")
    return dmsetup


@dataclass
class Flakey:
    dmsetup: str
    name: str
    backing: str  # the loop device under it
    sectors: int

    @property
    def device(self) -> str:
        return f"/dev/mapper/{self.name}"

    def load(self, table: str) -> None:
        """Swap the table without flushing the filesystem above (what a power cut gives)."""
        run = [self.dmsetup]
        subprocess.run([*run, "suspend", "--nolockfs", "--noflush", self.name], check=True)
        subprocess.run([*run, "load", self.name, "--table", table], check=True)
        subprocess.run([*run, "resume", self.name], check=True)

    def up(self) -> str:
        return f"0 {self.sectors} flakey {self.backing} 0 600 0"

    def dropping(self) -> str:
        return f"0 {self.sectors} flakey {self.backing} 0 0 600 1 drop_writes"


@pytest.fixture
def flakey(leak_check: Path, root_tools: None) -> Iterator[Flakey]:
    dmsetup = _device_mapper()
    image = leak_check / "flakey.img"
    with open(image, "wb") as f:
        f.truncate(256 * MiB)
    device = loop.attach(str(image))
    dm = Flakey(dmsetup, f"ballast-flakey-{os.getpid()}", device, 256 * MiB // 512)
    subprocess.run([dmsetup, "create", dm.name, "--table", dm.up()], check=True)
    try:
        subprocess.run([require_tool("mkfs.ext4"), "-q", "-F", dm.device], check=True, capture_output=True)
        yield dm
    finally:
        for point in [m.mount_point for m in Mounter().mounts() if m.source == dm.device]:
            Mounter().unmount(point)
        subprocess.run([dmsetup, "remove", "--retry", dm.name], check=False)
        loop.detach_file(str(image))


def test_acknowledged_work_survives_dropped_writes(flakey: Flakey, leak_check: Path) -> None:
    fs = leak_check / "fs"
    fs.mkdir()
    subprocess.run(["mount", flakey.device, str(fs)], check=True)
    driver = start_driver(leak_check / "run", data_dir=fs / "data")
    client = connect(driver.endpoint)
    try:
        volume = _create(Traced(driver, client, Path(), fs / "data"), "acknowledged")
        snap = client.controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name="acknowledged-snap", source_volume_id=volume), timeout=60
        ).snapshot.snapshot_id
        client.controller.ControllerExpandVolume(
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id=volume, capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB)
            ),
            timeout=60,
        )
        flakey.load(flakey.dropping())  # the power cut: nothing unflushed reaches the disk any more
    finally:
        client.close()
        kill_group(driver)
    Mounter().unmount(str(fs))
    subprocess.run(["blockdev", "--flushbufs", flakey.device], check=True)  # forget cached blocks
    flakey.load(flakey.up())
    subprocess.run(["mount", flakey.device, str(fs)], check=True)
    try:
        st = assert_consistent(fs / "data")
        assert st.volume_rows == {volume: 64 * MiB} and st.volume_files[volume] == 64 * MiB
        assert set(st.snapshot_rows) == {snap}
    finally:
        Mounter().unmount(str(fs))


# ---------------------------------------------------------------------------- group commit under strace

TIMED = re.compile(r"^(\d+)\s+(\d+\.\d+) (\w+)\(([-\w]+)<([^>]*)>(.*?)(?: <unfinished \.\.\.>)?$")
RESUMED = re.compile(r"^(\d+)\s+(\d+\.\d+) <\.\.\. (\w+) resumed>.*<(\d+\.\d+)>$")
DURATION = re.compile(r"<(\d+\.\d+)>$")
QUOTED = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')


@dataclass(frozen=True)
class Span:
    """One system call with when it started and ended (strace -ttt -T), splitting across threads."""

    start: float
    end: float
    name: str
    path: str
    data: bytes  # the bytes written (pwrite64, send*)


def spans(trace: Path) -> list[Span]:
    """Every traced call as a Span; an `<unfinished ...>` line is joined with its `resumed` line."""
    out: list[Span] = []
    open_calls: dict[tuple[str, str], tuple[float, str, bytes]] = {}
    for line in trace.read_text(errors="replace").splitlines():
        resumed = RESUMED.match(line)
        if resumed:
            started = open_calls.pop((resumed.group(1), resumed.group(3)), None)
            if started is not None:
                end = float(resumed.group(2))
                out.append(Span(started[0], end, resumed.group(3), started[1], started[2]))
            continue
        m = TIMED.match(line)
        if not m:
            continue
        start, name = float(m.group(2)), m.group(3)
        path = _bytes(m.group(5)).decode(errors="replace")
        if name == "openat":  # the descriptor is AT_FDCWD: the path is the quoted argument
            quoted = QUOTED.search(m.group(6))
            path = _bytes(quoted.group(1)).decode(errors="replace") if quoted else ""
        data = _bytes(m.group(6)) if name.startswith(("send", "pwrite")) else b""
        if line.endswith("<unfinished ...>"):
            open_calls[(m.group(1), name)] = (start, path, data)
            continue
        took = DURATION.search(line)
        out.append(Span(start, start + (float(took.group(1)) if took else 0.0), name, path, data))
    return sorted(out, key=lambda s: s.start)


def test_concurrent_creates_share_syncs_and_each_reply_waits_for_its_own_record(
    leak_check: Path, root_tools: None
) -> None:
    """Group commit: creates arriving together share directory fsyncs and WAL syncs, and still every
    reply leaves only after its own file was synced, then a directory fsync that started after the file
    was made, then a WAL sync that started after the WAL write holding its record."""
    strace = require_tool("strace")
    trace = leak_check / "trace"
    wrapper = [
        strace, "-f", "-qq", "-e", "signal=none", "-ttt", "-T", "-y", "-xx", "-s", "4096",
        "-e", "trace=openat,fsync,fdatasync,pwrite64,sendmsg,sendto,write,writev", "-o", str(trace),
    ]  # fmt: skip
    driver = start_driver(leak_check, "--log-level", "warning", wrapper=wrapper)
    clients = [connect(driver.endpoint) for _ in range(8)]
    try:
        t = Traced(driver, clients[0], trace, driver.data_dir)
        with ThreadPoolExecutor(len(clients)) as pool:
            ids = list(
                pool.map(
                    lambda i: _create(Traced(driver, clients[i % 8], trace, t.data), f"group-{i}"), range(32)
                )
            )
        calls = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            calls = spans(trace)
            sent = b"".join(c.data for c in calls if c.name.startswith("send"))
            if all(v.encode() in sent for v in ids):
                break
            time.sleep(0.1)
    finally:
        for client in clients:
            client.close()
        kill_group(driver)
    volumes, wal = str(t.data / "volumes"), str(t.data / "state.db-wal")
    dir_syncs = [c for c in calls if c.name in SYNCS and c.path == volumes]
    wal_syncs = [c for c in calls if c.name in SYNCS and c.path == wal]
    for vid in ids:
        image = f"{volumes}/{vid}.img"
        made = next(c for c in calls if c.name == "openat" and c.path == image)
        synced = next(c for c in calls if c.name in SYNCS and c.path == image)
        record = next(c for c in calls if c.name == "pwrite64" and c.path == wal and vid.encode() in c.data)
        reply = next(c for c in calls if c.name.startswith("send") and vid.encode() in c.data)
        directory = next((d for d in dir_syncs if d.start >= made.end and d.end <= record.start), None)
        assert synced.end <= record.start, f"{vid}: its record was written before its file was synced"
        assert directory is not None, f"{vid}: no directory fsync between its file and its record"
        covering = next((w for w in wal_syncs if w.start >= record.end), None)
        assert covering is not None and covering.end <= reply.start, (
            f"{vid}: the reply left before a WAL sync that started after its record finished"
        )
    assert len(wal_syncs) < len(ids), "every create synced alone: nothing was group-committed"
    assert len(dir_syncs) < len(ids), "every create synced the directory alone"
    assert_consistent(t.data)
