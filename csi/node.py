"""Node service: stage, publish, stats and expansion of volumes on this host (CSI Node)."""

from __future__ import annotations

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend
from csi.capabilities import Capabilities
from csi.config import Config
from csi.inflight import InFlight


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, backend: Backend, config: Config, caps: Capabilities, inflight: InFlight) -> None:
        self._backend = backend
        self._config = config
        self._caps = caps
        self._inflight = inflight

    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        Cap = csi_pb2.NodeServiceCapability
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[Cap(rpc=Cap.RPC(type=t)) for t in sorted(self._caps.node)]
        )
