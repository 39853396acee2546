"""A grpcio server with an empty Probe, no interceptors and no backend: the floor for Ballast's Probe figures.

bench_startup.py runs it with the same interpreter and thread-pool size as the driver and measures it with
the same clients, so the difference between the two is what Ballast itself costs per call.

Run: python benchmarks/floor_server.py /path/floor.sock [workers] (csi must be importable).
"""

from __future__ import annotations

import signal
import sys
from concurrent import futures
from typing import Any

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc


class _EmptyIdentity(csi_pb2_grpc.IdentityServicer):
    def Probe(self, request: csi_pb2.ProbeRequest, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse()


def main() -> None:
    path, workers = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 16
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    csi_pb2_grpc.add_IdentityServicer_to_server(_EmptyIdentity(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
