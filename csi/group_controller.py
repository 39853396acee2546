"""GroupController service: crash-consistent volume group snapshots (CSI GroupController)."""

from __future__ import annotations

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend
from csi.capabilities import Capabilities
from csi.config import Config
from csi.inflight import InFlight


class GroupControllerService(csi_pb2_grpc.GroupControllerServicer):
    def __init__(self, backend: Backend, config: Config, caps: Capabilities, inflight: InFlight) -> None:
        self._backend = backend
        self._config = config
        self._caps = caps
        self._inflight = inflight

    def GroupControllerGetCapabilities(
        self, request: csi_pb2.GroupControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GroupControllerGetCapabilitiesResponse:
        Cap = csi_pb2.GroupControllerServiceCapability
        return csi_pb2.GroupControllerGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.group_controller)]
        )
