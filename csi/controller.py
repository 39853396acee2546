"""Controller service: provisioning, attachment, snapshots, expansion, listing (CSI Controller)."""

from __future__ import annotations

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend
from csi.capabilities import Capabilities
from csi.config import Config
from csi.inflight import InFlight


class ControllerService(csi_pb2_grpc.ControllerServicer):
    def __init__(self, backend: Backend, config: Config, caps: Capabilities, inflight: InFlight) -> None:
        self._backend = backend
        self._config = config
        self._caps = caps
        self._inflight = inflight

    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        Cap = csi_pb2.ControllerServiceCapability
        return csi_pb2.ControllerGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.controller)]
        )
