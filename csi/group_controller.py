"""GroupController service: crash-consistent volume group snapshots (CSI GroupController).

The backend takes every member snapshot at one instant; this layer validates, guards by group name or
id, and builds responses. Handlers only raise; csi.errors turns exceptions into status codes.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend, GroupSnapshot
from csi.capabilities import Capabilities
from csi.failures import InvalidParameterError, NotFoundError
from csi.inflight import InFlight
from csi.replies import group_message
from csi.validation import check_ids, check_string, require, strip_k8s_keys


def _check_members(group: GroupSnapshot, snapshot_ids: Sequence[str]) -> None:
    """Spec: snapshot_ids, when given, must be exactly the group's members."""
    if snapshot_ids and sorted(snapshot_ids) != sorted(s.id for s in group.snapshots):
        raise InvalidParameterError(f"snapshot_ids do not match the members of group snapshot {group.id}")


class GroupControllerService(csi_pb2_grpc.GroupControllerServicer):
    def __init__(self, backend: Backend, caps: Capabilities, inflight: InFlight) -> None:
        self._backend = backend
        self._caps = caps
        self._inflight = inflight

    def GroupControllerGetCapabilities(
        self, request: csi_pb2.GroupControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GroupControllerGetCapabilitiesResponse:
        Cap = csi_pb2.GroupControllerServiceCapability
        return csi_pb2.GroupControllerGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.group_controller)]
        )

    def CreateVolumeGroupSnapshot(
        self, request: csi_pb2.CreateVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeGroupSnapshotResponse:
        """Idempotent by name and member volumes; same name, other volumes -> ALREADY_EXISTS;
        unknown volume -> NOT_FOUND."""
        self._caps.require_group("CreateVolumeGroupSnapshot")
        check_ids(request)
        require(request.name, "name")
        check_string(request.name, "name")
        require(request.source_volume_ids, "source_volume_ids")
        for vid in request.source_volume_ids:
            require(vid, "source_volume_ids[]")
        with self._inflight.hold(f"group:{request.name}"):
            group = self._backend.create_group_snapshot(
                request.name, list(request.source_volume_ids), strip_k8s_keys(request.parameters)
            )
        return csi_pb2.CreateVolumeGroupSnapshotResponse(group_snapshot=group_message(group))

    def DeleteVolumeGroupSnapshot(
        self, request: csi_pb2.DeleteVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeGroupSnapshotResponse:
        """Deletes the group and its member snapshots. Unknown -> OK."""
        self._caps.require_group("DeleteVolumeGroupSnapshot")
        check_ids(request)
        require(request.group_snapshot_id, "group_snapshot_id")
        with self._inflight.hold(f"groupid:{request.group_snapshot_id}"):
            try:
                group = self._backend.get_group_snapshot(request.group_snapshot_id)
                _check_members(group, request.snapshot_ids)
                self._backend.delete_group_snapshot(request.group_snapshot_id)
            except NotFoundError:
                pass
        return csi_pb2.DeleteVolumeGroupSnapshotResponse()

    def GetVolumeGroupSnapshot(
        self, request: csi_pb2.GetVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetVolumeGroupSnapshotResponse:
        """Unknown -> NOT_FOUND."""
        self._caps.require_group("GetVolumeGroupSnapshot")
        check_ids(request)
        require(request.group_snapshot_id, "group_snapshot_id")
        group = self._backend.get_group_snapshot(request.group_snapshot_id)
        _check_members(group, request.snapshot_ids)
        return csi_pb2.GetVolumeGroupSnapshotResponse(group_snapshot=group_message(group))
