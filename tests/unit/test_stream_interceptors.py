"""The error and logging interceptors on server-streaming calls: a failure before the first message or
in the middle of a stream reaches the client as the status the one code table names (never as a short,
apparently complete stream), and the log line of a stream has its code and message count but never a
secret."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from csi import errors, failures, logs
from csi._proto import csi_pb2, csi_pb2_grpc
from tests.unit.test_errors import CASES

SECRET = "hunter2-stream-secret"


class Streaming(csi_pb2_grpc.SnapshotMetadataServicer):
    """Sends `sent` messages, then raises `exc` (None: ends normally); `early` raises before the stream."""

    sent = 2
    exc: BaseException | None = None
    early: BaseException | None = None

    def GetMetadataDelta(
        self, request: csi_pb2.GetMetadataDeltaRequest, context: grpc.ServicerContext
    ) -> Iterator[csi_pb2.GetMetadataDeltaResponse]:
        if self.early is not None:
            raise self.early
        return self._stream()

    def _stream(self) -> Iterator[csi_pb2.GetMetadataDeltaResponse]:
        for i in range(self.sent):
            block = csi_pb2.BlockMetadata(byte_offset=i * 4096, size_bytes=4096)
            yield csi_pb2.GetMetadataDeltaResponse(volume_capacity_bytes=1 << 20, block_metadata=[block])
        if self.exc is not None:
            raise self.exc


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO]]:
    stream = io.StringIO()
    logs.setup("json", "debug", stream)
    servicer = Streaming()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[logs.LoggingInterceptor(), errors.ErrorInterceptor()],
    )
    csi_pb2_grpc.add_SnapshotMetadataServicer_to_server(servicer, server)
    sock = tmp_path / "s.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{sock}")
    yield servicer, csi_pb2_grpc.SnapshotMetadataStub(channel), stream
    channel.close()
    server.stop(None)
    logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "ballast"]


REQUEST = csi_pb2.GetMetadataDeltaRequest(
    base_snapshot_id="s-1", target_snapshot_id="s-2", secrets={"k": SECRET}
)


def _drain(stub: csi_pb2_grpc.SnapshotMetadataStub) -> tuple[int, grpc.RpcError | None]:
    received = 0
    try:
        for _ in stub.GetMetadataDelta(REQUEST, timeout=30):
            received += 1
    except grpc.RpcError as err:
        return received, err
    return received, None


def _rpc_lines(stream: io.StringIO) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line.get("logger") == "ballast.rpc"]


@pytest.mark.parametrize(("exc", "code"), CASES)
def test_a_failure_mid_stream_ends_it_with_the_tables_code(
    served: tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO],
    exc: failures.DriverError,
    code: grpc.StatusCode,
) -> None:
    servicer, stub, _ = served
    servicer.exc = exc
    received, err = _drain(stub)
    assert received == servicer.sent, "the messages before the failure arrive"
    assert err is not None, "a failed stream must not look complete"
    assert err.code() == code
    assert err.details() == str(exc)


@pytest.mark.parametrize(("exc", "code"), CASES[:3])
def test_a_failure_before_the_first_message_is_a_plain_status(
    served: tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO],
    exc: failures.DriverError,
    code: grpc.StatusCode,
) -> None:
    servicer, stub, _ = served
    servicer.early = exc
    received, err = _drain(stub)
    assert received == 0 and err is not None and err.code() == code


def test_an_unexpected_exception_mid_stream_is_internal_without_a_traceback(
    served: tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO],
) -> None:
    servicer, stub, stream = served
    servicer.exc = KeyError("internal detail")
    received, err = _drain(stub)
    assert received == servicer.sent and err is not None
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "reference" in (err.details() or "") and "Traceback" not in (err.details() or "")
    assert "internal detail" not in (err.details() or "")
    assert "internal detail" in stream.getvalue(), "the bug is logged once, with its stack"


def test_a_stream_is_logged_once_with_its_code_and_messages_and_no_secret(
    served: tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO],
) -> None:
    servicer, stub, stream = served
    servicer.sent = 3
    assert _drain(stub) == (3, None)
    servicer.exc = failures.NotFoundError("snapshot s-2 not found")
    _drain(stub)
    lines = _rpc_lines(stream)
    assert [(line["code"], line["messages"], line.get("error")) for line in lines] == [
        ("OK", 3, None),
        ("NOT_FOUND", 3, "snapshot s-2 not found"),
    ]
    assert all(line["base_snapshot_id"] == "s-1" and line["target_snapshot_id"] == "s-2" for line in lines)
    assert SECRET not in stream.getvalue()


@pytest.mark.parametrize(
    ("deadline", "code"),
    [
        pytest.param(False, "CANCELLED", id="cancelled"),
        pytest.param(True, "DEADLINE_EXCEEDED", id="deadline"),
    ],
)
def test_a_stream_the_client_left_is_logged_with_why(
    served: tuple[Streaming, csi_pb2_grpc.SnapshotMetadataStub, io.StringIO], deadline: bool, code: str
) -> None:
    servicer, stub, stream = served
    servicer.sent = 100000
    call = stub.GetMetadataDelta(REQUEST, timeout=0.5 if deadline else 30)
    next(call)
    if not deadline:
        call.cancel()
    for _ in range(300):  # the server notices on its next write
        if _rpc_lines(stream):
            break
        time.sleep(0.02)
    assert [line["code"] for line in _rpc_lines(stream)] == [code]
