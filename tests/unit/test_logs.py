"""What reaches the log: the driver's own records at --log-level, other libraries' only from WARNING up
(botocore's debug output carries credentials), and request fields that can neither forge a line nor
grow it without bound."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from csi import logs
from csi._proto import csi_pb2

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
