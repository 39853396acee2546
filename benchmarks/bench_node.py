"""The full node cycle of a fresh 1 GiB volume against the same OS work done with the tools, in one run.

Driver cycle, over the real socket: CreateVolume, ControllerPublishVolume, NodeStageVolume (loop
device, blank check, mkfs, mount), NodePublishVolume (bind), NodeUnpublishVolume, NodeUnstageVolume
(unmount, detach), ControllerUnpublishVolume, DeleteVolume; every call timed. As a CO does, the client
makes staging_target_path and the parent of target_path before it calls.
Tool floor: `truncate -s 1G`, `losetup --find --show`, `mkfs.<fs> -q`, `mount`, `umount`, `losetup -d`
on a fresh file, each program timed (the file removed untimed). Driver, floor and the traced stage take
turns, round by round, for ext4 and xfs. The driver removes a deleted volume's file in the background
after DeleteVolume answers; each run waits, untimed, until it has, so that work never runs into the
time of the next run (the floor's included).

Targets (issue 17): cycle median <= 1.2x the floor's; NodeStageVolume median <= the floor's mkfs median
+ 3 ms. In the same rounds a stage is traced step by step in-process (the same Stager and backend the
driver runs, each step timed) to show where stage spends what it spends beyond mkfs, and an RPC that
does nothing (NodeGetCapabilities) is timed on the cycle's channel: what the client and gRPC add to
each call. Afterwards mount(2) of a fresh filesystem made by the plain tool is split into its phases
from the kernel's tracepoints (benchmarks/mount_trace.py).
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

from benchmarks import common
from benchmarks.bench_controller import wait_ready
from benchmarks.common import Progress, load_average, start_driver, stop_driver, summary_ms, write_result
from benchmarks.mount_trace import mount_anatomy
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.local.reaper import REAPER

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
    staging = kubelet / "plugins" / f"{fs}-{i}" / "globalmount"
    target = kubelet / "pods" / f"{fs}-{i}" / "mount"
    # What the CO does before calling (CSI spec): it creates staging_target_path, and the parent of
    # target_path; the driver creates target_path itself. The tool floor, too, makes its mount point
    # before timing.
    staging.mkdir(parents=True)
    target.parent.mkdir(parents=True)
    times: dict[str, float] = {}

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
    vid = call("create", lambda: controller.CreateVolume(create)).volume.volume_id
    publish = csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=cap)
    pc = call("controller publish", lambda: controller.ControllerPublishVolume(publish)).publish_context
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=str(staging), volume_capability=cap, publish_context=pc
    )
    call("stage", lambda: node.NodeStageVolume(stage))
    pub = csi_pb2.NodePublishVolumeRequest(
        volume_id=vid, staging_target_path=str(staging), target_path=str(target), volume_capability=cap
    )
    call("publish", lambda: node.NodePublishVolume(pub))
    unpub = csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=str(target))
    call("unpublish", lambda: node.NodeUnpublishVolume(unpub))
    unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=str(staging))
    call("unstage", lambda: node.NodeUnstageVolume(unstage))
    detach = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=NODE_ID)
    call("controller unpublish", lambda: controller.ControllerUnpublishVolume(detach))
    call("delete", lambda: controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid)))
    times["total"] = sum(times.values())
    return times


class TracedStage:
    """NodeStageVolume's work in-process, one stage per `once()`: the driver's own Stager, local backend
    and Mounter, with each OS-facing step timed (everything else is 'other'). Its stages run in the
    same rounds as the RPC cycle and the tool floor, so its mkfs compares with theirs."""

    LABELS = (
        ("backend", "resolve_device", "resolve device (loop attach + identity check)"),
        ("backend", "never_written", "blank check (backing file has no data)"),
        ("mounter", "probe", "blkid probe"),
        ("mounter", "mkfs", "mkfs"),
        ("mounter", "mount", "mount(2)"),
        ("mounter", "mounts", "mount table reads"),
        ("mounter", "mount_at", "mount table reads"),
    )

    def __init__(self, workdir: Path, fs: str) -> None:
        from csi.backends.local.backend import LocalBackend
        from csi.mount import Mounter
        from csi.staging import Stager

        self.workdir, self.fs = workdir, fs
        self.backend = LocalBackend.open(str(workdir / f"trace-{fs}"), node_id=NODE_ID)
        self.mounter = Mounter()
        self.stager = Stager(self.backend, self.mounter, [str(workdir)], 2)
        self.spent: dict[str, list[float]] = defaultdict(list)
        self._clock: dict[str, float] = {}
        owners = {"backend": self.backend, "mounter": self.mounter}
        for owner, name, label in self.LABELS:
            obj = owners[owner]
            if hasattr(obj, name):
                setattr(obj, name, _timed_step(getattr(obj, name), label, self._clock))

    def once(self, i: int) -> None:
        from csi.backends.base import DiskOptions
        from csi.staging import Filesystem

        disk = self.backend.create_volume(f"trace-{self.fs}-{i}", DiskOptions(size_bytes=GiB))
        pc = self.backend.attach(disk.id, NODE_ID, False)
        staging = str(self.workdir / f"trace-{self.fs}-{i}")
        os.mkdir(staging)  # the CO's part, as in driver_cycle
        self._clock.clear()
        try:
            t = time.perf_counter()
            self.stager.stage(disk.id, pc, 0, staging, Filesystem(self.fs, True, (), False, {}))
            total = time.perf_counter() - t
            clock = dict(self._clock)  # the stage's steps only, not the unstage's below
        finally:  # a failed stage leaves no mount or loop device behind (not staged: a no-op)
            self.stager.unstage(disk.id, staging)
            self.backend.detach(disk.id, NODE_ID)
            self.backend.delete_volume(disk.id)
            REAPER.settle()  # its file removed before the next run starts, as removed() does
        if i < 0:  # warm-up
            return
        for label, seconds in clock.items():
            self.spent[label].append(seconds)
        self.spent["other (Python, makedirs, checks)"].append(total - sum(clock.values()))
        self.spent["total"].append(total)

    def medians_ms(self) -> dict[str, float]:
        return {label: round(statistics.median(s) * 1000, 3) for label, s in self.spent.items()}

    def close(self) -> None:
        from csi import loop

        self.backend.close()
        for image in Path(self.workdir / f"trace-{self.fs}" / "volumes").glob("*.img"):
            loop.detach_file(str(image))


def round_trip(channel: grpc.Channel) -> float:
    """Seconds for one RPC that does nothing on the node (NodeGetCapabilities): what the client and
    gRPC add to every call, stage included."""
    stub = csi_pb2_grpc.NodeStub(channel)
    t = time.perf_counter()
    stub.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    return time.perf_counter() - t


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
    traced = TracedStage(workdir, fs)
    try:
        driver_cycle(channel, kubelet, fs, -1)  # warm-up (imports, first mkfs)
        tool_floor(workdir, fs, -1)
        traced.once(-1)
        driver: dict[str, list[float]] = defaultdict(list)
        floor: dict[str, list[float]] = defaultdict(list)
        empty: list[float] = []

        def driver_run(n: int) -> None:
            for k, v in driver_cycle(channel, kubelet, fs, n).items():
                driver[k].append(v)
            common.removed(workdir / "data" / "volumes")
            empty.append(round_trip(channel))

        def floor_run(n: int) -> None:
            for k, v in tool_floor(workdir, fs, n).items():
                floor[k].append(v)

        order: list[Callable[[int], None]] = [driver_run, floor_run, traced.once]
        for i in range(runs):
            for run in order[i % 3 :] + order[: i % 3]:  # each goes first as often as the others
                run(i)
            bar.step(note=fs)
        steps = traced.medians_ms()
    finally:
        traced.close()
    ratio = statistics.median(driver["total"]) / statistics.median(floor["total"])
    stage_over = (statistics.median(driver["stage"]) - statistics.median(floor["mkfs"])) * 1000
    return {
        "driver_cycle": summary_ms(driver["total"]),
        "driver_calls": {k: summary_ms(v) for k, v in driver.items() if k != "total"},
        "empty_rpc": summary_ms(empty),
        "tool_floor": summary_ms(floor["total"]),
        "tool_floor_steps": {k: summary_ms(v) for k, v in floor.items() if k != "total"},
        "ratio_median": round(ratio, 3),
        "stage_minus_mkfs_ms": round(stage_over, 3),
        "cycle_target_met": ratio <= TARGET_RATIO,
        "stage_target_met": stage_over <= TARGET_STAGE_OVER_MKFS_MS,
        "stage_steps_ms": steps,
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
            "method": "driver cycle, tool floor and traced stage take turns run by run, each first as "
            "often, each run's files removed before the next starts; medians",
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
