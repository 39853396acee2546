"""Identity service: name and version, capabilities, readiness."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend
from csi.capabilities import Capabilities
from csi.failures import DriverError, FailedPreconditionError


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def __init__(
        self, driver_name: str, version: Callable[[], str], backend: Backend, caps: Capabilities
    ) -> None:
        self._name = driver_name
        self._version = version  # package metadata is read on the first GetPluginInfo, not at start-up
        self._backend = backend
        self._caps = csi_pb2.GetPluginCapabilitiesResponse(capabilities=caps.plugin())

    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self._name, vendor_version=self._version())

    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        return self._caps

    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        """Ready -> ready=true; still starting -> ready=false; broken -> FAILED_PRECONDITION (spec: Probe)."""
        try:
            ready = self._backend.probe()
        except DriverError as exc:
            raise FailedPreconditionError(f"backend not healthy: {exc}") from exc
        resp = csi_pb2.ProbeResponse()
        resp.ready.value = ready
        return resp
