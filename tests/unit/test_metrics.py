"""The metrics endpoint counts RPCs by method and code, times backend operations, and serves /healthz."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from csi._proto import csi_pb2
from csi.config import parse_args
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
