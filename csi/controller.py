"""Controller service: provisioning, attachment, snapshots, expansion, listing (CSI Controller).

Every handler: check the capability -> validate the request -> hold the in-flight key -> call the backend
-> build the response. Handlers only raise; csi.errors turns exceptions into status codes.
In-flight keys: `create:<name>`, `vol:<id>` (delete, expand, modify), `publish:<id>:<node>`,
`snapshot:<name>`, `snap:<id>`. A backend that coalesces modifications (EBS) must see an expand and a
modify of one volume together to merge them, so there they hold `expand:<id>` and `modify:<id>` instead
of `vol:<id>` (a duplicate of either is still refused), and delete holds all three. Volume ids in keys
are the backend's canonical ids, so two spellings of one volume are one key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import grpc

from csi import keys
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend, ContentSource, Disk, DiskOptions, SourceKind
from csi.capabilities import CRPC, Capabilities
from csi.failures import FailedPreconditionError, InvalidParameterError, NotFoundError, OutOfRangeError
from csi.filesystems import check_fs_type
from csi.health_rpcs import ControllerHealthRPCs
from csi.inflight import InFlight
from csi.replies import snapshot_message, volume_message
from csi.validation import (
    MULTI_NODE_MODES,
    capacity_bytes,
    check_capabilities,
    check_capability,
    check_capability_form,
    check_ids,
    check_string,
    filesystem_floor,
    is_block,
    require,
    sidecar_metadata,
    split_parameters,
    strip_k8s_keys,
)


def _check_fs_type(caps: list[csi_pb2.VolumeCapability]) -> None:
    for cap in caps:
        if cap.HasField("mount"):
            check_fs_type(cap.mount.fs_type, "fs_type")


def _check_serves(disk: Disk, caps: list[csi_pb2.VolumeCapability]) -> None:
    """A single-node volume cannot serve a multi-node access mode (InvalidParameterError)."""
    if not disk.multi_node and any(c.access_mode.mode in MULTI_NODE_MODES for c in caps):
        raise InvalidParameterError(f"volume {disk.id} was created for a single node")


class ControllerService(ControllerHealthRPCs, csi_pb2_grpc.ControllerServicer):
    def __init__(self, backend: Backend, caps: Capabilities, inflight: InFlight) -> None:
        self._backend = backend
        self._caps = caps
        self._inflight = inflight

    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        Cap = csi_pb2.ControllerServiceCapability
        return csi_pb2.ControllerGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.controller)]
        )

    # ---- volumes

    def _modification_key(self, volume_id: str, kind: str) -> str:
        """The in-flight key of an expand or a modify (`kind`) of a volume (see the module docstring)."""
        vid = self._backend.canonical_volume_id(volume_id)
        return f"{kind}:{vid}" if self._backend.capabilities.coalesces_modifications else f"vol:{vid}"

    def _volume_keys(self, volume_id: str) -> tuple[str, ...]:
        """DeleteVolume's in-flight keys: the volume's, and those an expand or a modify of it holds."""
        vid = self._backend.canonical_volume_id(volume_id)
        return (f"vol:{vid}", f"expand:{vid}", f"modify:{vid}")

    def _mutable(self, given: Mapping[str, str]) -> dict[str, str]:
        """Validated mutable parameters, without the names a sidecar adds (csi.storage.k8s.io/)."""
        parameters = strip_k8s_keys(given)
        if not parameters:
            return {}
        if CRPC.MODIFY_VOLUME not in self._caps.controller:
            raise InvalidParameterError("mutable_parameters are not supported by this driver's backend")
        return self._backend.validate_mutable_parameters(parameters)

    def _source(self, request: csi_pb2.CreateVolumeRequest) -> ContentSource | None:
        if not request.HasField("volume_content_source"):
            return None
        src = request.volume_content_source
        kind = src.WhichOneof("type")
        if kind == "snapshot":
            self._caps.require_controller(CRPC.CREATE_DELETE_SNAPSHOT, "creating a volume from a snapshot")
            require(src.snapshot.snapshot_id, "volume_content_source.snapshot.snapshot_id")
            return ContentSource(SourceKind.SNAPSHOT, src.snapshot.snapshot_id)
        if kind == "volume":
            self._caps.require_controller(CRPC.CLONE_VOLUME, "cloning a volume")
            require(src.volume.volume_id, "volume_content_source.volume.volume_id")
            return ContentSource(SourceKind.VOLUME, src.volume.volume_id)
        raise InvalidParameterError("volume_content_source must name a snapshot or a volume")

    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeResponse:
        """Idempotent by name: same arguments -> the same volume; different -> ALREADY_EXISTS."""
        check_ids(request)
        require(request.name, "name")
        check_string(request.name, "name")
        caps = list(request.volume_capabilities)
        check_capabilities(caps)
        _check_fs_type(caps)
        volume_context, rest = split_parameters(request.parameters, caps)
        b = self._backend.capabilities
        floor = filesystem_floor(request.capacity_range, volume_context, caps)
        size = capacity_bytes(
            request.capacity_range,
            default=b.default_size,
            granularity=b.size_granularity,
            minimum=max(b.min_size, floor),
        )
        options = DiskOptions(
            size_bytes=size,
            parameters=self._backend.validate_parameters(rest),
            context=volume_context,
            mutable_parameters=self._mutable(request.mutable_parameters),
            requisite=[dict(t.segments) for t in request.accessibility_requirements.requisite],
            preferred=[dict(t.segments) for t in request.accessibility_requirements.preferred],
            source=self._source(request),
            multi_node=any(c.access_mode.mode in MULTI_NODE_MODES for c in caps),
            block=any(is_block(c) for c in caps),
            metadata=sidecar_metadata(request.parameters, keys.CLAIM_METADATA),
            size_range=(request.capacity_range.required_bytes, request.capacity_range.limit_bytes),
        )
        with self._inflight.hold(f"create:{request.name}"):
            disk = self._backend.create_volume(request.name, options)
        return csi_pb2.CreateVolumeResponse(volume=volume_message(disk))

    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeResponse:
        """Unknown or already deleted -> OK; still published -> FAILED_PRECONDITION."""
        check_ids(request)
        require(request.volume_id, "volume_id")
        with self._inflight.hold(*self._volume_keys(request.volume_id)), contextlib.suppress(NotFoundError):
            self._backend.delete_volume(request.volume_id)
        return csi_pb2.DeleteVolumeResponse()

    def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerPublishVolumeResponse:
        """Idempotent per (volume, node); another readonly flag on the same node -> ALREADY_EXISTS."""
        self._caps.require_controller(CRPC.PUBLISH_UNPUBLISH_VOLUME, "ControllerPublishVolume")
        check_ids(request)
        require(request.volume_id, "volume_id")
        require(request.node_id, "node_id")
        require(request.HasField("volume_capability"), "volume_capability")
        check_capability(request.volume_capability)
        with self._inflight.hold(f"publish:{request.volume_id}:{request.node_id}"):
            ctx = self._backend.attach(request.volume_id, request.node_id, request.readonly)
        if request.readonly:  # spec: with PUBLISH_READONLY, readonly "SP MUST publish the volume in
            ctx = {**ctx, keys.PC_READONLY: "true"}  # readonly mode"; the node's mounts carry it out
        return csi_pb2.ControllerPublishVolumeResponse(publish_context=ctx)

    def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerUnpublishVolumeResponse:
        """Not attached, or the volume is gone (so it is detached) -> OK. No node_id: from all nodes."""
        self._caps.require_controller(CRPC.PUBLISH_UNPUBLISH_VOLUME, "ControllerUnpublishVolume")
        check_ids(request)
        require(request.volume_id, "volume_id")
        try:
            nodes = (
                [request.node_id]
                if request.node_id
                else [a.node_id for a in self._backend.get_volume(request.volume_id).attachments]
            )
            for node in nodes:
                with self._inflight.hold(f"publish:{request.volume_id}:{node}"):
                    self._backend.detach(request.volume_id, node)
        except NotFoundError:
            pass
        return csi_pb2.ControllerUnpublishVolumeResponse()

    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        """Confirms the request only when every capability and parameter is supported for this volume.
        A malformed capability (no access type, access mode UNKNOWN) -> INVALID_ARGUMENT; a well-formed
        one the volume cannot serve -> OK without `confirmed`, and a message saying why."""
        check_ids(request)
        require(request.volume_id, "volume_id")
        caps = list(request.volume_capabilities)
        require(caps, "volume_capabilities")
        for i, cap in enumerate(caps):
            check_capability_form(cap, f"volume_capabilities[{i}]")
        disk = self._backend.get_volume(request.volume_id)
        try:
            check_capabilities(caps)
            _check_fs_type(caps)
            _check_serves(disk, caps)
            _, rest = split_parameters(request.parameters, caps)
            self._backend.validate_parameters(rest)
            if request.mutable_parameters:
                self._mutable(request.mutable_parameters)
        except InvalidParameterError as exc:
            return csi_pb2.ValidateVolumeCapabilitiesResponse(message=str(exc))
        Confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed
        return csi_pb2.ValidateVolumeCapabilitiesResponse(
            confirmed=Confirmed(
                volume_context=dict(request.volume_context),
                volume_capabilities=caps,
                parameters=dict(request.parameters),
                mutable_parameters=dict(request.mutable_parameters),
            )
        )

    def _published(self, disk: Disk) -> list[str]:
        if CRPC.LIST_VOLUMES_PUBLISHED_NODES not in self._caps.controller:
            return []
        return [a.node_id for a in disk.attachments]

    def ListVolumes(
        self, request: csi_pb2.ListVolumesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ListVolumesResponse:
        """Paged with opaque tokens; a token this driver did not issue -> ABORTED."""
        self._caps.require_controller(CRPC.LIST_VOLUMES, "ListVolumes")
        if request.max_entries < 0:
            raise InvalidParameterError("max_entries must not be negative")
        page = self._backend.list_volumes(request.max_entries, request.starting_token)
        Entry, Status = csi_pb2.ListVolumesResponse.Entry, csi_pb2.ListVolumesResponse.VolumeStatus
        return csi_pb2.ListVolumesResponse(
            entries=[
                Entry(volume=volume_message(d), status=Status(published_node_ids=self._published(d)))
                for d in page.items
            ],
            next_token=page.next_token,
        )

    def GetCapacity(
        self, request: csi_pb2.GetCapacityRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetCapacityResponse:
        self._caps.require_controller(CRPC.GET_CAPACITY, "GetCapacity")
        if request.volume_capabilities:
            check_capabilities(request.volume_capabilities)
        _, rest = split_parameters(request.parameters, request.volume_capabilities)
        params = self._backend.validate_parameters(rest)
        topology = (
            dict(request.accessible_topology.segments) if request.HasField("accessible_topology") else None
        )
        available = self._backend.get_capacity(params, topology)
        resp = csi_pb2.GetCapacityResponse(available_capacity=available)
        resp.minimum_volume_size.value = self._backend.capabilities.min_size
        return resp

    def ControllerExpandVolume(
        self, request: csi_pb2.ControllerExpandVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerExpandVolumeResponse:
        """Online. A target at or below the current size -> OK with the current size, nothing changes:
        Kubernetes retries a failed expansion with a lower target (RecoverVolumeExpansionFailure), and
        volumes never shrink. A size the backend can never reach -> OUT_OF_RANGE ("the capacity range is
        not allowed by the Plugin", CSI spec)."""
        self._caps.require_controller(CRPC.EXPAND_VOLUME, "ControllerExpandVolume")
        check_ids(request)
        require(request.volume_id, "volume_id")
        require(request.HasField("capacity_range"), "capacity_range")
        cr = request.capacity_range
        require(cr.required_bytes or cr.limit_bytes, "capacity_range.required_bytes")
        block = False
        if request.HasField("volume_capability"):
            check_capability(request.volume_capability)
            block = is_block(request.volume_capability)
        b = self._backend.capabilities
        size = capacity_bytes(cr, default=b.default_size, granularity=b.size_granularity, minimum=b.min_size)
        if not cr.required_bytes:  # spec: 0 "is equal to an unspecified field value": only a limit, no growth
            size = 0
        with self._inflight.hold(self._modification_key(request.volume_id, "expand")):
            disk = self._backend.get_volume(request.volume_id)
            if request.HasField("volume_capability"):  # spec: exceeds capabilities -> INVALID_ARGUMENT
                _check_serves(disk, [request.volume_capability])
            if size <= disk.size_bytes:
                new_size = disk.size_bytes
            else:
                if disk.attachments and not b.expand_online:
                    raise FailedPreconditionError(
                        f"volume {disk.id} is published; unpublish it to expand it offline"
                    )
                new_size = self._backend.expand_volume(request.volume_id, size)
        if cr.limit_bytes and new_size > cr.limit_bytes:
            raise OutOfRangeError(
                f"volume {disk.id} is already {new_size} bytes, above limit_bytes {cr.limit_bytes}"
            )
        return csi_pb2.ControllerExpandVolumeResponse(
            capacity_bytes=new_size, node_expansion_required=not block
        )

    def ControllerGetVolume(
        self, request: csi_pb2.ControllerGetVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetVolumeResponse:
        self._caps.require_controller(CRPC.GET_VOLUME, "ControllerGetVolume")
        check_ids(request)
        require(request.volume_id, "volume_id")
        disk = self._backend.get_volume(request.volume_id)
        Status = csi_pb2.ControllerGetVolumeResponse.VolumeStatus
        return csi_pb2.ControllerGetVolumeResponse(
            volume=volume_message(disk),
            status=Status(published_node_ids=self._published(disk)),
        )

    def ControllerModifyVolume(
        self, request: csi_pb2.ControllerModifyVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerModifyVolumeResponse:
        """All-or-nothing: no mutable_parameters, or any unsupported key or value -> INVALID_ARGUMENT and
        nothing changes."""
        self._caps.require_controller(CRPC.MODIFY_VOLUME, "ControllerModifyVolume")
        check_ids(request)
        require(request.volume_id, "volume_id")
        require(request.mutable_parameters, "mutable_parameters")  # spec: REQUIRED
        with self._inflight.hold(self._modification_key(request.volume_id, "modify")):
            self._backend.get_volume(request.volume_id)
            self._backend.modify_volume(
                request.volume_id,
                self._mutable(request.mutable_parameters),
                metadata=sidecar_metadata(request.mutable_parameters, keys.CLAIM_METADATA),
            )
        return csi_pb2.ControllerModifyVolumeResponse()

    # ---- snapshots

    def CreateSnapshot(
        self, request: csi_pb2.CreateSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateSnapshotResponse:
        """Idempotent by name and source; same name, other source -> ALREADY_EXISTS. Requisite
        topology the backend cannot serve -> RESOURCE_EXHAUSTED."""
        self._caps.require_controller(CRPC.CREATE_DELETE_SNAPSHOT, "CreateSnapshot")
        check_ids(request)
        require(request.name, "name")
        check_string(request.name, "name")
        require(request.source_volume_id, "source_volume_id")
        if request.HasField("accessibility_requirements") and not self._caps.snapshot_topology:
            # spec: the field SHALL NOT be set unless SNAPSHOT_ACCESSIBILITY_CONSTRAINTS is advertised
            raise InvalidParameterError(
                "accessibility_requirements are not supported by this driver's backend"
            )
        requisite = [dict(t.segments) for t in request.accessibility_requirements.requisite]
        args = (request.name, request.source_volume_id, strip_k8s_keys(request.parameters))
        metadata = sidecar_metadata(request.parameters, keys.SNAPSHOT_METADATA)
        with self._inflight.hold(f"snapshot:{request.name}"):
            if requisite:
                snap = self._backend.create_snapshot(*args, requisite=requisite, metadata=metadata)
            else:
                snap = self._backend.create_snapshot(*args, metadata=metadata)
        return csi_pb2.CreateSnapshotResponse(snapshot=snapshot_message(snap))

    def DeleteSnapshot(
        self, request: csi_pb2.DeleteSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteSnapshotResponse:
        """Unknown -> OK; a member of a group snapshot -> INVALID_ARGUMENT."""
        self._caps.require_controller(CRPC.CREATE_DELETE_SNAPSHOT, "DeleteSnapshot")
        check_ids(request)
        require(request.snapshot_id, "snapshot_id")
        with self._inflight.hold(f"snap:{request.snapshot_id}"), contextlib.suppress(NotFoundError):
            self._backend.delete_snapshot(request.snapshot_id)
        return csi_pb2.DeleteSnapshotResponse()

    def ListSnapshots(
        self, request: csi_pb2.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ListSnapshotsResponse:
        """Unknown snapshot id or source volume -> empty list; foreign token -> ABORTED."""
        self._caps.require_controller(CRPC.LIST_SNAPSHOTS, "ListSnapshots")
        check_ids(request)
        if request.max_entries < 0:
            raise InvalidParameterError("max_entries must not be negative")
        page = self._backend.list_snapshots(
            snapshot_id=request.snapshot_id,
            source_volume_id=request.source_volume_id,
            max_entries=request.max_entries,
            starting_token=request.starting_token,
        )
        Entry = csi_pb2.ListSnapshotsResponse.Entry
        return csi_pb2.ListSnapshotsResponse(
            entries=[Entry(snapshot=snapshot_message(s)) for s in page.items], next_token=page.next_token
        )

    def GetSnapshot(
        self, request: csi_pb2.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetSnapshotResponse:
        """Unknown -> NOT_FOUND."""
        self._caps.require_controller(CRPC.GET_SNAPSHOT, "GetSnapshot")
        check_ids(request)
        require(request.snapshot_id, "snapshot_id")
        return csi_pb2.GetSnapshotResponse(
            snapshot=snapshot_message(self._backend.get_snapshot(request.snapshot_id))
        )
