"""What reaches the log: the driver's own records at --log-level, other libraries' only from WARNING up
(botocore's debug output carries credentials), and request fields that can neither forge a line nor
grow it without bound."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from csi import errors, failures, logs
from csi._proto import csi_pb2, csi_pb2_grpc

pytestmark = pytest.mark.usefixtures("restore_root_logging")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    yield out
    logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "ballast"]


@pytest.mark.parametrize(
    ("level", "logger", "record_level", "shown"),
    [
        pytest.param("debug", "ballast.rpc", logging.DEBUG, True, id="own-debug-at-debug"),
        pytest.param("debug", "botocore.endpoint", logging.DEBUG, False, id="botocore-debug-at-debug"),
        pytest.param("debug", "urllib3.connectionpool", logging.INFO, False, id="urllib3-info-at-debug"),
        pytest.param("debug", "botocore.credentials", logging.WARNING, True, id="library-warning-at-debug"),
        pytest.param("info", "ballast.local", logging.DEBUG, False, id="own-debug-at-info"),
        pytest.param("error", "botocore.retries", logging.WARNING, False, id="library-warning-at-error"),
    ],
)
def test_level_applies_to_the_drivers_loggers_only(
    stream: io.StringIO, level: str, logger: str, record_level: int, shown: bool
) -> None:
    logs.setup("text", level, stream)
    logging.getLogger(logger).log(record_level, "SecretAccessKey=AKIA-EXAMPLE")
    assert ("AKIA-EXAMPLE" in stream.getvalue()) == shown


def _rpc_line(log_format: str, stream: io.StringIO, request: csi_pb2.CreateVolumeRequest) -> str:
    logs.setup(log_format, "info", stream)
    log = logging.getLogger("ballast.rpc")
    log.info("CreateVolume OK", extra={"fields": {"method": "CreateVolume", **logs.summary(request)}})
    return stream.getvalue()


FORGED = "pvc-1\n2026-12-02 00:00:00 ERROR ballast.server: FORGED"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_name_with_a_newline_stays_on_its_line(stream: io.StringIO, log_format: str) -> None:
    out = _rpc_line(log_format, stream, csi_pb2.CreateVolumeRequest(name=FORGED))
    assert out.count("\n") == 1 and "FORGED" in out
    if log_format == "json":
        assert json.loads(out)["name"] == FORGED


def test_a_message_with_a_newline_stays_on_its_line(stream: io.StringIO) -> None:
    logs.setup("text", "info", stream)
    logging.getLogger("ballast.server").warning("volume %s is odd", FORGED)
    assert stream.getvalue().count("\n") == 1


def test_text_fields_are_quoted_when_they_hold_spaces(stream: io.StringIO) -> None:
    out = _rpc_line("text", stream, csi_pb2.CreateVolumeRequest(name="a b", volume_content_source=None))
    assert 'name="a b"' in out


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_huge_field_is_cut(stream: io.StringIO, log_format: str) -> None:
    out = _rpc_line(log_format, stream, csi_pb2.CreateVolumeRequest(name="n" * 100_000))
    assert len(out) < 2 * logs.FIELD_LIMIT + 200
    assert f"({100_000 - logs.FIELD_LIMIT} more characters)" in out


class _Failing(csi_pb2_grpc.IdentityServicer):
    """Probe raises `exc` (None: answers ready)."""

    exc: Exception | None = None

    def Probe(self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext) -> csi_pb2.ProbeResponse:
        if self.exc is not None:
            raise self.exc
        return csi_pb2.ProbeResponse()


def _probe_line(tmp_path: Path, stream: io.StringIO, log_format: str, exc: Exception | None) -> str:
    """The log line of one Probe through the driver's interceptors, Probe raising `exc`."""
    logs.setup(log_format, "debug", stream)
    servicer = _Failing()
    servicer.exc = exc
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=1),
        interceptors=[logs.LoggingInterceptor(), errors.ErrorInterceptor()],
    )
    csi_pb2_grpc.add_IdentityServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{tmp_path}/p.sock")
    server.start()
    try:
        with (
            grpc.insecure_channel(f"unix://{tmp_path}/p.sock") as channel,
            contextlib.suppress(grpc.RpcError),
        ):
            csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=10)
    finally:
        server.stop(None).wait()
    return next(line for line in stream.getvalue().splitlines() if "ballast.rpc" in line)


LONG = "volume lv-1 cannot grow: " + "x" * 5000


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        pytest.param(None, None, id="ok-has-no-error"),
        pytest.param(
            failures.NotFoundError("volume lv-1 does not exist"), "volume lv-1 does not exist", id="not-found"
        ),
        pytest.param(
            failures.OutOfRangeError(LONG),
            f"{LONG[: logs.FIELD_LIMIT]}...(",
            id="long-message-cut-at-the-field-limit",
        ),
        pytest.param(
            KeyError("internal detail"), "internal error (reference ", id="unexpected-has-only-the-reference"
        ),
    ],
)
def test_a_failed_call_logs_the_message_the_client_got(
    tmp_path: Path, stream: io.StringIO, exc: Exception | None, error: str | None
) -> None:
    line = json.loads(_probe_line(tmp_path, stream, "json", exc))
    if error is None:
        assert line["code"] == "OK" and "error" not in line
    else:
        assert line["code"] != "OK" and line["error"].startswith(error)
        assert len(line["error"]) < logs.FIELD_LIMIT + 40, "cut like every logged field"
        assert "internal detail" not in line["error"]


def test_a_failed_calls_message_stays_on_its_line(tmp_path: Path, stream: io.StringIO) -> None:
    line = _probe_line(tmp_path, stream, "text", failures.InvalidParameterError(f"bad name {FORGED}"))
    assert stream.getvalue().count("\n") == 1
    assert 'error="bad name pvc-1\\n2026-12-02' in line
