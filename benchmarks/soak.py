"""Soak: a bounded concurrent workload on the local backend with real loop devices, mounts and mkfs.

Several client threads run volume lives, node and controller lives in turn, every request sent twice at
once, so the driver sees true duplicates (which may only be answered ABORTED) next to unrelated work:

- a node life: create, controller-publish, stage (mkfs), publish, write and read back, snapshot,
  unpublish, unstage, controller-unpublish, delete snapshot, delete;
- a controller life: create two volumes, expand and modify one, snapshot it, restore the snapshot,
  take a group snapshot of both, list, then delete the group, the snapshot and the three volumes.

Afterwards nothing may be left: no volume, snapshot, file, mount or loop device. The driver's RSS and
open file descriptors are sampled at rest after a warm-up round, every 30 s during the run (with the
host's load: the machine may be shared), and at rest after it.

`run_workload` is shared with tests/reliability/test_load.py (the short form, in CI); this script is
the long form (`python -m benchmarks.soak`, as root: 8 clients for 10 minutes by default) and writes
benchmarks/results/soak.json. It exits 1 unless RSS grew by less than 10 MiB, the descriptor count
stayed flat, nothing was left, and the only errors were ABORTED duplicates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc

MiB = 1024**2
AM = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)
OK_OR_DUPLICATE = (grpc.StatusCode.OK, grpc.StatusCode.ABORTED)


@dataclass
class Tally:
    """What the workload saw, shared by all workers (guarded by `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    operations: int = 0
    aborted: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def record(self, method: str, seconds: float) -> None:
        with self.lock:
            self.operations += 1
            self.latencies.setdefault(method, []).append(seconds)


@dataclass
class Stubs:
    channel: grpc.Channel
    controller: csi_pb2_grpc.ControllerStub
    node: csi_pb2_grpc.NodeStub
    group: csi_pb2_grpc.GroupControllerStub

    @classmethod
    def open(cls, endpoint: str) -> Stubs:
        ch = grpc.insecure_channel(endpoint)
        grpc.channel_ready_future(ch).result(timeout=30)
        return cls(
            ch,
            csi_pb2_grpc.ControllerStub(ch),
            csi_pb2_grpc.NodeStub(ch),
            csi_pb2_grpc.GroupControllerStub(ch),
        )


def _code(future: Any) -> grpc.StatusCode:
    try:
        future.result()
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def twice(tally: Tally, call: Any, request: Any) -> Any:
    """Send `request` twice at once. Each copy must succeed or be ABORTED as a duplicate; if both were
    aborted (or the one that won was the other), the request is retried alone. Returns a response."""
    method = type(request).__name__.removesuffix("Request")
    start = time.perf_counter()
    first, second = call.future(request, timeout=120), call.future(request, timeout=120)
    codes = (_code(first), _code(second))
    for code, fut in zip(codes, (first, second), strict=True):
        if code not in OK_OR_DUPLICATE:
            with tally.lock:
                tally.errors.append(f"{method}: {code.name}: {fut.exception().details()}")
    with tally.lock:
        tally.aborted += codes.count(grpc.StatusCode.ABORTED)
    winner = next((f for c, f in zip(codes, (first, second), strict=True) if c == grpc.StatusCode.OK), None)
    while winner is None:
        time.sleep(0.05)
        retry = call.future(request, timeout=120)
        code = _code(retry)
        if code == grpc.StatusCode.OK:
            winner = retry
        elif code != grpc.StatusCode.ABORTED:
            with tally.lock:
                tally.errors.append(f"{method} retry: {code.name}: {retry.exception().details()}")
            raise RuntimeError(f"{method} failed: {retry.exception().details()}")
    tally.record(method, time.perf_counter() - start)
    return winner.result()


def volume_life(s: Stubs, work: Path, node_id: str, label: str, tally: Tally) -> None:
    """One volume from creation to deletion, every request sent twice at once."""
    vol = twice(
        tally,
        s.controller.CreateVolume,
        csi_pb2.CreateVolumeRequest(
            name=label,
            capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB),
            volume_capabilities=[CAP],
        ),
    ).volume
    vid = vol.volume_id
    pc = twice(
        tally,
        s.controller.ControllerPublishVolume,
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=node_id, volume_capability=CAP),
    ).publish_context
    staging, target = str(work / "stg" / label), str(work / "pods" / label / "mount")
    twice(
        tally,
        s.node.NodeStageVolume,
        csi_pb2.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging, volume_capability=CAP, publish_context=pc
        ),
    )
    twice(
        tally,
        s.node.NodePublishVolume,
        csi_pb2.NodePublishVolumeRequest(
            volume_id=vid,
            staging_target_path=staging,
            target_path=target,
            volume_capability=CAP,
            publish_context=pc,
        ),
    )
    payload = label.encode() * 4096
    with open(os.path.join(target, "data"), "wb") as f:
        f.write(payload)
        os.fsync(f.fileno())
    snap = twice(
        tally,
        s.controller.CreateSnapshot,
        csi_pb2.CreateSnapshotRequest(name=f"{label}-snap", source_volume_id=vid),
    ).snapshot
    with open(os.path.join(target, "data"), "rb") as f:
        if f.read() != payload:
            with tally.lock:
                tally.errors.append(f"{label}: data read back differs")
    twice(
        tally,
        s.node.NodeUnpublishVolume,
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=target),
    )
    twice(
        tally,
        s.node.NodeUnstageVolume,
        csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=staging),
    )
    twice(
        tally,
        s.controller.ControllerUnpublishVolume,
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=node_id),
    )
    twice(tally, s.controller.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
    twice(tally, s.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=vid))


def _create(s: Stubs, tally: Tally, name: str, size: int = 16 * MiB, snapshot: str = "") -> str:
    request = csi_pb2.CreateVolumeRequest(
        name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=size), volume_capabilities=[CAP]
    )
    if snapshot:
        request.volume_content_source.snapshot.snapshot_id = snapshot
    return str(twice(tally, s.controller.CreateVolume, request).volume.volume_id)


def controller_life(s: Stubs, label: str, tally: Tally) -> None:
    """Two volumes through the controller's other RPCs, every request sent twice at once."""
    a, b = _create(s, tally, f"{label}-a"), _create(s, tally, f"{label}-b")
    twice(
        tally,
        s.controller.ControllerExpandVolume,
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=a, capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB)
        ),
    )
    twice(
        tally,
        s.controller.ControllerModifyVolume,
        csi_pb2.ControllerModifyVolumeRequest(volume_id=a, mutable_parameters={"iops": "500"}),
    )
    snap = twice(
        tally,
        s.controller.CreateSnapshot,
        csi_pb2.CreateSnapshotRequest(name=f"{label}-snap", source_volume_id=a),
    ).snapshot.snapshot_id
    restored = _create(s, tally, f"{label}-restored", size=32 * MiB, snapshot=snap)
    group = twice(
        tally,
        s.group.CreateVolumeGroupSnapshot,
        csi_pb2.CreateVolumeGroupSnapshotRequest(name=f"{label}-group", source_volume_ids=[a, b]),
    ).group_snapshot.group_snapshot_id
    twice(tally, s.controller.ControllerGetVolume, csi_pb2.ControllerGetVolumeRequest(volume_id=a))
    twice(tally, s.controller.ListSnapshots, csi_pb2.ListSnapshotsRequest(source_volume_id=a))
    twice(
        tally,
        s.group.DeleteVolumeGroupSnapshot,
        csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group),
    )
    twice(tally, s.controller.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=snap))
    for vid in (restored, b, a):
        twice(tally, s.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=vid))


NODE_LIFE_OPERATIONS = 10
CONTROLLER_LIFE_OPERATIONS = 14


def run_workload(
    endpoint: str,
    work: Path,
    node_id: str,
    *,
    workers: int,
    lives: int = 0,
    until: float = 0.0,
    prefix: str = "soak",
    tally: Tally | None = None,
    mixed: bool = True,
) -> Tally:
    """`workers` threads each run `lives` lives (or until time.monotonic() passes `until`): node and
    controller lives in turn when `mixed`, else node lives only."""
    tally = tally or Tally()
    stop = threading.Event()

    def worker(w: int) -> None:
        s = Stubs.open(endpoint)
        try:
            n = 0
            while not stop.is_set() and (n < lives if lives else time.monotonic() < until):
                label = f"{prefix}-w{w}-{n}"
                try:
                    if mixed and (w + n) % 2:
                        controller_life(s, label, tally)
                    else:
                        volume_life(s, work, node_id, label, tally)
                except RuntimeError:
                    stop.set()  # an error is recorded; stop the run instead of piling up more
                n += 1
        finally:
            s.channel.close()

    with futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, range(workers)))
    return tally


def leftovers(endpoint: str, data_dir: Path) -> dict[str, Any]:
    """What the driver still knows about and what is on disk: all must be empty after a run."""
    s = Stubs.open(endpoint)
    try:
        vols = s.controller.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=30).entries
        snaps = s.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest(), timeout=30).entries
    finally:
        s.channel.close()
    from benchmarks.common import removed

    removed(data_dir / "volumes", data_dir / "snapshots", timeout=10)
    files = [p.name for sub in ("volumes", "snapshots") for p in (data_dir / sub).iterdir()]
    return {"volumes": len(vols), "snapshots": len(snaps), "files": files}


def summarise(tally: Tally, seconds: float) -> dict[str, Any]:
    from benchmarks.common import summary_ms

    return {
        "operations": tally.operations,
        "seconds": round(seconds, 1),
        "operations_per_second": round(tally.operations / seconds, 2) if seconds else 0,
        "duplicates_aborted": tally.aborted,
        "errors": tally.errors[:20],
        "latency": {m: summary_ms(v) for m, v in sorted(tally.latencies.items())},
    }


RSS_GROWTH_LIMIT_KIB = 10 * 1024
SAMPLE_SECONDS = 30.0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def load_1min() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass
class Samples:
    """The driver's RSS (KiB) and open descriptors, and the host's 1-minute load, over the run."""

    pid: int
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    def take(self) -> None:
        from benchmarks.common import rss_kib

        self.rss.append(rss_kib(self.pid))
        self.fds.append(fd_count(self.pid))
        self.load.append(load_1min())

    def every(self, seconds: float, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            while not stop.wait(seconds):
                self.take()

        thread = threading.Thread(target=loop, name="sampler", daemon=True)
        thread.start()
        return thread


def fds_flat(fds: list[int]) -> bool:
    """At rest after the run (the last sample) no more descriptors than at rest after the warm-up (the
    first), and no upward trend in between: the samples taken mid-run include the descriptors of
    operations in flight, so their later half may not average more than one above the earlier half."""
    during = fds[1:-1]
    half = len(during) // 2
    trend_ok = not half or sum(during[half:]) / len(during[half:]) <= sum(during[:half]) / half + 1
    return fds[-1] <= fds[0] and trend_ok


def verdicts(figures: dict[str, Any], samples: Samples) -> dict[str, bool]:
    left = figures["left_behind"]
    return {
        "rss_growth_under_10_mib": figures["rss_growth_kib"] < RSS_GROWTH_LIMIT_KIB,
        "fd_count_flat": fds_flat(samples.fds),
        "nothing_left": not any(left[k] for k in ("volumes", "snapshots", "files", "mounts", "loop_devices")),
        "no_errors_but_aborted_duplicates": not figures["errors"] and not figures["driver_log_errors"],
    }


def soak(endpoint: str, work: Path, node: str, workers: int, minutes: float, samples: Samples) -> Tally:
    """Warm up (two lives per worker), sample, run for `minutes`, sample again."""
    run_workload(endpoint, work, node, workers=workers, lives=2, prefix="warm")
    samples.take()
    stop = threading.Event()
    sampler = samples.every(SAMPLE_SECONDS, stop)
    try:
        return run_workload(endpoint, work, node, workers=workers, until=time.monotonic() + minutes * 60)
    finally:
        stop.set()
        sampler.join()
        samples.take()


def clean_up(work: Path) -> tuple[list[str], list[str]]:
    """Mounts under `work` and loop devices over its files, removed; returns what there was."""
    from csi import loop
    from csi.mount import Mounter

    mounts = [m.mount_point for m in Mounter().mounts() if m.mount_point.startswith(f"{work}/")]
    loops = loop.backed_under(str(work))
    for point in sorted(mounts, key=len, reverse=True):
        Mounter().unmount(point)
    for dev in loops:
        loop.detach_file(loop.backing_file(dev) or "")
    return mounts, loops


def main(argv: list[str] | None = None) -> int:
    from benchmarks.bench_controller import wait_ready
    from benchmarks.common import REPO, stop_driver, write_result

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--minutes", type=float, default=10.0)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("soak needs root (loop devices and mounts)")
    for tool in ("mkfs.ext4", "blkid", "e2fsck"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found")
    work = Path(tempfile.mkdtemp(prefix="ballast-soak-"))
    data, sock, node = work / "data", work / "csi.sock", "soak-node"
    log = work / "driver.log"  # a file, not a pipe: every aborted duplicate logs a warning
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "csi", "--endpoint", f"unix://{sock}", "--data-dir", str(data),
             "--log-level", "warning", "--node-id", node, f"--allowed-path-prefix={work}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    endpoint, samples = f"unix://{sock}", Samples(proc.pid)
    load_before = load_1min()
    try:
        wait_ready(sock)
        start = time.monotonic()
        tally = soak(endpoint, work, node, args.workers, args.minutes, samples)
        seconds = time.monotonic() - start
        left = leftovers(endpoint, data)
    finally:
        stop_driver(proc)
        mounts, loops = clean_up(work)
    figures: dict[str, Any] = {
        "workers": args.workers,
        "minutes": args.minutes,
        **summarise(tally, seconds),
        "rss_kib_after_warmup": samples.rss[0],
        "rss_kib_after_run": samples.rss[-1],
        "rss_growth_kib": samples.rss[-1] - samples.rss[0],
        "rss_kib_samples": samples.rss,
        "open_fds_after_warmup": samples.fds[0],
        "open_fds_after_run": samples.fds[-1],
        "open_fds_samples": samples.fds,
        "host_load_1min": {"before": load_before, "during": samples.load, "cpus": os.cpu_count()},
        "left_behind": {**left, "mounts": mounts, "loop_devices": loops},
        "driver_log_errors": [line for line in log.read_text().splitlines() if " ERROR " in line][:20],
    }
    figures["verdicts"] = verdicts(figures, samples)
    write_result("soak", figures)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(figures["verdicts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
