"""The node's staging core, grpc-free: find and verify a volume's device, stage it (format only when
blank, mount, grow), bind-publish it, and unpublish and unstage it again (measuring and growing a staged
volume: csi/sizing.py).

Callers (NodeService) validate every request and hold the volume's in-flight key around each call; paths
are checked again only right before a mount or unmount (csi/paths.py). The mount table is the source
of truth, so a restarted plugin picks up where the previous one stopped. Contracts (CSI spec):
- stage/publish twice with the same arguments -> OK; the path holds another volume or the same one with
  other options (or the other access type) -> AlreadyExistsError. Unstage/unpublish of something not
  mounted -> OK.
- Only the named volume is touched: unstage leaves a path that holds another volume (or none of this
  one) as it is; publish from a staging path that holds another volume -> FailedPreconditionError.
- Unstage is the reverse of stage also for a volume the backend no longer knows (deleted while staged,
  after a CO force-detached it): Backend.leftover_device proves which device it left on this host.
- A device is formatted only when blkid finds neither a filesystem nor a partition table, and never
  while its filesystem is mounted or a pod has its device node; a device is released only when no
  mount, device-node bind or block staging uses it (a published block volume is not unstaged).
- A stage that fails releases the device it prepared (unless something above still uses it): the CO
  never unstages a stage that failed with a final error. mkfs and fsck run `format_concurrency` at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from csi import devices, keys, paths
from csi.backends.base import Backend
from csi.blockstagings import BlockStagings
from csi.failures import AlreadyExistsError, FailedPreconditionError, NotFoundError, os_failures
from csi.filesystems import EXT_TYPES, FS_TYPES, check_mount_flags
from csi.mount import Mounter, MountInfo, Probe
from csi.publishing import Publication, Publisher, Source
from shim import failpoints

GROW_SLACK = 1024**2  # grow at stage only when the device exceeds the filesystem by more than this


class Filesystem(NamedTuple):
    """The filesystem a mount-access stage asks for; every field already checked."""

    fs_type: str
    explicit: bool  # named by the request; otherwise an existing filesystem of another type is used
    flags: Sequence[str]
    readonly: bool
    options: Mapping[str, str]  # volume context: the mkfs options


class Uses(NamedTuple):
    """What the mount table holds of one disk and its partitions, from one read of it."""

    at_path: MountInfo | None  # whatever is mounted at the path asked about (any device)
    filesystems: list[MountInfo]  # mounts of the disk's filesystems, binds of them included
    nodes: list[MountInfo]  # binds of the disk's device nodes: block publishes


class Stager:
    """Stage, publish and expand volumes of `backend` on this host through `mounter`."""

    def __init__(
        self, backend: Backend, mounter: Mounter, roots: Sequence[str], format_concurrency: int
    ) -> None:
        self._backend = backend
        self._mounter = mounter
        self._roots = roots
        self._format_slots = threading.BoundedSemaphore(format_concurrency)
        self._lock = threading.Lock()
        self._block = BlockStagings(roots)  # block stagings: on disk, as the mount table shows none
        self._partitions: dict[str, int] = {}  # volume id -> partition used at stage/publish
        self.publisher = Publisher(mounter, roots)

    def staged_count(self) -> int:
        """Staged volumes: filesystems from the mount table, so the figure survives a restart (distinct
        devices mounted under the allowed roots), plus the block stagings recorded on this node."""
        staged = {
            (m.major, m.minor)
            for m in self._mounter.mounts()
            if m.fs_type in FS_TYPES and paths.under_roots(m.mount_point, self._roots)
        }
        return len(staged) + self._block.count()

    # ------------------------------------------------------------------ devices

    def device(self, volume_id: str, publish_context: Mapping[str, str], partition: int) -> str:
        """The verified block device (or partition) of the volume on this host."""
        device = self._backend.resolve_device(volume_id, publish_context)
        target = devices.partition_path(device, partition)
        if partition and not os.path.exists(target):
            with os_failures():
                self._mounter.settle()
                if not os.path.exists(target):
                    self._mounter.add_partitions(device)
            if not os.path.exists(target):
                self._release_if_unused(volume_id, device)
                raise FailedPreconditionError(f"partition {partition} of {device} does not exist")
        with os_failures():
            devices.rdev(target)
        with self._lock:
            self._partitions[volume_id] = partition
        return target

    def knows(self, volume_id: str) -> bool:
        """True when the volume is block-staged here, or this process staged or published it since."""
        with self._lock:
            known = volume_id in self._partitions
        return known or self._block.staged_at(volume_id) is not None

    def prepared_device(self, volume_id: str, partition: int | None = None) -> str:
        """The device (or partition) a stage already prepared; never prepares one, so a read or a
        refusal leaves the host as it was. Not prepared on this host -> NotFoundError."""
        with os_failures():
            device = self._backend.prepared_device(volume_id)
        if device is None:
            raise NotFoundError(f"volume {volume_id} is not staged on this node")
        if partition is None:
            with self._lock:
                partition = self._partitions.get(volume_id, 0)
        return devices.partition_path(device, partition)

    def uses(self, device: str, path: str = "") -> Uses:
        """How the mount table uses the disk of `device` (a disk or one of its partitions), and what is
        mounted at `path` when one is given; one read of the table."""
        whole = devices.whole_device(device)
        members = devices.family(whole)
        node_numbers, node_root = devices.devtmpfs_numbers(whole)
        table = self._mounter.mounts((path,) if path else (), members | {node_numbers})
        return Uses(
            at_path=self._mounter.mount_at(path, table) if path else None,
            filesystems=[m for m in table if (m.major, m.minor) in members],
            nodes=[
                m
                for m in table
                if (m.major, m.minor) == node_numbers and devices.names_node(m.root, node_root)
            ],
        )

    def _release_if_unused(self, volume_id: str, device: str) -> None:
        """After a failed stage: release the device unless a mount or a block staging still uses it."""
        if self._block.staged_at(volume_id) is not None:
            return
        uses = self.uses(device)
        if uses.filesystems or uses.nodes:
            return
        with contextlib.suppress(Exception):  # best effort: the original failure is what the CO sees
            self._backend.release_device(volume_id)

    # ------------------------------------------------------------------ stage

    def stage(
        self,
        volume_id: str,
        publish_context: Mapping[str, str],
        partition: int,
        staging: str,
        fs: Filesystem | None,
    ) -> None:
        """Prepare the device and, for mount access (`fs` given), mount its filesystem at `staging`.
        Staged with the other access type, at this path -> AlreadyExistsError (spec: staged but
        incompatible), elsewhere -> FailedPreconditionError; a device is never formatted or handed out
        raw while the other access type uses it."""
        device = self.device(volume_id, publish_context, partition)
        failpoints.hit("node.stage.device-ready")
        try:
            with os_failures():
                if fs is None:
                    self._stage_block(volume_id, device, staging)
                    return
                self._check_not_staged_as_block(volume_id, staging)
                blank = partition == 0 and self._backend.never_written(volume_id)
                self.stage_filesystem(device, staging, fs, blank)
        except BaseException:
            self._release_if_unused(volume_id, device)
            raise

    def _stage_block(self, volume_id: str, device: str, staging: str) -> None:
        """Block access leaves nothing in the kernel to find again: the path is recorded on disk."""
        staged_at = self._block.staged_at(volume_id)
        if staged_at == staging:
            return
        if staged_at is not None:
            raise FailedPreconditionError(
                f"volume {volume_id} is already staged at {staged_at}; a volume is staged at one path "
                "per node, so unstage it there first"
            )
        mounted = self.uses(device).filesystems
        here = [m for m in mounted if m.mount_point == staging]
        if here:
            raise AlreadyExistsError(
                f"volume {volume_id} is staged at {staging} as a filesystem, not as a block device"
            )
        if mounted:
            raise FailedPreconditionError(
                f"the filesystem of volume {volume_id} is mounted at {mounted[0].mount_point}; unstage "
                "it there before staging it as a block device"
            )
        self._block.record(volume_id, staging)

    def _check_not_staged_as_block(self, volume_id: str, staging: str) -> None:
        staged_at = self._block.staged_at(volume_id)
        if staged_at == staging:
            raise AlreadyExistsError(
                f"volume {volume_id} is staged at {staging} as a block device, not as a filesystem"
            )
        if staged_at is not None:
            raise FailedPreconditionError(
                f"volume {volume_id} is staged as a block device at {staged_at}; unstage it there first"
            )

    def stage_filesystem(
        self, device: str, staging: str, fs: Filesystem, never_written: bool = False
    ) -> None:
        """Mount the filesystem of `device` at `staging`, formatting a blank device first.
        `never_written`: the backend proved no byte of the device was ever written (Backend.never_written),
        so it is blank without probing it."""
        uses = self.uses(device, staging)  # one read, so every check below sees the same table
        if uses.at_path is not None:
            _check_staged(uses.at_path, device, staging, fs)
            if uses.at_path.fs_type == "xfs" and _needs_growth(device, "xfs"):  # cut short before its grow
                self._mounter.grow(device, staging, "xfs")
            return
        if os.path.lexists(staging) and not os.path.isdir(staging):
            raise FailedPreconditionError(f"staging_target_path {staging} exists and is not a directory")
        if uses.nodes:  # mkfs over, or a mount of, a device a pod writes to raw would destroy its data
            raise FailedPreconditionError(
                f"{device} is published as a raw block device at {uses.nodes[0].mount_point}; "
                "unpublish and unstage it there first"
            )
        elsewhere = [m.mount_point for m in uses.filesystems]
        if elsewhere:  # fsck or mkfs of a mounted device would fail with a misleading message
            raise FailedPreconditionError(
                f"{device} is already mounted at {elsewhere[0]}; a volume is staged at one path per node, "
                "so unstage it there first"
            )
        paths.make_dirs(staging, self._roots)  # the CO's, usually; never through a link planted since
        with self._format_slots:
            fs_type, grow = self._prepare(device, staging, fs, never_written)
        mount_flags = [*fs.flags, "ro"] if fs.readonly and "ro" not in fs.flags else list(fs.flags)
        if fs_type == "xfs" and "nouuid" not in mount_flags:
            mount_flags.append("nouuid")  # a restored snapshot or clone shares its source's UUID
        paths.recheck(staging, self._roots)  # the format took a while: no link planted on the way since
        self._mounter.mount(device, staging, fs_type, mount_flags)
        failpoints.hit("node.stage.mounted")
        if grow:  # xfs grows only while mounted
            self._mounter.grow(device, staging, fs_type)

    def _prepare(self, device: str, staging: str, fs: Filesystem, never_written: bool) -> tuple[str, bool]:
        """Format a blank device, or check (and, ext*, grow) the filesystem it holds. Returns the
        filesystem type to mount and whether it still has to grow once mounted (xfs). A device never
        written is blank; any other is probed (blkid), and formatted only when that finds nothing."""
        probe = Probe() if never_written else self._mounter.probe(device)
        if probe.blank:
            if fs.readonly:
                raise FailedPreconditionError(f"{device} has no filesystem and cannot be formatted read-only")
            check_mount_flags(fs.flags, fs.fs_type)  # before anything is written (see below)
            self._mounter.mkfs(device, fs.fs_type, fs.options, zeroed=never_written)
            failpoints.hit("node.stage.formatted")
            return fs.fs_type, False
        if not probe.fs_type:
            raise FailedPreconditionError(
                f"{device} holds a {probe.pt_type} partition table and no filesystem; set the "
                f"'{keys.VC_PARTITION}' volume attribute to stage one of its partitions"
            )
        fs_type = fs.fs_type
        if probe.fs_type != fs_type:
            if fs.explicit or probe.fs_type not in FS_TYPES:
                raise FailedPreconditionError(
                    f"{device} already holds a {probe.fs_type} filesystem, not {fs_type}; "
                    "it is never reformatted"
                )
            fs_type = probe.fs_type
        check_mount_flags(fs.flags, fs_type)  # naming no fs type, they were checked for any filesystem
        if fs.readonly:
            return fs_type, False
        grow = _needs_growth(device, fs_type)
        if grow and fs_type in EXT_TYPES:  # offline: a full check, then resize2fs
            self._mounter.fsck(device, fs_type, full=True)
            self._mounter.grow(device, staging, fs_type)
            grow = False
        else:
            self._mounter.fsck(device, fs_type)
        failpoints.hit("node.stage.checked")
        return fs_type, grow

    def unstage(self, volume_id: str, staging: str) -> None:
        """Unmount the volume's filesystem from the staging path (every stacked mount) and release the
        device; spec: "the reverse of NodeStageVolume", also for a volume the backend no longer knows.
        Not staged at this path -> OK, and what is mounted there (another volume) or the volume's staging
        elsewhere is left alone. Still published -> FailedPreconditionError."""
        with os_failures():
            try:
                device = self._backend.prepared_device(volume_id)
            except NotFoundError:
                device = None
            if device is None:  # unknown now (deleted while staged) or its storage went: what it left
                device = self._backend.leftover_device(volume_id)
            if device is None:  # never prepared here, or released: nothing of it is staged
                self._forget(volume_id)
                return
            block_at = self._block.staged_at(volume_id)
            if block_at not in (None, staging):
                return
            uses = self.uses(device, staging)
            if uses.at_path is not None and uses.at_path in uses.filesystems:
                self._unmount_staging(volume_id, uses.at_path, staging)
                uses = self.uses(device)
            elif block_at is None and uses.filesystems:
                return  # its filesystem is staged at another path
            if uses.nodes:
                raise FailedPreconditionError(
                    f"volume {volume_id} is still published at {uses.nodes[0].mount_point}; "
                    "unpublish it first"
                )
            if not uses.filesystems:
                with contextlib.suppress(NotFoundError):
                    self._backend.release_device(volume_id)
            self._forget(volume_id)

    def _unmount_staging(self, volume_id: str, staged: MountInfo, staging: str) -> None:
        others = self.publisher.others((staged.major, staged.minor), staged.root, {staging})
        if others:
            raise FailedPreconditionError(
                f"volume {volume_id} is still published at {others[0]}; unpublish it first"
            )
        self.publisher.peel(staging)
        failpoints.hit("node.unstage.unmounted")

    def _forget(self, volume_id: str) -> None:
        self._block.forget(volume_id)
        with self._lock:
            self._partitions.pop(volume_id, None)

    # ------------------------------------------------------------------ publish

    def publish(self, volume_id: str, partition: int, pub: Publication) -> None:
        """Bind the staged filesystem (mount access) or the staged device node (block access) onto the
        target. Unknown volume -> NotFoundError; not staged -> FailedPreconditionError; neither prepares
        anything."""
        with os_failures():
            device = self._backend.prepared_device(volume_id)  # an unknown volume -> NotFoundError
            if pub.block:
                node = self._staged_block_device(volume_id, device, partition, pub.staging)
                source = Source(node, *devices.devtmpfs_numbers(node))
            else:
                staged = self._mounter.mount_at(pub.staging)
                if (
                    staged is None
                    or device is None
                    or not devices.belongs((staged.major, staged.minor), device)
                ):
                    raise FailedPreconditionError(
                        f"volume {volume_id} is not staged at {pub.staging}; call NodeStageVolume first"
                    )
                source = Source(pub.staging, (staged.major, staged.minor), staged.root)
            self.publisher.publish(volume_id, source, pub)

    def _staged_block_device(self, volume_id: str, device: str | None, partition: int, staging: str) -> str:
        """The device node a block publish binds: the volume must be prepared here, staged at `staging`
        when a block staging is recorded (spec: not staged there -> FAILED_PRECONDITION, as for mount
        access) and its filesystem mounted nowhere (raw writes under a mounted filesystem corrupt it)."""
        if device is None:
            raise FailedPreconditionError(
                f"volume {volume_id} is not staged on this node; call NodeStageVolume first"
            )
        staged_at = self._block.staged_at(volume_id)
        if staged_at not in (None, staging):
            raise FailedPreconditionError(f"volume {volume_id} is staged at {staged_at}, not at {staging}")
        mounted = self.uses(device).filesystems
        if mounted:
            raise FailedPreconditionError(
                f"volume {volume_id} is staged as a filesystem (mounted at {mounted[0].mount_point}); "
                "publish it with mount access"
            )
        node = devices.partition_path(device, partition)
        if not devices.is_block_device(node):
            raise FailedPreconditionError(f"partition {partition} of volume {volume_id} is not staged")
        return node

    def unpublish(self, target: str) -> None:
        """Unmount the target and remove it. Not mounted or missing -> OK."""
        with os_failures():
            self.publisher.unpublish(target)


def _check_staged(current: MountInfo, device: str, staging: str, fs: Filesystem) -> None:
    if not devices.belongs((current.major, current.minor), device):
        raise AlreadyExistsError(f"{staging} already holds another device ({current.source})")
    if fs.explicit and current.fs_type != fs.fs_type:
        raise AlreadyExistsError(f"volume is staged at {staging} as {current.fs_type}, not {fs.fs_type}")
    if current.readonly != fs.readonly:
        state = "read-only" if current.readonly else "read-write"
        raise AlreadyExistsError(f"volume is already staged {state} at {staging}")


def _needs_growth(device: str, fs_type: str) -> bool:
    current_fs = devices.fs_size(device, fs_type)
    return current_fs is not None and devices.device_size(device) - current_fs > GROW_SLACK
