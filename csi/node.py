"""Node service: stage, publish, stats and expansion of volumes on this host (CSI Node).

Every handler validates its request completely (ids, paths under the allowed roots, capability, fs type,
mount flags, mkfs options, partition) before anything touches the host, holds the volume's in-flight key
(`node:<id>`), lets the staging core (csi/staging.py) do the work, and builds the reply. Stage, publish
and their reverses also hold the path's key (`path:<resolved path>`): two volumes at one path at once
would both find it free and stack their mounts; the second is ABORTED, as a duplicate call is. Handlers
only raise; csi.errors turns exceptions into status codes. The contracts are stated in csi/staging.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import grpc

from csi import keys, paths, replies, sizing
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend
from csi.capabilities import NRPC, Capabilities
from csi.config import Config
from csi.failures import (
    DriverError,
    FailedPreconditionError,
    InvalidParameterError,
    NotFoundError,
    OutOfRangeError,
)
from csi.filesystems import (
    VFS_FLAGS,
    check_fs_type,
    check_mount_flags,
    check_mount_flags_any,
    mkfs_argv,
    requested_fs_type,
)
from csi.health_rpcs import NodeHealthRPCs
from csi.inflight import InFlight
from csi.mount import Mounter
from csi.nodehealth import NodeHealth
from csi.publishing import Publication
from csi.staging import Filesystem, Stager
from csi.validation import (
    READ_ONLY_MODES,
    check_capability,
    check_string,
    is_block,
    parse_partition,
    require,
)

AccessMode = csi_pb2.VolumeCapability.AccessMode
SINGLE_TARGET_MODES = frozenset({AccessMode.SINGLE_NODE_WRITER, AccessMode.SINGLE_NODE_READER_ONLY})


def _check_volume_id(volume_id: str) -> None:
    require(volume_id, "volume_id")
    check_string(volume_id, "volume_id")


def _capability(request: object) -> csi_pb2.VolumeCapability:
    if not request.HasField("volume_capability"):  # type: ignore[attr-defined]
        raise InvalidParameterError("volume_capability is required")
    cap: csi_pb2.VolumeCapability = request.volume_capability  # type: ignore[attr-defined]
    check_capability(cap)
    return cap


def _fs_type(cap: csi_pb2.VolumeCapability, volume_context: Mapping[str, str]) -> tuple[str, bool]:
    """(fs type, whether it was asked for explicitly)."""
    asked = requested_fs_type(cap.mount.fs_type, volume_context)
    return check_fs_type(asked), bool(asked)


def _mount_flags(cap: csi_pb2.VolumeCapability, fs_type: str, explicit: bool) -> list[str]:
    """The capability's mount flags, for its filesystem; with none named, for any (the device may
    already hold another than the default: the stage checks them against the one it finds)."""
    if explicit:
        return check_mount_flags(cap.mount.mount_flags, fs_type)
    return check_mount_flags_any(cap.mount.mount_flags)


def _readonly(
    cap: csi_pb2.VolumeCapability,
    flags: list[str],
    publish_context: Mapping[str, str],
    readonly: bool = False,
) -> bool:
    """Read-only when the node request, the access mode, a mount flag or a read-only
    ControllerPublishVolume (its publish context) says so."""
    return (
        readonly
        or cap.access_mode.mode in READ_ONLY_MODES
        or "ro" in flags
        or publish_context.get(keys.PC_READONLY) == "true"
    )


class NodeService(NodeHealthRPCs, csi_pb2_grpc.NodeServicer):
    def __init__(
        self,
        backend: Backend,
        config: Config,
        caps: Capabilities,
        inflight: InFlight,
        mounter: Mounter | None = None,
    ) -> None:
        self._backend = backend
        self._max_volumes = config.node.max_volumes_per_node
        self._caps = caps
        self._inflight = inflight
        # With their resolved forms: the mount table shows a kubelet dir reached through a symlink resolved.
        self._roots = paths.with_resolved(config.node.allowed_roots)
        mounter = self._mounter = mounter or Mounter()
        self.stager = Stager(backend, mounter, self._roots, config.node.format_concurrency)
        self.health = NodeHealth(backend, mounter, self._roots, self.stager)

    def staged_count(self) -> int:
        """Staged volumes on this node (for metrics)."""
        return self.stager.staged_count()

    def _path(self, path: str, field: str) -> str:
        """The resolved form of a staging or target path the node acts on (csi/paths.py has the rule)."""
        return paths.check_path(path, field, self._roots)

    def _volume_path(self, volume_id: str, path: str) -> str:
        """The resolved volume_path of a read: a malformed string -> INVALID_ARGUMENT; a path where no
        volume can be (relative, outside the allowed roots as written or once its symbolic links are
        followed, itself a link) or that does not exist -> NOT_FOUND (spec: the volume does not exist
        at that path); one there that cannot be read (EIO from a failed filesystem) -> INTERNAL."""
        paths.check_path_form(path, "volume_path")
        resolved, problem = paths.placed(path, self._roots)
        if problem:
            raise NotFoundError(f"volume {volume_id} is not at volume_path: it {problem}")
        try:
            os.lstat(resolved)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFoundError(f"volume_path {path} does not exist") from exc
        except OSError as exc:  # there, but unreadable (a failed filesystem: EIO): not "does not exist"
            raise DriverError(f"volume_path {path} cannot be read: {exc.strerror or exc}") from exc
        return resolved

    def _one_target(self, mode: int) -> bool:
        """Whether `mode` allows one publish per node. Spec, for a plugin with SINGLE_NODE_MULTI_WRITER:
        a "Non MULTI_NODE_..." volume published at another target -> FAILED_PRECONDITION; without that
        capability a CO has no other mode for many pods on one node, so only SINGLE_NODE_SINGLE_WRITER
        is held to one target."""
        if mode == AccessMode.SINGLE_NODE_SINGLE_WRITER:
            return True
        return NRPC.SINGLE_NODE_MULTI_WRITER in self._caps.node and mode in SINGLE_TARGET_MODES

    # ------------------------------------------------------------------ stage

    def NodeStageVolume(
        self, request: csi_pb2.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeStageVolumeResponse:
        """Make the volume's device ready at the staging path (mount: filesystem mounted there)."""
        volume_id = request.volume_id
        _check_volume_id(volume_id)
        staging = self._path(request.staging_target_path, "staging_target_path")
        cap = _capability(request)
        vc = dict(request.volume_context)
        partition = parse_partition(vc)
        fs = None
        if is_block(cap):
            check_mount_flags(cap.mount.mount_flags, None)
        else:
            fs_type, explicit = _fs_type(cap, vc)
            flags = _mount_flags(cap, fs_type, explicit)
            mkfs_argv("/dev/null", fs_type, vc)  # validates the format options before anything runs
            fs = Filesystem(fs_type, explicit, flags, _readonly(cap, flags, request.publish_context), vc)
        with self._inflight.hold(f"node:{volume_id}", f"path:{staging}"):
            self.stager.stage(volume_id, request.publish_context, partition, staging, fs)
        return csi_pb2.NodeStageVolumeResponse()

    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        """Unmount the staging path and release the device. Not staged -> OK."""
        volume_id = request.volume_id
        _check_volume_id(volume_id)
        staging = self._path(request.staging_target_path, "staging_target_path")
        with self._inflight.hold(f"node:{volume_id}", f"path:{staging}"):
            self.stager.unstage(volume_id, staging)
        return csi_pb2.NodeUnstageVolumeResponse()

    # ------------------------------------------------------------------ publish

    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        """Bind the staged volume (or, for block, the device node) onto the target path."""
        volume_id = request.volume_id
        _check_volume_id(volume_id)
        target = self._path(request.target_path, "target_path")
        cap = _capability(request)
        if not request.staging_target_path:
            raise FailedPreconditionError(
                "staging_target_path is required: this driver stages volumes (STAGE_UNSTAGE_VOLUME)"
            )
        staging = self._path(request.staging_target_path, "staging_target_path")
        if staging == target:
            raise InvalidParameterError("target_path must differ from staging_target_path")
        vc = dict(request.volume_context)
        partition = parse_partition(vc)
        block = is_block(cap)
        flags = (
            check_mount_flags(cap.mount.mount_flags, None) if block else _mount_flags(cap, *_fs_type(cap, vc))
        )
        readonly = _readonly(cap, flags, request.publish_context, request.readonly)
        bind_flags = [f for f in flags if f in VFS_FLAGS and f not in ("ro", "rw")]
        if readonly:
            bind_flags.append("ro")
        single_writer = self._one_target(cap.access_mode.mode)
        pub = Publication(staging, target, block, readonly, bind_flags, single_writer)
        with self._inflight.hold(f"node:{volume_id}", f"path:{target}"):
            self.stager.publish(volume_id, partition, pub)
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        """Unmount the target and remove it. Not mounted or missing -> OK."""
        volume_id = request.volume_id
        _check_volume_id(volume_id)
        target = self._path(request.target_path, "target_path")
        with self._inflight.hold(f"node:{volume_id}", f"path:{target}"):
            self.stager.unpublish(target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    # ------------------------------------------------------------------ stats and expansion

    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        """Bytes and inodes of a mounted volume, size of a block volume. A read: it prepares nothing.
        Unknown or unstaged volume, a path outside the allowed roots or a missing one, or a path that is
        not the volume's device or a mount of it -> NOT_FOUND; what is wrong with a volume is
        NodeGetVolumeHealth's to say."""
        _check_volume_id(request.volume_id)
        require(request.volume_path, "volume_path")
        device = self.stager.prepared_device(request.volume_id)
        path = self._volume_path(request.volume_id, request.volume_path)
        return replies.volume_stats(sizing.stats(self._mounter, request.volume_id, device, path))

    def NodeExpandVolume(
        self, request: csi_pb2.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeExpandVolumeResponse:
        """Grow the mounted filesystem to its (already expanded) device; block -> the device size.
        Unknown or unstaged volume, or a path outside the allowed roots -> NOT_FOUND, and nothing is
        prepared."""
        self._caps.require_node(NRPC.EXPAND_VOLUME, "NodeExpandVolume")
        volume_id = request.volume_id
        _check_volume_id(volume_id)
        require(request.volume_path, "volume_path")
        block = False
        if request.HasField("volume_capability"):
            check_capability(request.volume_capability)
            block = is_block(request.volume_capability)
        required = request.capacity_range.required_bytes
        limit = request.capacity_range.limit_bytes
        if required < 0 or limit < 0 or (limit and required > limit):
            raise OutOfRangeError("capacity_range is invalid (negative, or required_bytes above limit_bytes)")
        with self._inflight.hold(f"node:{volume_id}"):
            device = self.stager.prepared_device(volume_id)  # refreshed to the volume's size
            path = self._volume_path(request.volume_id, request.volume_path)
            size = sizing.expand(self._mounter, volume_id, device, path, required, block)
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
            node_id=ident.node_id, max_volumes_per_node=self._max_volumes or ident.max_volumes
        )
        if self._caps.backend.topology_keys and ident.topology:
            response.accessible_topology.segments.update(ident.topology)
        return response
