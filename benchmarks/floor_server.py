"""A grpcio server with empty handlers, no interceptors and no backend: the floor for Ballast's figures.

It serves the RPC shapes the benchmarks measure: Probe (answers an empty ProbeResponse), and
CreateVolume / DeleteVolume, which answer what the driver answers for the benchmarks' requests (a Volume
with a 35-character id, the capacity asked for and one topology segment; an empty DeleteVolumeResponse)
without doing anything. The benchmarks run it with the same interpreter and thread-pool size as the
driver and measure it with the same clients in the same run, so the difference between the two is what
Ballast itself costs per call.

Run: python benchmarks/floor_server.py /path/floor.sock [workers] (csi must be importable).
"""

from __future__ import annotations

import os
import signal
import sys
from concurrent import futures
from typing import Any

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc

# The local backend's reply to the benchmarks' CreateVolume: the same fields, so the same bytes to build
# and send.
TOPOLOGY = {"topology.local.csi.ballast.dev/zone": "local"}


class _EmptyIdentity(csi_pb2_grpc.IdentityServicer):
    def Probe(self, request: csi_pb2.ProbeRequest, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse()


class _EmptyController(csi_pb2_grpc.ControllerServicer):
    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: Any
    ) -> csi_pb2.CreateVolumeResponse:
        volume = csi_pb2.Volume(
            volume_id="lv-" + os.urandom(16).hex(), capacity_bytes=request.capacity_range.required_bytes
        )
        volume.accessible_topology.append(csi_pb2.Topology(segments=TOPOLOGY))
        return csi_pb2.CreateVolumeResponse(volume=volume)

    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: Any
    ) -> csi_pb2.DeleteVolumeResponse:
        return csi_pb2.DeleteVolumeResponse()


def main() -> None:
    path, workers = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    csi_pb2_grpc.add_IdentityServicer_to_server(_EmptyIdentity(), server)
    csi_pb2_grpc.add_ControllerServicer_to_server(_EmptyController(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
