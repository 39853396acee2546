"""GetMetadataDelta between two snapshots of a 10 GiB volume with 1% of its blocks changed, on both paths
of the local backend: the reflink path (data dir on xfs with reflink=1) and the fallback path (data dir
on ext4). Needs root, and free disk for the fallback path's three full copies of the written data
(--fill 0.5 of 10 GiB: about 16 GiB; the benchmark checks first, so a shared machine never fills up).

Each path gets its own filesystem on a loop device (direct I/O, so reads reach the disk instead of the
host's cache of the image file). The first --fill of the volume is written with data, the volume is
snapshotted, 1% of all its 64 KiB blocks (chosen at random over the whole volume, seeded) are
overwritten, and it is snapshotted again. The real driver (a subprocess)
then streams the delta over its socket, after the snapshot files were dropped from the page cache
(posix_fadvise, only these files). Every run checks the answer is exactly the changed blocks.
Reported per path: time (median of --runs), GiB of volume per second, and what the driver read: the
bytes its read calls asked for (rchar) and the bytes storage delivered (read_bytes), from /proc/<pid>/io.
Run: .venv/bin/python -m benchmarks.bench_cbt [--size-gib 10] [--fill 0.5] [--runs 3]
     [--paths reflink,fallback]
Writes benchmarks/results/cbt.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench_controller import wait_ready
from benchmarks.common import driver_log, filesystem, start_driver, stop_driver, write_result
from csi._proto import csi_pb2, csi_pb2_grpc

GiB, MiB = 1024**3, 1024**2
BLOCK = 64 * 1024  # the local backend's changed-block granularity
CHUNK = 64 * MiB
PATHS = {"reflink": ("xfs", ["-m", "reflink=1"]), "fallback": ("ext4", ["-E", "nodiscard"])}


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def _fill(path: Path, size: int, rng: random.Random) -> None:
    """The first `size` bytes of the volume written with data that differs from chunk to chunk."""
    pool = os.urandom(CHUNK)
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset in range(0, size, CHUNK):
            shift = rng.randrange(CHUNK)
            os.pwrite(fd, pool[shift:] + pool[:shift], offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _change(path: Path, blocks: list[int]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for index in blocks:
            os.pwrite(fd, os.urandom(BLOCK), index * BLOCK)
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(*paths: Path) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _io(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    return {k: int(v) for k, v in (line.split(": ") for line in lines)}


def _expected(blocks: list[int]) -> list[tuple[int, int]]:
    """The changed blocks as merged (offset, length) ranges: what VARIABLE_LENGTH must answer."""
    out: list[tuple[int, int]] = []
    for index in sorted(blocks):
        if out and out[-1][0] + out[-1][1] == index * BLOCK:
            out[-1] = (out[-1][0], out[-1][1] + BLOCK)
        else:
            out.append((index * BLOCK, BLOCK))
    return out


def _delta(stub: Any, base: str, target: str) -> list[tuple[int, int]]:
    req = csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=base, target_snapshot_id=target)
    return [
        (b.byte_offset, b.size_bytes)
        for r in stub.GetMetadataDelta(req, timeout=3600)
        for b in r.block_metadata
    ]


MARGIN = 8 * GiB  # left free on the machine's disk at all times


def measure(work: Path, name: str, size: int, fill: int, runs: int) -> dict[str, Any]:
    fs_type, options = PATHS[name]
    changed = size // 100
    used = (fill + changed) * (1 if name == "reflink" else 3) + changed  # volume + snapshots, shared or not
    st = os.statvfs(work)
    if st.f_bavail * st.f_frsize < used + MARGIN:
        raise SystemExit(f"{name}: needs {(used + MARGIN) / GiB:.1f} GiB free under {work}; lower --fill")
    with filesystem(work, fs_type, options, max(used + 2 * GiB, size + GiB)) as mnt:
        sock = work / "csi.sock"
        proc = start_driver(sock, mnt / "data", "--node-id", "bench-node")
        try:
            wait_ready(sock)
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                return _measure(channel, proc.pid, mnt / "data", (size, fill), runs, name)
        except BaseException:
            print(driver_log(sock)[-3000:])
            raise
        finally:
            stop_driver(proc)


def _measure(
    channel: Any, pid: int, data: Path, sizes: tuple[int, int], runs: int, name: str
) -> dict[str, Any]:
    size, fill = sizes
    ctl, stub = csi_pb2_grpc.ControllerStub(channel), csi_pb2_grpc.SnapshotMetadataStub(channel)
    cap = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )
    vol = ctl.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name="bench", volume_capabilities=[cap], capacity_range=csi_pb2.CapacityRange(required_bytes=size)
        ),
        timeout=60,
    ).volume
    volume_file = data / "volumes" / f"{vol.volume_id}.img"
    rng = random.Random(17)
    start = time.perf_counter()
    _fill(volume_file, fill, rng)
    fill_s = time.perf_counter() - start

    def snap(name: str) -> str:
        req = csi_pb2.CreateSnapshotRequest(name=name, source_volume_id=vol.volume_id)
        return str(ctl.CreateSnapshot(req, timeout=3600).snapshot.snapshot_id)

    start = time.perf_counter()
    base = snap("base")
    snapshot_s = time.perf_counter() - start
    changed = rng.sample(range(size // BLOCK), size // BLOCK // 100)
    _change(volume_file, changed)
    target = snap("target")
    files = [data / "snapshots" / f"{s}.img" for s in (base, target)]
    expected = _expected(changed)
    times, rchar, storage = [], [], []
    for _ in range(runs):
        _drop_cache(*files)
        before = _io(pid)
        start = time.perf_counter()
        got = _delta(stub, base, target)
        times.append(time.perf_counter() - start)
        after = _io(pid)
        assert got == expected, f"{name}: the delta is not the changed blocks"
        rchar.append(after["rchar"] - before["rchar"])
        storage.append(after["read_bytes"] - before["read_bytes"])
    median = statistics.median(times)
    return {
        "filesystem": PATHS[name][0] + (" reflink=1" if name == "reflink" else ""),
        "changed_blocks": len(changed),
        "changed_bytes": len(changed) * BLOCK,
        "ranges": len(expected),
        "delta_seconds": [round(t, 3) for t in times],
        "delta_median_seconds": round(median, 3),
        "volume_gib_per_second": round(size / GiB / median, 2),
        "driver_read_call_bytes": int(statistics.median(rchar)),
        "driver_storage_read_bytes": int(statistics.median(storage)),
        "read_vs_changed": round(statistics.median(rchar) / (len(changed) * BLOCK), 2),
        "setup": {"fill_seconds": round(fill_s, 1), "first_snapshot_seconds": round(snapshot_s, 2)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=int, default=10)
    parser.add_argument("--fill", type=float, default=0.5, help="share of the volume written before the base")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--paths", default="reflink,fallback")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_cbt needs root (loop devices, mounts)")
    size = args.size_gib * GiB
    fill = int(size * args.fill) // CHUNK * CHUNK
    figures: dict[str, Any] = {
        "volume": f"{args.size_gib} GiB, the first {fill / GiB:g} GiB written, then 1% of all its "
        f"{BLOCK // 1024} KiB blocks (anywhere in the volume) changed",
        "block_type": "VARIABLE_LENGTH (default settings)",
        "cache": "snapshot files dropped from the page cache before each run; loop devices with direct I/O",
        "runs": args.runs,
    }
    for name in args.paths.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-cbt-{name}-", dir="/var/tmp") as work:
            figures[name] = measure(Path(work), name, size, fill, args.runs)
            print(name, figures[name])
    write_result("cbt", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
