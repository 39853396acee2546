"""Full node cycle of a fresh 1 GiB ext4 volume against the same OS work done by hand, in one run.

Driver: NodeStage (attach loop, blkid, mkfs.ext4, mount) + NodePublish (bind) + NodeUnpublish +
NodeUnstage (unmount, detach) over the real socket; each run uses a new volume (created and attached
untimed). By hand: `losetup --find --show`, `mkfs.ext4 -q`, `mount`, `umount`, `losetup -d` on a fresh
1 GiB sparse file. Runs alternate between the two so drift hits both alike.
Target (issue 4): driver median <= 1.5x the hand-made median. Needs root.
Run: .venv/bin/python -m benchmarks.bench_node [--runs 9]
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
from pathlib import Path

import grpc

from benchmarks.bench_controller import wait_ready
from benchmarks.common import start_driver, stop_driver, summary_ms, write_result
from csi._proto import csi_pb2, csi_pb2_grpc

GiB = 1024**3
TARGET_RATIO = 1.5
NODE_ID = "bench-node"
AM = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def by_hand(workdir: Path, i: int) -> float:
    """The OS floor: the same five operations as separate programs on a fresh sparse file."""
    image, mnt = workdir / f"hand-{i}.img", workdir / f"hand-{i}"
    with open(image, "wb") as fh:
        fh.truncate(GiB)
    mnt.mkdir()
    start = time.perf_counter()
    device = _run("losetup", "--find", "--show", str(image))
    _run("mkfs.ext4", "-q", device)
    _run("mount", device, str(mnt))
    _run("umount", str(mnt))
    _run("losetup", "-d", device)
    elapsed = time.perf_counter() - start
    mnt.rmdir()
    image.unlink()
    return elapsed


def driver_cycle(
    controller: csi_pb2_grpc.ControllerStub, node: csi_pb2_grpc.NodeStub, kubelet: Path, i: int
) -> dict[str, float]:
    """One fresh volume through the four node RPCs; returns seconds per phase (and 'total')."""
    volume = controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=f"bench-{i}",
            volume_capabilities=[CAP],
            capacity_range=csi_pb2.CapacityRange(required_bytes=GiB),
        )
    ).volume
    vid = volume.volume_id
    pc = controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=CAP)
    ).publish_context
    staging = str(kubelet / "plugins" / vid / "globalmount")
    target = str(kubelet / "pods" / f"p{i}" / "mount")
    times: dict[str, float] = {}
    start = time.perf_counter()
    node.NodeStageVolume(
        csi_pb2.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging, volume_capability=CAP, publish_context=pc
        )
    )
    times["stage"] = time.perf_counter() - start
    t = time.perf_counter()
    node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=staging, target_path=target, volume_capability=CAP
        )
    )
    times["publish"] = time.perf_counter() - t
    t = time.perf_counter()
    node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=target))
    times["unpublish"] = time.perf_counter() - t
    t = time.perf_counter()
    node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=staging))
    times["unstage"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - start
    controller.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=NODE_ID)
    )
    controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_node needs root (loop devices, mkfs, mount)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-node-"))
    kubelet = workdir / "kubelet"
    kubelet.mkdir()
    sock = workdir / "csi.sock"
    proc = start_driver(sock, workdir / "data", "--kubelet-dir", str(kubelet), "--node-id", NODE_ID)
    hand: list[float] = []
    phases: dict[str, list[float]] = {}
    try:
        wait_ready(sock)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            controller, node = csi_pb2_grpc.ControllerStub(channel), csi_pb2_grpc.NodeStub(channel)
            driver_cycle(controller, node, kubelet, -1)  # warm-up (imports, first mkfs)
            by_hand(workdir, -1)
            for i in range(args.runs):
                for phase, seconds in driver_cycle(controller, node, kubelet, i).items():
                    phases.setdefault(phase, []).append(seconds)
                hand.append(by_hand(workdir, i))
    finally:
        stop_driver(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = statistics.median(phases["total"]) / statistics.median(hand)
    write_result(
        "node",
        {
            "volume": "1 GiB ext4, fresh per run",
            "runs": args.runs,
            "driver_cycle": summary_ms(phases["total"]),
            "driver_phases": {p: summary_ms(s) for p, s in phases.items() if p != "total"},
            "by_hand": summary_ms(hand),
            "ratio_median": round(ratio, 3),
            "target_ratio": TARGET_RATIO,
            "meets_target": ratio <= TARGET_RATIO,
            "mkfs": subprocess.run(["mkfs.ext4", "-V"], capture_output=True, text=True).stderr.split("\n")[0],
            "kernel": os.uname().release,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
