"""`ballast-csi demo`: a whole volume lifecycle on the local backend, each step printed with its time.

The driver runs in this process on a temporary unix socket and is driven over gRPC exactly as a CO
would: create, attach, stage, publish, write + checksum, snapshot, write more, restore the snapshot into
a new volume, stage + publish it, verify the checksum, expand online. Everything is unmounted, detached
and deleted afterwards even when a step fails (`--keep` keeps the volumes and the data dir); of a
`--data-dir` only what the demo made (DataDir.remove). Needs root: it attaches loop devices and mounts
filesystems. Exit 0 on success, 1 on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TextIO

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.config import parse_args
from csi.failures import DriverError

MiB = 1024**2
FS_TYPE = "xfs"  # grows online with CAP_SYS_ADMIN alone (online ext4 growth also needs CAP_SYS_RESOURCE)
SIZE = 512 * MiB
EXPANDED = 1024 * MiB
NODE_ID = "demo-node"
AccessMode = csi_pb2.VolumeCapability.AccessMode


class DemoError(Exception):
    """A step failed; the message says which and why."""


@dataclass
class Stubs:
    controller: csi_pb2_grpc.ControllerStub
    node: csi_pb2_grpc.NodeStub


@dataclass
class Demo:
    """Steps with timings and an undo stack that always runs."""

    out: TextIO
    undo: list[tuple[str, Callable[[], Any]]] = field(default_factory=list)
    count: int = 0
    owns_data_dir: bool = False  # the driver took the data dir (its owner lock): the demo may clean it

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[list[str]]:
        """Time one step; the step may append detail text to the yielded list."""
        self.count += 1
        notes: list[str] = []
        start = time.perf_counter()
        try:
            yield notes
        except grpc.RpcError as err:
            self._line(title, start, "FAILED")
            raise DemoError(f"{title}: {err.code().name}: {err.details()}") from err
        except Exception:
            self._line(title, start, "FAILED")
            raise
        self._line(title, start, "; ".join(notes))

    def _line(self, title: str, start: float, note: str) -> None:
        ms = (time.perf_counter() - start) * 1000
        detail = f"  {note}" if note else ""
        print(f"[{self.count:2d}] {title:<44} {ms:8.1f} ms{detail}", file=self.out, flush=True)

    def on_cleanup(self, what: str, action: Callable[[], Any]) -> None:
        self.undo.append((what, action))

    def cleanup(self) -> bool:
        """Run the undo stack newest first; every action runs even if one fails. True when all worked."""
        ok = True
        start = time.perf_counter()
        while self.undo:
            what, action = self.undo.pop()
            try:
                action()
            except (grpc.RpcError, OSError, DemoError) as exc:
                ok = False
                print(f"     cleanup: {what} failed: {exc}", file=self.out, flush=True)
        ms = (time.perf_counter() - start) * 1000
        print(f"[{self.count + 1:2d}] {'clean up everything':<44} {ms:8.1f} ms", file=self.out, flush=True)
        return ok


def _checksum(directory: str) -> str:
    """sha256 over the names and contents of the regular files in `directory`, in name order."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            digest.update(name.encode() + b"\0")
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(MiB), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def _write(directory: str, name: str, size: int) -> None:
    with open(os.path.join(directory, name), "wb") as fh:
        fh.write(os.urandom(size))
        fh.flush()
        os.fsync(fh.fileno())
    os.sync()


def _cap() -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=FS_TYPE),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=AccessMode.SINGLE_NODE_WRITER),
    )


def _human(size: int) -> str:
    return f"{size / MiB:.0f} MiB"


class Lifecycle:
    """The CO side of the demo: each method is one step and registers its own undo."""

    def __init__(self, demo: Demo, stubs: Stubs, kubelet: str, keep: bool) -> None:
        self.demo, self.stubs, self.kubelet, self.keep = demo, stubs, kubelet, keep
        self.snapshots: list[str] = []

    def create(self, name: str, source: csi_pb2.VolumeContentSource | None = None) -> str:
        request = csi_pb2.CreateVolumeRequest(
            name=name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=SIZE),
            volume_capabilities=[_cap()],
        )
        if source is not None:
            request.volume_content_source.CopyFrom(source)
        volume = self.stubs.controller.CreateVolume(request, timeout=120).volume
        if not self.keep:
            delete = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id)
            self.demo.on_cleanup(
                f"delete {volume.volume_id}", lambda: self.stubs.controller.DeleteVolume(delete)
            )
        return str(volume.volume_id)

    def attach(self, volume_id: str) -> dict[str, str]:
        request = csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume_id, node_id=NODE_ID, volume_capability=_cap()
        )
        context = dict(self.stubs.controller.ControllerPublishVolume(request, timeout=60).publish_context)
        detach = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=volume_id, node_id=NODE_ID)
        self.demo.on_cleanup(
            f"detach {volume_id}", lambda: self.stubs.controller.ControllerUnpublishVolume(detach)
        )
        return context

    def snapshot(self, volume_id: str, name: str) -> str:
        snap = self.stubs.controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name=name, source_volume_id=volume_id), timeout=300
        ).snapshot
        if not self.keep:
            delete = csi_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id)
            self.demo.on_cleanup(
                f"delete {snap.snapshot_id}", lambda: self.stubs.controller.DeleteSnapshot(delete)
            )
        self.snapshots.append(str(snap.snapshot_id))
        return str(snap.snapshot_id)

    def expand(self, volume_id: str, target: str, size: int) -> None:
        """Controller expansion, then the node grows the filesystem published at `target`."""
        self.stubs.controller.ControllerExpandVolume(
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id=volume_id,
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capability=_cap(),
            ),
            timeout=120,
        )
        self.stubs.node.NodeExpandVolume(
            csi_pb2.NodeExpandVolumeRequest(
                volume_id=volume_id,
                volume_path=target,
                staging_target_path=self.staging(volume_id),
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capability=_cap(),
            ),
            timeout=300,
        )

    def staging(self, volume_id: str) -> str:
        return os.path.join(self.kubelet, "plugins", "kubernetes.io", "csi", volume_id, "globalmount")

    def stage(self, volume_id: str, publish_context: dict[str, str]) -> None:
        staging = self.staging(volume_id)
        unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging)
        self.demo.on_cleanup(f"unstage {volume_id}", lambda: self.stubs.node.NodeUnstageVolume(unstage))
        self.stubs.node.NodeStageVolume(
            csi_pb2.NodeStageVolumeRequest(
                volume_id=volume_id,
                staging_target_path=staging,
                volume_capability=_cap(),
                publish_context=publish_context,
            ),
            timeout=300,
        )

    def publish(self, volume_id: str, pod: str, publish_context: dict[str, str]) -> str:
        target = os.path.join(self.kubelet, "pods", pod, "volumes", "kubernetes.io~csi", "data", "mount")
        unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)
        self.demo.on_cleanup(f"unpublish {target}", lambda: self.stubs.node.NodeUnpublishVolume(unpublish))
        self.stubs.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                staging_target_path=self.staging(volume_id),
                target_path=target,
                volume_capability=_cap(),
                publish_context=publish_context,
            ),
            timeout=120,
        )
        return target


def run_demo(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Entry point of `ballast-csi demo` (ns.demo_data_dir, ns.keep)."""
    if os.geteuid() != 0:
        print("ballast-csi demo needs root: it attaches loop devices and mounts filesystems", file=sys.stderr)
        return 1
    missing = [t for t in ("mkfs.xfs", "xfs_growfs", "blkid") if shutil.which(t, path=_path()) is None]
    if missing:
        print(f"ballast-csi demo: missing {', '.join(missing)}; run scripts/setup", file=sys.stderr)
        return 1
    logger = logging.getLogger("ballast")
    level = logger.level
    logger.setLevel(logging.WARNING)  # the steps are the demo's output
    try:
        return _demo(ns, out)
    finally:
        logger.setLevel(level)


class DataDir(NamedTuple):
    """A --data-dir and the names it held before the demo (None: the demo makes the dir)."""

    path: str
    before: frozenset[str] | None

    def remove(self, owned: bool) -> None:
        """Remove what the demo made: the whole dir if the demo made it or found it empty, else only the
        entries that were not there before. Not `owned` (the driver refused the dir, e.g. another
        driver's): nothing but the empty dir the demo made."""
        if not owned:
            with contextlib.suppress(OSError):
                if self.before is None:
                    os.rmdir(self.path)
        elif not self.before:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            for entry in (os.path.join(self.path, n) for n in set(os.listdir(self.path)) - self.before):
                with contextlib.suppress(OSError):
                    if os.path.isdir(entry) and not os.path.islink(entry):
                        shutil.rmtree(entry)
                    else:
                        os.unlink(entry)


def _survey(path: str) -> DataDir:
    try:
        return DataDir(path, frozenset(os.listdir(path)))
    except FileNotFoundError:
        return DataDir(path, None)


def _demo(ns: argparse.Namespace, out: TextIO) -> int:
    work = tempfile.mkdtemp(prefix="ballast-demo-")
    given = _survey(os.path.abspath(ns.demo_data_dir)) if ns.demo_data_dir else None
    data_dir = given.path if given else os.path.join(work, "data")
    demo = Demo(out)
    ok = False
    try:
        _run(demo, work, data_dir, bool(ns.keep))
        ok = True
    except (DemoError, DriverError, grpc.RpcError, OSError) as exc:
        print(f"demo failed: {exc}", file=out, flush=True)
    finally:
        cleaned = demo.cleanup()
        shutil.rmtree(os.path.join(work, "kubelet"), ignore_errors=True)
        if ns.keep:
            print(f"kept the data dir {data_dir}", file=out)
        elif given is not None:
            given.remove(demo.owns_data_dir)
        if not (ns.keep and given is None):  # the work dir goes unless it holds the kept data dir
            shutil.rmtree(work, ignore_errors=True)
    if ok and cleaned:
        print("demo finished: every step passed and everything was cleaned up", file=out)
    return 0 if ok and cleaned else 1


def _path() -> str:
    return os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def _run(demo: Demo, work: str, data_dir: str, keep: bool) -> None:
    kubelet = os.path.join(work, "kubelet")
    os.makedirs(kubelet, exist_ok=True)
    co = Lifecycle(demo, _start(demo, work, data_dir, kubelet), kubelet, keep)
    vol, target, at_snapshot = _write_and_snapshot(demo, co)
    _restore_and_verify(demo, co, at_snapshot)
    _expand(demo, co, vol, target)


def _start(demo: Demo, work: str, data_dir: str, kubelet: str) -> Stubs:
    """The driver in this process on a socket in `work`, and stubs on a channel to it."""
    from csi.server import Driver

    socket = os.path.join(work, "csi.sock")
    argv = [
        "--endpoint", f"unix://{socket}", "--data-dir", data_dir, "--kubelet-dir", kubelet,
        "--node-id", NODE_ID, "--log-level", "warning",
    ]  # fmt: skip
    with demo.step("start the driver (all services, local backend)") as notes:
        config, _ = parse_args(argv)
        driver = Driver(config)  # raises, touching nothing, when another process holds the data dir
        demo.owns_data_dir = True
        demo.on_cleanup("stop the driver", lambda: driver.stop(grace=10))
        driver.start()
        channel = grpc.insecure_channel(f"unix://{socket}")
        grpc.channel_ready_future(channel).result(timeout=10)
        demo.on_cleanup("close the channel", channel.close)
        notes.append(f"socket {socket}")
    return Stubs(csi_pb2_grpc.ControllerStub(channel), csi_pb2_grpc.NodeStub(channel))


def _write_and_snapshot(demo: Demo, co: Lifecycle) -> tuple[str, str, str]:
    """A volume published to a pod path, written, checksummed and snapshotted, then written again.
    Returns (volume id, pod path, checksum at the snapshot)."""
    with demo.step("create volume (512 MiB)") as notes:
        vol = co.create("demo-data")
        notes.append(vol)
    with demo.step("controller publish to the node") as notes:
        pc = co.attach(vol)
        notes.append(", ".join(f"{k}={v}" for k, v in pc.items()))
    with demo.step(f"stage (format {FS_TYPE}, mount)"):
        co.stage(vol, pc)
    with demo.step("publish to the pod path") as notes:
        target = co.publish(vol, "pod-a", pc)
        notes.append(target)
    with demo.step("write 16 MiB and checksum it") as notes:
        _write(target, "a.bin", 16 * MiB)
        at_snapshot = _checksum(target)
        notes.append(f"sha256 {at_snapshot[:16]}...")
    with demo.step("snapshot the volume") as notes:
        notes.append(co.snapshot(vol, "demo-snap"))
    with demo.step("write 8 MiB more") as notes:
        _write(target, "b.bin", 8 * MiB)
        notes.append(f"sha256 now {_checksum(target)[:16]}...")
    return vol, target, at_snapshot


def _restore_and_verify(demo: Demo, co: Lifecycle, at_snapshot: str) -> None:
    with demo.step("restore the snapshot into a new volume") as notes:
        source = csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=co.snapshots[-1])
        )
        restored = co.create("demo-restored", source)
        notes.append(restored)
    with demo.step("controller publish, stage and publish it"):
        pc = co.attach(restored)
        co.stage(restored, pc)
        target = co.publish(restored, "pod-b", pc)
    with demo.step("verify the checksum of the snapshot instant") as notes:
        got = _checksum(target)
        if got != at_snapshot:
            raise DemoError(f"restored data differs: sha256 {got} != {at_snapshot}")
        if os.path.exists(os.path.join(target, "b.bin")):
            raise DemoError("the restored volume holds data written after the snapshot")
        notes.append("match")


def _expand(demo: Demo, co: Lifecycle, vol: str, target: str) -> None:
    with demo.step("expand the volume online to 1 GiB") as notes:
        before = _fs_bytes(target)
        co.expand(vol, target, EXPANDED)
        after = _fs_bytes(target)
        if after <= before:
            raise DemoError(f"the filesystem did not grow ({before} -> {after} bytes)")
        notes.append(f"filesystem {_human(before)} -> {_human(after)}")


def _fs_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize
