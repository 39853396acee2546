"""The one gRPC client helper for tests: stubs on a real channel and one assertion for status codes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from csi._proto import csi_pb2_grpc


@dataclass
class CsiClient:
    channel: grpc.Channel
    identity: csi_pb2_grpc.IdentityStub
    controller: csi_pb2_grpc.ControllerStub
    node: csi_pb2_grpc.NodeStub
    group: csi_pb2_grpc.GroupControllerStub
    snapshot_metadata: csi_pb2_grpc.SnapshotMetadataStub

    def close(self) -> None:
        self.channel.close()


def connect(endpoint: str, timeout: float = 10.0) -> CsiClient:
    """A client for `unix:///path` (or a bare socket path), after the channel is ready."""
    target = endpoint if "://" in endpoint else f"unix://{endpoint}"
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return CsiClient(
        channel=channel,
        identity=csi_pb2_grpc.IdentityStub(channel),
        controller=csi_pb2_grpc.ControllerStub(channel),
        node=csi_pb2_grpc.NodeStub(channel),
        group=csi_pb2_grpc.GroupControllerStub(channel),
        snapshot_metadata=csi_pb2_grpc.SnapshotMetadataStub(channel),
    )


@contextmanager
def client(endpoint: str) -> Iterator[CsiClient]:
    c = connect(endpoint)
    try:
        yield c
    finally:
        c.close()


def assert_code(call: Callable[..., Any], request: Any, code: grpc.StatusCode, *, contains: str = "") -> str:
    """Call an RPC that must fail with `code`; returns the status message (checked for `contains`)."""
    try:
        call(request, timeout=60)
    except grpc.RpcError as err:
        got = err.code()
        message = err.details() or ""
        assert got == code, f"expected {code.name}, got {got.name}: {message}"
        assert "Traceback" not in message, message
        assert contains.lower() in message.lower(), f"{contains!r} not in {message!r}"
        return str(message)
    raise AssertionError(f"expected {code.name}, but the call succeeded")
