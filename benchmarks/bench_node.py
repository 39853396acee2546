"""The full node cycle of a fresh 1 GiB volume against the same OS work done with the tools, in one run.

Driver cycle, over the real socket: CreateVolume, ControllerPublishVolume, NodeStageVolume (loop
device, blank check, mkfs, mount), NodePublishVolume (bind), NodeUnpublishVolume, NodeUnstageVolume
(unmount, detach), ControllerUnpublishVolume, DeleteVolume; every call timed.
Tool floor: `truncate -s 1G`, `losetup --find --show`, `mkfs.<fs> -q`, `mount`, `umount`, `losetup -d`
on a fresh file, each program timed. Driver and floor alternate, round by round, for ext4 and xfs.

Targets (issue 17): cycle median <= 1.2x the floor's; NodeStageVolume median <= the floor's mkfs median
+ 3 ms. Then one stage is traced step by step in-process (the same Stager and backend the driver runs,
each step timed) to show where stage spends what it spends beyond mkfs, and mount(2) of a fresh
filesystem made by the plain tool is split into its phases from the kernel's tracepoints
(benchmarks/mount_trace.py).
Needs root. Run: .venv/bin/python -m benchmarks.bench_node [--quick] [--runs 15]
Writes benchmarks/results/node.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench_controller import wait_ready
from benchmarks.common import Progress, load_average, start_driver, stop_driver, summary_ms, write_result
from benchmarks.mount_trace import mount_anatomy
from csi._proto import csi_pb2, csi_pb2_grpc

GiB = 1024**3
TARGET_RATIO = 1.2
TARGET_STAGE_OVER_MKFS_MS = 3.0
NODE_ID = "bench-node"
FILESYSTEMS = ("ext4", "xfs")
AM = csi_pb2.VolumeCapability.AccessMode


def capability(fs: str) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
    )


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def tool_floor(workdir: Path, fs: str, i: int) -> dict[str, float]:
    """The OS floor: the same operations as separate programs on a fresh sparse file; seconds per step."""
    image, mnt = workdir / f"floor-{fs}-{i}.img", workdir / f"floor-{fs}-{i}"
    mnt.mkdir()
    steps: dict[str, float] = {}

    def step(name: str, *argv: str) -> str:
        t = time.perf_counter()
        out = _run(*argv)
        steps[name] = time.perf_counter() - t
        return out

    step("truncate", "truncate", "-s", "1G", str(image))
    device = step("losetup", "losetup", "--find", "--show", str(image))
    step("mkfs", f"mkfs.{fs}", "-q", device)
    step("mount", "mount", device, str(mnt))
    step("umount", "umount", str(mnt))
    step("losetup -d", "losetup", "-d", device)
    steps["total"] = sum(steps.values())
    mnt.rmdir()
    image.unlink()
    return steps


def driver_cycle(channel: grpc.Channel, kubelet: Path, fs: str, i: int) -> dict[str, float]:
    """One fresh volume through the whole cycle; seconds per call and in total."""
    controller, node = csi_pb2_grpc.ControllerStub(channel), csi_pb2_grpc.NodeStub(channel)
    cap = capability(fs)
    staging = str(kubelet / "plugins" / f"{fs}-{i}" / "globalmount")
    target = str(kubelet / "pods" / f"{fs}-{i}" / "mount")
    times: dict[str, float] = {}
    state: dict[str, Any] = {}

    def call(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t
        return out

    create = csi_pb2.CreateVolumeRequest(
        name=f"bench-{fs}-{i}",
        volume_capabilities=[cap],
        capacity_range=csi_pb2.CapacityRange(required_bytes=GiB),
    )
    state["vid"] = vid = call("create", lambda: controller.CreateVolume(create)).volume.volume_id
    publish = csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=cap)
    pc = call("controller publish", lambda: controller.ControllerPublishVolume(publish)).publish_context
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=staging, volume_capability=cap, publish_context=pc
    )
    call("stage", lambda: node.NodeStageVolume(stage))
    pub = csi_pb2.NodePublishVolumeRequest(
        volume_id=vid, staging_target_path=staging, target_path=target, volume_capability=cap
    )
    call("publish", lambda: node.NodePublishVolume(pub))
    unpub = csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=target)
    call("unpublish", lambda: node.NodeUnpublishVolume(unpub))
    unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=staging)
    call("unstage", lambda: node.NodeUnstageVolume(unstage))
    detach = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=NODE_ID)
    call("controller unpublish", lambda: controller.ControllerUnpublishVolume(detach))
    call("delete", lambda: controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid)))
    times["total"] = sum(times.values())
    return times


def traced_stage(workdir: Path, fs: str, runs: int) -> dict[str, float]:
    """Median milliseconds per step of NodeStageVolume's work, in-process: the driver's own Stager,
    local backend and Mounter, with each OS-facing step timed (everything else is 'other')."""
    from csi import loop
    from csi.backends.base import DiskOptions
    from csi.backends.local.backend import LocalBackend
    from csi.mount import Mounter
    from csi.staging import Filesystem, Stager

    backend = LocalBackend.open(str(workdir / f"trace-{fs}"), node_id=NODE_ID)
    mounter = Mounter()
    stager = Stager(backend, mounter, [str(workdir)], 2)
    spent: dict[str, list[float]] = defaultdict(list)
    clock: dict[str, float] = {}
    wrapped = [
        (backend, "resolve_device", "resolve device (loop attach + identity check)"),
        (backend, "never_written", "blank check (backing file has no data)"),
        (mounter, "probe", "blkid probe"),
        (mounter, "mkfs", "mkfs"),
        (mounter, "mount", "mount(2)"),
        (mounter, "mounts", "mount table reads"),
        (mounter, "mount_at", "mount table reads"),
    ]
    for obj, name, label in wrapped:
        if hasattr(obj, name):
            setattr(obj, name, _timed_step(getattr(obj, name), label, clock))
    try:
        for i in range(runs):
            disk = backend.create_volume(f"trace-{fs}-{i}", DiskOptions(size_bytes=GiB))
            pc = backend.attach(disk.id, NODE_ID, False)
            staging = str(workdir / f"trace-{fs}-{i}")
            clock.clear()
            t = time.perf_counter()
            stager.stage(disk.id, pc, 0, staging, Filesystem(fs, True, (), False, {}))
            total = time.perf_counter() - t
            for label, seconds in clock.items():
                spent[label].append(seconds)
            spent["other (Python, makedirs, checks)"].append(total - sum(clock.values()))
            spent["total"].append(total)
            stager.unstage(disk.id, staging)
            backend.detach(disk.id, NODE_ID)
            backend.delete_volume(disk.id)
    finally:
        backend.close()
        for image in Path(workdir / f"trace-{fs}" / "volumes").glob("*.img"):
            loop.detach_file(str(image))
    return {label: round(statistics.median(s) * 1000, 3) for label, s in spent.items()}


def _timed_step(fn: Callable[..., Any], label: str, clock: dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock[label] = clock.get(label, 0.0) + time.perf_counter() - t

    return timed


def measure(
    channel: grpc.Channel, workdir: Path, kubelet: Path, fs: str, runs: int, bar: Progress
) -> dict[str, Any]:
    driver_cycle(channel, kubelet, fs, -1)  # warm-up (imports, first mkfs)
    tool_floor(workdir, fs, -1)
    driver: dict[str, list[float]] = defaultdict(list)
    floor: dict[str, list[float]] = defaultdict(list)
    for i in range(runs):
        both: list[tuple[dict[str, list[float]], Callable[[int], dict[str, float]]]] = [
            (driver, lambda n: driver_cycle(channel, kubelet, fs, n)),
            (floor, lambda n: tool_floor(workdir, fs, n)),
        ]
        for into, run in both if i % 2 == 0 else both[::-1]:
            for k, v in run(i).items():
                into[k].append(v)
        bar.step(note=fs)
    ratio = statistics.median(driver["total"]) / statistics.median(floor["total"])
    stage_over = (statistics.median(driver["stage"]) - statistics.median(floor["mkfs"])) * 1000
    return {
        "driver_cycle": summary_ms(driver["total"]),
        "driver_calls": {k: summary_ms(v) for k, v in driver.items() if k != "total"},
        "tool_floor": summary_ms(floor["total"]),
        "tool_floor_steps": {k: summary_ms(v) for k, v in floor.items() if k != "total"},
        "ratio_median": round(ratio, 3),
        "stage_minus_mkfs_ms": round(stage_over, 3),
        "cycle_target_met": ratio <= TARGET_RATIO,
        "stage_target_met": stage_over <= TARGET_STAGE_OVER_MKFS_MS,
        "stage_steps_ms": traced_stage(workdir, fs, max(3, runs // 3)),
        "mount_anatomy_ms": mount_anatomy(workdir, fs, max(3, runs // 3)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5 runs per filesystem")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_node needs root (loop devices, mkfs, mount)", file=sys.stderr)
        return 2
    runs = 5 if args.quick else args.runs
    load = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-node-"))
    kubelet = workdir / "kubelet"
    kubelet.mkdir()
    sock = workdir / "csi.sock"
    proc = start_driver(sock, workdir / "data", "--kubelet-dir", str(kubelet), "--node-id", NODE_ID)
    figures: dict[str, Any] = {}
    bar = Progress(runs * len(FILESYSTEMS), "bench_node")
    try:
        wait_ready(sock)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            for fs in FILESYSTEMS:
                figures[fs] = measure(channel, workdir, kubelet, fs, runs, bar)
    finally:
        stop_driver(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    write_result(
        "node",
        {
            "quick": args.quick,
            "volume": "1 GiB, fresh per run",
            "runs": runs,
            "method": "driver cycle and tool floor alternate run by run; medians",
            **figures,
            "target_ratio": TARGET_RATIO,
            "target_stage_over_mkfs_ms": TARGET_STAGE_OVER_MKFS_MS,
            "tools": {
                "mkfs.ext4": _version(["mkfs.ext4", "-V"]),
                "mkfs.xfs": _version(["mkfs.xfs", "-V"]),
            },
        },
        load,
    )
    return 0


def _version(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip().split("\n")[0]


if __name__ == "__main__":
    sys.exit(main())
