"""The CSI v1.13 health RPCs, as mixins of the Controller and Node services (which own the state).

ControllerGetVolumeHealth / ControllerListVolumeHealth ask the backend (the storage system's view);
NodeGetVolumeHealth asks csi.nodehealth (devices, mounts and filesystems on this host);
NodeGetStorageHealth asks the backend about the storage this node reaches. Handlers only raise;
csi.errors turns exceptions into status codes.
"""

from __future__ import annotations

import grpc

from csi import paths, replies
from csi._proto import csi_pb2
from csi.backends.base import Backend
from csi.capabilities import CRPC, NRPC, Capabilities
from csi.failures import InvalidParameterError
from csi.health import VolumeHealth
from csi.nodehealth import NodeHealth
from csi.validation import require_id


class ControllerHealthRPCs:
    _backend: Backend
    _caps: Capabilities

    def ControllerGetVolumeHealth(
        self, request: csi_pb2.ControllerGetVolumeHealthRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetVolumeHealthResponse:
        """Known volume -> its issues (none: an empty list); unknown -> NOT_FOUND."""
        self._caps.require_controller(CRPC.GET_VOLUME_HEALTH, "ControllerGetVolumeHealth")
        require_id(request.volume_id, "volume_id")
        issues = self._backend.volume_health(request.volume_id)
        return csi_pb2.ControllerGetVolumeHealthResponse(
            volume_health=replies.volume_health(VolumeHealth(request.volume_id, issues))
        )

    def ControllerListVolumeHealth(
        self, request: csi_pb2.ControllerListVolumeHealthRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerListVolumeHealthResponse:
        """Volumes with an issue only (the spec: SHOULD omit healthy ones); foreign token -> ABORTED."""
        self._caps.require_controller(CRPC.LIST_VOLUME_HEALTH, "ControllerListVolumeHealth")
        if request.max_entries < 0:
            raise InvalidParameterError("max_entries must not be negative")
        page = self._backend.list_volume_health(request.max_entries, request.starting_token)
        return csi_pb2.ControllerListVolumeHealthResponse(
            entries=[replies.volume_health(h) for h in page.items], next_token=page.next_token
        )


class NodeHealthRPCs:
    _backend: Backend
    _caps: Capabilities
    _roots: tuple[str, ...]
    health: NodeHealth

    def NodeGetVolumeHealth(
        self, request: csi_pb2.NodeGetVolumeHealthRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetVolumeHealthResponse:
        """The volume's issues on this node; not on this node at all -> NOT_FOUND."""
        self._caps.require_node(NRPC.GET_VOLUME_HEALTH, "NodeGetVolumeHealth")
        require_id(request.volume_id, "volume_id")
        staging, publish = request.staging_target_path, request.volume_publish_path
        issues = self.health.volume(
            request.volume_id,
            staging=paths.check_path(staging, "staging_target_path", self._roots) if staging else "",
            publish=paths.check_path(publish, "volume_publish_path", self._roots) if publish else "",
        )
        return csi_pb2.NodeGetVolumeHealthResponse(
            volume_health=replies.volume_health(VolumeHealth(request.volume_id, issues))
        )

    def NodeGetStorageHealth(
        self, request: csi_pb2.NodeGetStorageHealthRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetStorageHealthResponse:
        self._caps.require_node(NRPC.GET_STORAGE_HEALTH, "NodeGetStorageHealth")
        return replies.storage_health(self._backend.storage_health())
