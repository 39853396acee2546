"""Shared integration fixtures: the real driver on a real unix socket over a temporary data dir.

`node_env` serves all services with the local backend (real sparse files, real loop devices, real mkfs
and mount). Its finalizer unpublishes/unstages everything the test published through the env, then
fails the test if any mount under the test's directory or any loop device over its data dir is left,
after removing them (so a failing test never leaks into the next one).
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from csi import freeze, loop, loopfind
from csi._proto import csi_pb2
from csi.backends.base import DiskOptions
from csi.config import parse_args
from csi.mount import Mounter
from csi.server import Driver
from tests.conftest import require_root, require_tool
from tests.csiclient import CsiClient, connect

MiB = 1024**2
NODE_ID = "itest-node"
AccessMode = csi_pb2.VolumeCapability.AccessMode


def mount_cap(
    fs_type: str = "ext4", flags: tuple[str, ...] = (), mode: AccessMode.Mode = AccessMode.SINGLE_NODE_WRITER
) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs_type, mount_flags=list(flags)),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),
    )


def block_cap(mode: AccessMode.Mode = AccessMode.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),
    )


@dataclass
class Volume:
    id: str
    publish_context: dict[str, str]
    staging: str
    target: str
    file: str


@dataclass
class NodeEnv:
    tmp: Path
    kubelet: Path
    data_dir: Path
    socket: str
    driver: Driver
    client: CsiClient
    staged: dict[str, str] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    _count: int = 0

    @property
    def node(self) -> object:
        return self.client.node

    def args(self) -> list[str]:
        return [
            "--endpoint",
            f"unix://{self.socket}",
            "--data-dir",
            str(self.data_dir),
            "--kubelet-dir",
            str(self.kubelet),
            "--node-id",
            NODE_ID,
            *self.extra_args,
        ]

    def volume(self, size: int = 64 * MiB, context: dict[str, str] | None = None) -> Volume:
        """A new volume, controller-published to this node (through the backend directly)."""
        self._count += 1
        disk = self.driver.backend.create_volume(f"itest-{self._count}", DiskOptions(size_bytes=size))
        pc = self.driver.backend.attach(disk.id, NODE_ID, False)
        base = self.kubelet / "plugins" / f"v{self._count}"
        return Volume(
            id=disk.id,
            publish_context=dict(pc),
            staging=str(base / "globalmount"),
            target=str(self.kubelet / "pods" / f"p{self._count}" / "volumes" / "mount"),
            file=str(self.data_dir / "volumes" / f"{disk.id}.img"),
        )

    def stage(
        self, vol: Volume, cap: csi_pb2.VolumeCapability, context: dict[str, str] | None = None
    ) -> csi_pb2.NodeStageVolumeResponse:
        self.staged[vol.id] = vol.staging
        response: csi_pb2.NodeStageVolumeResponse = self.client.node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id=vol.id,
                staging_target_path=vol.staging,
                volume_capability=cap,
                publish_context=vol.publish_context,
                volume_context=context or {},
            ),
            timeout=120,
        )
        return response

    def publish(
        self,
        vol: Volume,
        cap: csi_pb2.VolumeCapability,
        *,
        readonly: bool = False,
        target: str = "",
        context: dict[str, str] | None = None,
    ) -> csi_pb2.NodePublishVolumeResponse:
        target = target or vol.target
        self.published[target] = vol.id
        response: csi_pb2.NodePublishVolumeResponse = self.client.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=vol.id,
                staging_target_path=vol.staging,
                target_path=target,
                volume_capability=cap,
                publish_context=vol.publish_context,
                volume_context=context or {},
                readonly=readonly,
            ),
            timeout=120,
        )
        return response

    def unpublish(self, vol: Volume, target: str = "") -> None:
        target = target or vol.target
        self.client.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.id, target_path=target), timeout=120
        )
        self.published.pop(target, None)

    def unstage(self, vol: Volume) -> None:
        self.client.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=vol.staging), timeout=120
        )
        self.staged.pop(vol.id, None)

    def start(self) -> None:
        config, _ = parse_args(self.args())
        self.driver = Driver(config)
        self.driver.start()
        self.client = connect(self.socket)

    def stop(self) -> None:
        self.client.close()
        self.driver.stop(grace=5)

    def restart(self) -> None:
        """Stop the plugin process state entirely and start a fresh one on the same socket and data."""
        self.stop()
        self.start()


def leftovers(tmp: Path, data_dir: Path) -> tuple[list[str], list[str]]:
    """Mount points under `tmp` and loop devices over files in `data_dir`."""
    mounts = [m.mount_point for m in Mounter().mounts() if m.mount_point.startswith(str(tmp) + "/")]
    loops = []
    for dev in loopfind.bound_devices():
        backing = loop.backing_file(dev) or ""
        if backing.startswith(str(data_dir) + "/"):
            loops.append(dev)
    return mounts, loops


def force_clean(tmp: Path, data_dir: Path) -> None:
    mounter = Mounter()
    mounts, loops = leftovers(tmp, data_dir)
    for point in sorted(mounts, key=len, reverse=True):
        with contextlib.suppress(OSError):
            freeze.thaw(point)  # an unmounted frozen filesystem would keep its loop device for good
        for _ in range(8):
            if not mounter.unmount(point):
                break
    for dev in loops:
        backing = loop.backing_file(dev)
        if backing and backing.endswith(" (deleted)"):  # unlinked while bound: detach it by name
            subprocess.run(["losetup", "-d", dev], check=False)
        elif backing:
            loop.detach_file(backing)


@contextlib.contextmanager
def running_node_env(
    tmp_path: Path, data_dir: Path | None = None, extra_args: Sequence[str] = ()
) -> Iterator[NodeEnv]:
    """The driver (all services, local backend) with its kubelet dir under tmp_path and its data dir
    there too unless given. On exit everything published or staged through the env is undone, and
    mounts under tmp_path or loop devices over the data dir left behind fail the test (after removal)."""
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck", "resize2fs"):
        require_tool(tool)
    kubelet, data_dir = tmp_path / "kubelet", data_dir or tmp_path / "data"
    kubelet.mkdir(parents=True)
    env = NodeEnv(
        tmp=tmp_path,
        kubelet=kubelet,
        data_dir=data_dir,
        socket=str(tmp_path / "csi.sock"),
        driver=None,  # type: ignore[arg-type]
        client=None,  # type: ignore[arg-type]
        extra_args=list(extra_args),
    )
    env.start()
    problems: list[str] = []
    try:
        yield env
    finally:
        for target, vol_id in list(env.published.items()):
            try:
                env.client.node.NodeUnpublishVolume(
                    csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol_id, target_path=target), timeout=120
                )
            except grpc.RpcError as err:
                problems.append(f"unpublish {target}: {err.details()}")
        for vol_id, staging in list(env.staged.items()):
            try:
                env.client.node.NodeUnstageVolume(
                    csi_pb2.NodeUnstageVolumeRequest(volume_id=vol_id, staging_target_path=staging),
                    timeout=120,
                )
            except grpc.RpcError as err:
                problems.append(f"unstage {staging}: {err.details()}")
        env.stop()
        mounts, loops = leftovers(tmp_path, data_dir)
        force_clean(tmp_path, data_dir)
        if os.path.exists(env.socket):
            problems.append(f"socket {env.socket} left behind")
        if mounts or loops:
            problems.append(f"leaked mounts {mounts} and loop devices {loops}")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture
def node_env(tmp_path: Path) -> Iterator[NodeEnv]:
    """The driver (all services, local backend) with kubelet dir and data dir under tmp_path."""
    with running_node_env(tmp_path) as env:
        yield env


def write_mbr(path: str, start_sector: int, sectors: int) -> None:
    """One Linux partition in a DOS partition table at the start of a volume file."""
    entry = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", start_sector, sectors)
    with open(path, "r+b") as fh:
        fh.seek(446)
        fh.write(entry)
        fh.seek(510)
        fh.write(b"\x55\xaa")


@contextlib.contextmanager
def loop_filesystem(
    where: Path, fs_type: str, size: int, mkfs_options: Sequence[str] = (), mount_options: str = ""
) -> Iterator[Path]:
    """A fresh filesystem on a loop device over a sparse image in `where`, mounted at `where`/mnt.
    Unmounted and its loop device detached even when the test fails (only this device, by name)."""
    require_root()
    mkfs = require_tool(f"mkfs.{fs_type}")
    image, mnt = where / f"{fs_type}.img", where / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run([mkfs, "-q", *mkfs_options, str(image)], check=True)
    device = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        argv = ["mount", "-t", fs_type, *(["-o", mount_options] if mount_options else []), device, str(mnt)]
        subprocess.run(argv, check=True)
        try:
            yield mnt
        finally:
            if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
                subprocess.run(["umount", "--lazy", str(mnt)], check=False)  # a test left a file open
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


@pytest.fixture
def reflink_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh xfs with reflink (reflink=1), mounted under tmp_path."""
    with loop_filesystem(tmp_path, "xfs", 400 * MiB, ["-m", "reflink=1"]) as mnt:
        yield mnt
