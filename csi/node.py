"""Node service: stage, publish, stats and expansion of volumes on this host (CSI Node).

Every request is validated completely (ids, paths under the allowed roots, capability, fs type, mount
flags, mkfs options, partition) before anything touches the host. The mount table is the source of
truth, so a restarted plugin picks up where the previous one stopped. Contracts (CSI spec):
- Stage/Publish twice with the same arguments -> OK; same path, another volume or other options ->
  ALREADY_EXISTS. Unstage/Unpublish of something not mounted -> OK; Unpublish removes the target.
- A device is formatted only when blkid finds neither a filesystem nor a partition table.
- mkfs and fsck run at most `--format-concurrency` at a time.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from collections.abc import Iterator, Mapping

import grpc

from csi import keys, paths
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend, NotFoundError
from csi.capabilities import NRPC, Capabilities
from csi.config import Config
from csi.errors import AlreadyExists, FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange
from csi.inflight import InFlight
from csi.loop import device_size
from csi.mount import (
    EXT_TYPES,
    FS_TYPES,
    VFS_FLAGS,
    Mounter,
    MountError,
    MountInfo,
    OnlineGrowthDenied,
    check_fs_type,
    check_mount_flags,
    device_readonly,
    fs_size,
    mkfs_argv,
    set_device_readonly,
    stats,
)
from csi.validation import READ_ONLY_MODES, check_capability, check_string, is_block, require

AccessMode = csi_pb2.VolumeCapability.AccessMode
MAX_PARTITION = 128
GROW_SLACK = 1024**2  # grow at stage only when the device exceeds the filesystem by more than this
# Per-mount flags visible in mountinfo, compared when a target is published twice.
PER_MOUNT_FLAGS = frozenset({"nodev", "nosuid", "noexec", "noatime", "nodiratime"})


def parse_partition(volume_context: Mapping[str, str]) -> int:
    """The `partition` volume attribute: absent/"0" -> 0 (whole device), else 1..128."""
    value = volume_context.get(keys.VC_PARTITION, "")
    if value in ("", "0"):
        return 0
    if not re.fullmatch(r"[1-9][0-9]{0,2}", value) or int(value) > MAX_PARTITION:
        raise InvalidArgument(
            f"volume attribute {keys.VC_PARTITION}={value!r} must be a partition number 0..{MAX_PARTITION}"
        )
    return int(value)


def partition_path(device: str, number: int) -> str:
    """/dev/loop0 + 1 -> /dev/loop0p1; /dev/xvdf + 1 -> /dev/xvdf1."""
    if number == 0:
        return device
    return f"{device}p{number}" if device[-1].isdigit() else f"{device}{number}"


def _rdev(path: str) -> tuple[int, int]:
    st = os.stat(path)
    if not stat.S_ISBLK(st.st_mode):
        raise FailedPrecondition(f"{path} is not a block device")
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def _belongs(numbers: tuple[int, int], device: str) -> bool:
    """True when device numbers `numbers` are `device` or one of its partitions."""
    try:
        if numbers == _rdev(device):
            return True
    except (OSError, FailedPrecondition):
        return False
    sys_path = os.path.realpath(f"/sys/dev/block/{numbers[0]}:{numbers[1]}")
    parent = os.path.basename(os.path.dirname(sys_path))
    return os.path.exists(os.path.join(sys_path, "partition")) and parent == os.path.basename(
        os.path.realpath(device)
    )


def _is_block(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def _whole_device(device: str) -> str:
    """/dev/loop0p1 -> /dev/loop0 (the disk a partition belongs to); a whole disk -> itself."""
    real = os.path.realpath(device)
    sys_path = os.path.realpath(f"/sys/class/block/{os.path.basename(real)}")
    if os.path.exists(os.path.join(sys_path, "partition")):
        return "/dev/" + os.path.basename(os.path.dirname(sys_path))
    return real


@contextlib.contextmanager
def _os_failures() -> Iterator[None]:
    """OS-layer failures become INTERNAL with their (actionable) message."""
    try:
        yield
    except MountError as exc:
        raise Internal(str(exc)) from exc
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise Internal(f"{exc.strerror or exc}{where}") from exc


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(
        self,
        backend: Backend,
        config: Config,
        caps: Capabilities,
        inflight: InFlight,
        mounter: Mounter | None = None,
    ) -> None:
        self._backend = backend
        self._config = config
        self._caps = caps
        self._inflight = inflight
        self._mounter = mounter or Mounter()
        self._roots = config.node.allowed_roots
        self._format_slots = threading.BoundedSemaphore(config.node.format_concurrency)
        self._lock = threading.Lock()
        self._staged_block: set[str] = set()  # block volumes staged through this process
        self._partitions: dict[str, int] = {}  # volume id -> partition used at stage/publish

    def staged_count(self) -> int:
        """Staged volumes (for metrics): filesystems from the mount table, so the figure survives a
        restart (distinct devices mounted under the allowed roots), plus block volumes staged through
        this process (block staging mounts nothing)."""
        devices = {
            (m.major, m.minor)
            for m in self._mounter.mounts()
            if m.fs_type in FS_TYPES and paths.under_roots(m.mount_point, self._roots)
        }
        with self._lock:
            return len(devices) + len(self._staged_block)

    # ------------------------------------------------------------------ helpers

    def _check_volume_id(self, volume_id: str) -> None:
        require(volume_id, "volume_id")
        check_string(volume_id, "volume_id")

    def _check_capability(self, request: object) -> csi_pb2.VolumeCapability:
        if not request.HasField("volume_capability"):  # type: ignore[attr-defined]
            raise InvalidArgument("volume_capability is required")
        cap: csi_pb2.VolumeCapability = request.volume_capability  # type: ignore[attr-defined]
        check_capability(cap)
        return cap

    @staticmethod
    def _fs_type(cap: csi_pb2.VolumeCapability, volume_context: Mapping[str, str]) -> tuple[str, bool]:
        """(fs type, whether it was asked for explicitly)."""
        asked = cap.mount.fs_type or volume_context.get(keys.VC_FS_TYPE, "")
        return check_fs_type(asked), bool(asked)

    @staticmethod
    def _readonly(cap: csi_pb2.VolumeCapability, flags: list[str], readonly: bool = False) -> bool:
        return readonly or cap.access_mode.mode in READ_ONLY_MODES or "ro" in flags

    def _device(self, volume_id: str, publish_context: Mapping[str, str], partition: int) -> str:
        """The verified block device (or partition) of the volume on this host."""
        device = self._backend.resolve_device(volume_id, publish_context)
        target = partition_path(device, partition)
        if partition and not os.path.exists(target):
            with _os_failures():
                self._mounter.settle()
                if not os.path.exists(target):
                    self._mounter.add_partitions(device)
            if not os.path.exists(target):
                self._release_if_unused(volume_id, device)
                raise FailedPrecondition(f"partition {partition} of {device} does not exist")
        with _os_failures():
            _rdev(target)
        with self._lock:
            self._partitions[volume_id] = partition
        return target

    def _other_publishes(self, volume_numbers: tuple[int, int], root: str, exclude: set[str]) -> list[str]:
        """Mount points under the allowed roots showing the same device and root, except `exclude`."""
        return [
            m.mount_point
            for m in self._mounter.mounts()
            if (m.major, m.minor) == volume_numbers
            and m.root == root
            and m.mount_point not in exclude
            and paths.under_roots(m.mount_point, self._roots)
        ]

    # ------------------------------------------------------------------ stage

    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        """Make the volume's device ready at the staging path (mount: filesystem mounted there)."""
        volume_id = request.volume_id
        self._check_volume_id(volume_id)
        staging = paths.check_path(request.staging_target_path, "staging_target_path", self._roots)
        cap = self._check_capability(request)
        vc = dict(request.volume_context)
        partition = parse_partition(vc)
        block = is_block(cap)
        fs_type, explicit = ("", False) if block else self._fs_type(cap, vc)
        flags = check_mount_flags(cap.mount.mount_flags, None if block else fs_type)
        if not block:
            mkfs_argv("/dev/null", fs_type, vc)  # validates the format options before anything runs
        with self._inflight.hold(f"node:{volume_id}"):
            device = self._device(volume_id, request.publish_context, partition)
            if not block:
                readonly = self._readonly(cap, flags)
                try:
                    with _os_failures():
                        self._stage_filesystem(device, staging, fs_type, explicit, flags, readonly, vc)
                except BaseException:
                    self._release_if_unused(volume_id, device)
                    raise
            if block:
                with self._lock:
                    self._staged_block.add(volume_id)
        return csi_pb2.NodeStageVolumeResponse()

    def _release_if_unused(self, volume_id: str, device: str) -> None:
        """After a failed stage: release the device unless a mount still uses it. The CO never unstages
        a stage that failed with a final error, so a device kept here would stay attached for good."""
        whole = _whole_device(device)
        dev_numbers, dev_root = self._devtmpfs_numbers(whole)
        for m in self._mounter.mounts():
            if _belongs((m.major, m.minor), whole) or (
                (m.major, m.minor) == dev_numbers and m.root.startswith(dev_root)
            ):
                return
        with contextlib.suppress(Exception):  # best effort: the original failure is what the CO sees
            self._backend.release_device(volume_id)

    def _stage_filesystem(
        self,
        device: str,
        staging: str,
        fs_type: str,
        explicit: bool,
        flags: list[str],
        readonly: bool,
        vc: Mapping[str, str],
    ) -> None:
        current = self._mounter.mount_at(staging)
        if current is not None:
            self._check_staged(current, device, staging, fs_type, explicit, readonly)
            return
        if os.path.lexists(staging) and not os.path.isdir(staging):
            raise FailedPrecondition(f"staging_target_path {staging} exists and is not a directory")
        elsewhere = [m.mount_point for m in self._mounter.mounts() if _belongs((m.major, m.minor), device)]
        if elsewhere:  # fsck or mkfs of a mounted device would fail with a misleading message
            raise FailedPrecondition(
                f"{device} is already mounted at {elsewhere[0]}; a volume is staged at one path per node, "
                "so unstage it there first"
            )
        os.makedirs(staging, exist_ok=True)
        formatted = grow = False
        with self._format_slots:
            probe = self._mounter.probe(device)
            if probe.blank:
                if readonly:
                    raise FailedPrecondition(f"{device} has no filesystem and cannot be formatted read-only")
                self._mounter.mkfs(device, fs_type, vc)
                formatted = True
            elif not probe.fs_type:
                raise FailedPrecondition(
                    f"{device} holds a {probe.pt_type} partition table and no filesystem; set the "
                    f"'{keys.VC_PARTITION}' volume attribute to stage one of its partitions"
                )
            else:
                if probe.fs_type != fs_type:
                    if explicit or probe.fs_type not in FS_TYPES:
                        raise FailedPrecondition(
                            f"{device} already holds a {probe.fs_type} filesystem, not {fs_type}; "
                            "it is never reformatted"
                        )
                    fs_type = probe.fs_type
                grow = not readonly and self._needs_growth(device, fs_type)
                if grow and fs_type in EXT_TYPES:  # offline: a full check, then resize2fs
                    self._mounter.fsck(device, fs_type, full=True)
                    self._mounter.grow(device, staging, fs_type)
                    grow = False
                elif not readonly:
                    self._mounter.fsck(device, fs_type)
        mount_flags = [*flags, "ro"] if readonly and "ro" not in flags else list(flags)
        if fs_type == "xfs" and "nouuid" not in mount_flags:
            mount_flags.append("nouuid")  # a restored snapshot or clone shares its source's UUID
        self._mounter.mount(device, staging, fs_type, mount_flags)
        if grow and not formatted:  # xfs grows only while mounted
            self._mounter.grow(device, staging, fs_type)

    @staticmethod
    def _needs_growth(device: str, fs_type: str) -> bool:
        current_fs = fs_size(device, fs_type)
        return current_fs is not None and device_size(device) - current_fs > GROW_SLACK

    @staticmethod
    def _check_staged(
        current: MountInfo, device: str, staging: str, fs_type: str, explicit: bool, readonly: bool
    ) -> None:
        if not _belongs((current.major, current.minor), device):
            raise AlreadyExists(f"{staging} already holds another device ({current.source})")
        if explicit and current.fs_type != fs_type:
            raise AlreadyExists(f"volume is staged at {staging} as {current.fs_type}, not {fs_type}")
        if current.readonly != readonly:
            state = "read-only" if current.readonly else "read-write"
            raise AlreadyExists(f"volume is already staged {state} at {staging}")

    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        """Unmount the staging path and release the device. Not staged -> OK."""
        volume_id = request.volume_id
        self._check_volume_id(volume_id)
        staging = paths.check_path(request.staging_target_path, "staging_target_path", self._roots)
        with self._inflight.hold(f"node:{volume_id}"), _os_failures():
            current = self._mounter.mount_at(staging)
            if current is not None:
                others = self._other_publishes((current.major, current.minor), current.root, {staging})
                if others:
                    raise FailedPrecondition(
                        f"volume {volume_id} is still published at {others[0]}; unpublish it first"
                    )
                for _ in range(8):  # stacked mounts: peel them all
                    if not self._mounter.unmount(staging) or self._mounter.mount_at(staging) is None:
                        break
            with contextlib.suppress(NotFoundError):
                self._backend.release_device(volume_id)
            with self._lock:
                self._staged_block.discard(volume_id)
                self._partitions.pop(volume_id, None)
        return csi_pb2.NodeUnstageVolumeResponse()

    # ------------------------------------------------------------------ publish

    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        """Bind the staged volume (or, for block, the device node) onto the target path."""
        volume_id = request.volume_id
        self._check_volume_id(volume_id)
        target = paths.check_path(request.target_path, "target_path", self._roots)
        cap = self._check_capability(request)
        if not request.staging_target_path:
            raise FailedPrecondition(
                "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)"
            )
        staging = paths.check_path(request.staging_target_path, "staging_target_path", self._roots)
        if staging == target:
            raise InvalidArgument("target_path must differ from staging_target_path")
        vc = dict(request.volume_context)
        partition = parse_partition(vc)
        block = is_block(cap)
        fs_type = None if block else self._fs_type(cap, vc)[0]
        flags = check_mount_flags(cap.mount.mount_flags, fs_type)
        readonly = self._readonly(cap, flags, request.readonly)
        bind_flags = [f for f in flags if f in VFS_FLAGS and f not in ("ro", "rw")]
        if readonly:
            bind_flags.append("ro")
        single_writer = cap.access_mode.mode == AccessMode.SINGLE_NODE_SINGLE_WRITER
        with self._inflight.hold(f"node:{volume_id}"), _os_failures():
            if block:
                source = self._device(volume_id, request.publish_context, partition)
                numbers, root = self._devtmpfs_numbers(source)
            else:
                staged = self._mounter.mount_at(staging)
                if staged is None:
                    raise FailedPrecondition(
                        f"volume {volume_id} is not staged at {staging}; call NodeStageVolume first"
                    )
                source, numbers, root = staging, (staged.major, staged.minor), staged.root
            current = self._mounter.mount_at(target)
            if current is not None:
                self._check_published(current, target, numbers, root, readonly, bind_flags)
                return csi_pb2.NodePublishVolumeResponse()
            if single_writer:
                others = self._other_publishes(numbers, root, {staging, target})
                if others:
                    raise FailedPrecondition(
                        f"volume {volume_id} is SINGLE_NODE_SINGLE_WRITER and already published "
                        f"at {others[0]}"
                    )
            created = self._create_target(target, block)
            try:
                self._mounter.bind(source, target, bind_flags)
            except MountError:
                if created:
                    self._remove_target(target)
                raise
            if block:
                self._sync_block_readonly(source, numbers, root)
        return csi_pb2.NodePublishVolumeResponse()

    def _sync_block_readonly(self, device: str, numbers: tuple[int, int], root: str) -> None:
        """A read-only bind of a device node does not stop writes through it, so the device itself is
        made read-only while every publish of it is read-only (and writable again otherwise)."""
        publishes = [
            m
            for m in self._mounter.mounts()
            if (m.major, m.minor) == numbers
            and m.root == root
            and paths.under_roots(m.mount_point, self._roots)
        ]
        want = bool(publishes) and all(m.readonly for m in publishes)
        if device_readonly(device) != want:
            set_device_readonly(device, want)

    @staticmethod
    def _devtmpfs_numbers(device: str) -> tuple[tuple[int, int], str]:
        """How a bind-mounted device node shows in mountinfo: the /dev filesystem and /<name> as root."""
        real = os.path.realpath(device)
        st = os.stat(os.path.dirname(real))
        return (os.major(st.st_dev), os.minor(st.st_dev)), "/" + os.path.relpath(real, "/dev")

    @staticmethod
    def _check_published(
        current: MountInfo,
        target: str,
        numbers: tuple[int, int],
        root: str,
        readonly: bool,
        bind_flags: list[str],
    ) -> None:
        if (current.major, current.minor) != numbers or current.root != root:
            raise AlreadyExists(f"{target} already holds another volume ({current.source})")
        wanted = {f for f in bind_flags if f in PER_MOUNT_FLAGS}
        present = {f for f in current.options if f in PER_MOUNT_FLAGS}
        if current.readonly != readonly or wanted != present:
            raise AlreadyExists(f"the volume is already published at {target} with other options")

    @staticmethod
    def _create_target(target: str, block: bool) -> bool:
        """Create the mount point (directory, or an empty file for block). True when it was created."""
        if os.path.lexists(target):
            if os.path.islink(target):
                raise FailedPrecondition(f"target_path {target} is a symbolic link")
            if block and not os.path.isfile(target):
                raise FailedPrecondition(f"target_path {target} exists and is not a regular file")
            if not block and not os.path.isdir(target):
                raise FailedPrecondition(f"target_path {target} exists and is not a directory")
            return False
        if block:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
            os.close(fd)
        else:
            os.makedirs(target, mode=0o750)
        return True

    @staticmethod
    def _remove_target(target: str) -> None:
        """Remove an unmounted target: an empty directory or an empty regular file. Missing -> OK."""
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(target)
            except OSError as exc:
                raise FailedPrecondition(f"{target} is not empty after unmounting; left in place") from exc
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(target)
        else:
            raise FailedPrecondition(
                f"{target} is not a directory or empty file the driver created; left in place"
            )

    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        """Unmount the target and remove it. Not mounted or missing -> OK."""
        volume_id = request.volume_id
        self._check_volume_id(volume_id)
        target = paths.check_path(request.target_path, "target_path", self._roots)
        with self._inflight.hold(f"node:{volume_id}"), _os_failures():
            current = self._mounter.mount_at(target)
            for _ in range(8):
                if not self._mounter.unmount(target) or self._mounter.mount_at(target) is None:
                    break
            self._remove_target(target)
            device = os.path.join("/dev", current.root.lstrip("/")) if current is not None else ""
            if current is not None and current.fs_type == "devtmpfs" and _is_block(device):
                self._sync_block_readonly(device, (current.major, current.minor), current.root)
        return csi_pb2.NodeUnpublishVolumeResponse()

    # ------------------------------------------------------------------ stats and expansion

    def _known_device(self, volume_id: str) -> str:
        with self._lock:
            partition = self._partitions.get(volume_id, 0)
        return partition_path(self._backend.resolve_device(volume_id, {}), partition)

    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        """Bytes and inodes of a mounted volume, size of a block volume. Missing path -> NOT_FOUND;
        a path that is not a mount of the volume -> OK with an abnormal VolumeCondition."""
        volume_id, path = request.volume_id, request.volume_path
        self._check_volume_id(volume_id)
        require(path, "volume_path")
        if not os.path.isabs(path) or not os.path.lexists(path):
            raise NotFound(f"volume_path {path} does not exist")
        Usage = csi_pb2.VolumeUsage
        with _os_failures():
            device = self._known_device(volume_id)
            st = os.stat(path)
            if stat.S_ISBLK(st.st_mode):
                numbers = (os.major(st.st_rdev), os.minor(st.st_rdev))
                if not _belongs(numbers, device):
                    return self._abnormal(f"{path} is not the device of volume {volume_id}")
                return csi_pb2.NodeGetVolumeStatsResponse(
                    usage=[Usage(unit=Usage.BYTES, total=device_size(path))],
                    volume_condition=csi_pb2.VolumeCondition(abnormal=False, message="volume is healthy"),
                )
            mount = self._mounter.mount_at(path)
            if mount is None or not _belongs((mount.major, mount.minor), device):
                return self._abnormal(f"{path} is not a mount of volume {volume_id}")
            s = stats(path)
            condition = csi_pb2.VolumeCondition(abnormal=False, message="volume is healthy")
            if "ro" in mount.super_options and not mount.readonly:
                condition = csi_pb2.VolumeCondition(
                    abnormal=True,
                    message="the filesystem was remounted read-only (I/O or consistency errors)",
                )
            return csi_pb2.NodeGetVolumeStatsResponse(
                usage=[
                    Usage(
                        unit=Usage.BYTES, total=s.total_bytes, available=s.available_bytes, used=s.used_bytes
                    ),
                    Usage(
                        unit=Usage.INODES, total=s.total_inodes, available=s.free_inodes, used=s.used_inodes
                    ),
                ],
                volume_condition=condition,
            )

    @staticmethod
    def _abnormal(message: str) -> csi_pb2.NodeGetVolumeStatsResponse:
        return csi_pb2.NodeGetVolumeStatsResponse(
            volume_condition=csi_pb2.VolumeCondition(abnormal=True, message=message)
        )

    def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeExpandVolumeResponse:
        """Grow the mounted filesystem to its (already expanded) device; block -> the device size."""
        self._caps.require_node(NRPC.EXPAND_VOLUME, "NodeExpandVolume")
        volume_id, path = request.volume_id, request.volume_path
        self._check_volume_id(volume_id)
        require(path, "volume_path")
        if request.HasField("volume_capability"):
            check_capability(request.volume_capability)
        required = request.capacity_range.required_bytes
        limit = request.capacity_range.limit_bytes
        if required < 0 or limit < 0 or (limit and required > limit):
            raise OutOfRange("capacity_range is invalid (negative, or required_bytes above limit_bytes)")
        if not os.path.isabs(path) or not os.path.lexists(path):
            raise NotFound(f"volume_path {path} does not exist")
        with self._inflight.hold(f"node:{volume_id}"), _os_failures():
            device = self._known_device(volume_id)  # resolve_device refreshes the device size
            size = device_size(device)
            if required > size:
                raise OutOfRange(
                    f"the device of {volume_id} holds {size} bytes, less than the requested {required}; "
                    "expand the volume on the controller first"
                )
            st = os.stat(path)
            if stat.S_ISBLK(st.st_mode) or (
                request.HasField("volume_capability") and is_block(request.volume_capability)
            ):
                return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=size)
            mount = self._mounter.mount_at(path)
            if mount is None or not _belongs((mount.major, mount.minor), device):
                raise NotFound(f"volume {volume_id} is not mounted at {path}")
            if mount.fs_type not in FS_TYPES:
                raise FailedPrecondition(f"cannot grow a {mount.fs_type} filesystem")
            if mount.readonly or "ro" in mount.super_options:
                raise FailedPrecondition(f"{path} is mounted read-only; the filesystem cannot grow")
            try:
                self._mounter.grow(device, path, mount.fs_type)
            except OnlineGrowthDenied as exc:
                # csi-rules: a filesystem that cannot grow while published is FAILED_PRECONDITION
                raise FailedPrecondition(str(exc)) from exc
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=size)

    # ------------------------------------------------------------------ info

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        Cap = csi_pb2.NodeServiceCapability
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.node)]
        )

    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        """Node id, attach limit and (when the backend has topology) this node's segment."""
        ident = self._backend.node_identity()
        response = csi_pb2.NodeGetInfoResponse(
            node_id=ident.node_id,
            max_volumes_per_node=self._config.node.max_volumes_per_node or ident.max_volumes,
        )
        if self._caps.backend.topology_keys and ident.topology:
            response.accessible_topology.segments.update(ident.topology)
        return response
