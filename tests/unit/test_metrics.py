"""The metrics endpoint counts RPCs by method and code, times backend operations, and serves /healthz."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from csi._proto import csi_pb2
from csi.config import parse_args
from csi.failures import FailedPreconditionError
from csi.inflight import InFlight
from csi.metrics import Metrics
from csi.server import Driver
from tests.csiclient import CsiClient, assert_code, connect
from tests.fakes import FAKE_NODE, FakeBackend

AccessMode = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AccessMode(mode=AccessMode.SINGLE_NODE_WRITER)
)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Driver, FakeBackend, CsiClient]]:
    config, _ = parse_args(
        [
            "--endpoint",
            f"unix://{tmp_path}/csi.sock",
            "--node-id",
            FAKE_NODE,
            "--metrics-address",
            "127.0.0.1:0",
        ]
    )
    backend = FakeBackend()
    driver = Driver(config, backend=backend)
    driver.start()
    client = connect(f"{tmp_path}/csi.sock")
    yield driver, backend, client
    client.close()
    driver.stop(grace=1)


def _get(driver: Driver, path: str) -> tuple[int, str]:
    assert driver.metrics is not None
    url = f"http://127.0.0.1:{driver.metrics.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_rpc_and_backend_metrics(running: tuple[Driver, FakeBackend, CsiClient]) -> None:
    driver, _, client = running
    client.identity.Probe(csi_pb2.ProbeRequest())
    client.identity.Probe(csi_pb2.ProbeRequest())
    client.controller.CreateVolume(csi_pb2.CreateVolumeRequest(name="m1", volume_capabilities=[CAP]))
    assert_code(
        client.controller.CreateVolume, csi_pb2.CreateVolumeRequest(), grpc.StatusCode.INVALID_ARGUMENT
    )
    status, text = _get(driver, "/metrics")
    assert status == 200
    samples = _samples(text)
    assert samples[("ballast_rpc_total", (("code", "OK"), ("method", "Probe")))] == 2
    assert samples[("ballast_rpc_total", (("code", "OK"), ("method", "CreateVolume")))] == 1
    assert samples[("ballast_rpc_total", (("code", "INVALID_ARGUMENT"), ("method", "CreateVolume")))] == 1
    assert samples[("ballast_rpc_duration_seconds_count", (("code", "OK"), ("method", "Probe")))] == 2
    assert (
        samples[("ballast_backend_operation_duration_seconds_count", (("operation", "create_volume"),))] == 1
    )
    assert ("ballast_inflight_operations", ()) in samples
    assert ("ballast_node_staged_volumes", ()) in samples


def test_backend_errors_counted(running: tuple[Driver, FakeBackend, CsiClient]) -> None:
    driver, backend, client = running
    from csi.failures import TransientError

    backend.fail["create_volume"] = TransientError("throttled")
    assert_code(
        client.controller.CreateVolume,
        csi_pb2.CreateVolumeRequest(name="m2", volume_capabilities=[CAP]),
        grpc.StatusCode.UNAVAILABLE,
    )
    samples = _samples(_get(driver, "/metrics")[1])
    key = (
        "ballast_backend_operation_errors_total",
        (("error", "TransientError"), ("operation", "create_volume")),
    )
    assert samples[key] == 1


def test_healthz_follows_probe(running: tuple[Driver, FakeBackend, CsiClient]) -> None:
    driver, backend, _ = running
    assert _get(driver, "/healthz") == (200, "ok\n")
    backend.ready = False
    assert _get(driver, "/healthz")[0] == 503
    assert _get(driver, "/nope")[0] == 404


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def _driver(tmp_path: Path, address: str) -> Driver:
    config, _ = parse_args(
        ["--endpoint", f"unix://{tmp_path}/csi.sock", "--node-id", FAKE_NODE, "--metrics-address", address]
    )
    return Driver(config, backend=FakeBackend())


@pytest.mark.parametrize(
    ("address", "host"),
    [
        pytest.param("127.0.0.1:0", "127.0.0.1", id="ipv4"),
        pytest.param("[::1]:0", "[::1]", id="ipv6-loopback"),
        pytest.param("[::]:0", "[::1]", id="ipv6-any"),
    ],
)
def test_metrics_serve_on_ipv4_and_ipv6_addresses(tmp_path: Path, address: str, host: str) -> None:
    if "::" in address and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    driver = _driver(tmp_path, address)
    driver.start()
    try:
        assert driver.metrics is not None
        with urllib.request.urlopen(f"http://{host}:{driver.metrics.port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        driver.stop(grace=1)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_metrics_address_in_use_fails_start_naming_the_flag_and_binds_nothing(
    tmp_path: Path, taken_port: int
) -> None:
    driver = _driver(tmp_path, f"127.0.0.1:{taken_port}")
    with pytest.raises(FailedPreconditionError) as raised:
        driver.start()
    assert str(raised.value) == f"--metrics-address 127.0.0.1:{taken_port}: Address already in use"
    assert not (tmp_path / "csi.sock").exists(), "no gRPC socket is left behind"
    driver.stop(grace=0)


def test_a_failed_grpc_bind_stops_the_metrics_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _driver(tmp_path, "127.0.0.1:0")

    def refuse(address: str) -> int:
        raise RuntimeError(f"Failed to bind to address {address}")

    monkeypatch.setattr(driver.server, "add_insecure_port", refuse)
    with pytest.raises(RuntimeError):
        driver.start()
    assert driver.metrics is not None and driver.metrics._server is None, "the metrics server is stopped"
    driver.stop(grace=0)


class _ProbeFails(FakeBackend):
    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    def probe(self) -> bool:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "line", "stack"),
    [
        pytest.param(
            FailedPreconditionError("data dir /d/volumes is not writable"),
            "health probe failed: data dir /d/volumes is not writable",
            False,
            id="driver-error-one-line",
        ),
        pytest.param(KeyError("bug"), "health probe failed unexpectedly", True, id="bug-with-its-stack"),
    ],
)
def test_a_failing_healthz_logs_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, exc: Exception, line: str, stack: bool
) -> None:
    config, _ = parse_args(["--endpoint", f"unix://{tmp_path}/csi.sock", "--metrics-address", "127.0.0.1:0"])
    metrics = Metrics(config, _ProbeFails(exc), InFlight())
    with caplog.at_level(logging.WARNING, logger="ballast.metrics"):
        assert metrics.healthy() is False
    assert [r.getMessage() for r in caplog.records] == [line]
    assert (caplog.records[0].exc_info is not None) == stack


@pytest.mark.parametrize(
    ("exc", "level"),
    [
        pytest.param(BrokenPipeError(32, "Broken pipe"), logging.DEBUG, id="client-left-debug"),
        pytest.param(ValueError("bug"), logging.WARNING, id="bug-warning-with-stack"),
    ],
)
def test_a_failed_metrics_request_is_logged_not_printed(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    exc: Exception,
    level: int,
) -> None:
    driver = _driver(tmp_path, "127.0.0.1:0")
    driver.start()
    try:
        assert driver.metrics is not None and driver.metrics._server is not None
        with caplog.at_level(logging.DEBUG, logger="ballast.metrics"):
            try:
                raise exc
            except Exception:
                with socket.socket() as request:
                    driver.metrics._server.handle_error(request, ("127.0.0.1", 1))
    finally:
        driver.stop(grace=0)
    assert [r.levelno for r in caplog.records if r.name == "ballast.metrics"][-1] == level
    assert "Traceback" not in capsys.readouterr().err


def _backend_errors(driver: Driver) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        key: value
        for key, value in _samples(_get(driver, "/metrics")[1]).items()
        if key[0] == "ballast_backend_operation_errors_total"
    }


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param(
            lambda c: c.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="lv-gone")),
            None,
            id="idempotent-delete-volume",
        ),
        pytest.param(
            lambda c: c.controller.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id="snap-gone")),
            None,
            id="idempotent-delete-snapshot",
        ),
        pytest.param(
            lambda c: c.controller.ControllerUnpublishVolume(
                csi_pb2.ControllerUnpublishVolumeRequest(volume_id="lv-gone", node_id=FAKE_NODE)
            ),
            None,
            id="idempotent-detach",
        ),
        pytest.param(
            lambda c: c.controller.ControllerUnpublishVolume(
                csi_pb2.ControllerUnpublishVolumeRequest(volume_id="lv-gone")
            ),
            None,
            id="idempotent-detach-from-all-nodes",
        ),
        pytest.param(
            lambda c: c.controller.ControllerPublishVolume(
                csi_pb2.ControllerPublishVolumeRequest(
                    volume_id="lv-gone", node_id=FAKE_NODE, volume_capability=CAP
                )
            ),
            grpc.StatusCode.NOT_FOUND,
            id="publish-of-unknown-is-not-found-but-no-backend-error",
        ),
    ],
)
def test_not_found_is_an_answer_not_a_backend_error(
    running: tuple[Driver, FakeBackend, CsiClient], call: Any, code: grpc.StatusCode | None
) -> None:
    driver, _, client = running
    if code is None:
        call(client)
    else:
        with pytest.raises(grpc.RpcError) as raised:
            call(client)
        assert raised.value.code() == code
    assert _backend_errors(driver) == {}
