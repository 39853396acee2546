"""Volume calls that hold every worker leave the health calls a thread of their own, and a call beyond
the backlog is UNAVAILABLE at once: through the real server's composition, with a backend whose creates
block until the test lets them go."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import admission
from csi._proto import csi_pb2
from csi.backends.base import Disk, DiskOptions
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, connect
from tests.fakes import FAKE_NODE, FakeBackend

WORKERS = 2
ADMITTED = WORKERS * (1 + admission.BACKLOG_PER_WORKER)
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)


class Stuck(FakeBackend):
    """Creates wait for `go`; `started` counts the ones running."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        self.started.release()
        assert self.go.wait(60)
        return super().create_volume(name, options)


@pytest.fixture
def stuck(tmp_path: Path) -> Iterator[tuple[Stuck, CsiClient]]:
    config, _ = parse_args(
        ["--endpoint", f"unix://{tmp_path}/a.sock", "--node-id", FAKE_NODE, "--workers", str(WORKERS)]
    )
    backend = Stuck()
    driver = Driver(config, backend=backend)
    driver.start()
    client = connect(f"{tmp_path}/a.sock")
    yield backend, client
    backend.go.set()
    client.close()
    driver.stop(grace=1)


def _create(client: CsiClient, i: int) -> Any:
    request = csi_pb2.CreateVolumeRequest(name=f"v{i}", volume_capabilities=[MOUNT])
    return client.controller.CreateVolume.future(request, timeout=60)


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        pytest.param("Probe", csi_pb2.ProbeRequest(), id="probe"),
        pytest.param("GetPluginInfo", csi_pb2.GetPluginInfoRequest(), id="plugin-info"),
        pytest.param("NodeGetInfo", csi_pb2.NodeGetInfoRequest(), id="node-info"),
        pytest.param(
            "ControllerGetCapabilities", csi_pb2.ControllerGetCapabilitiesRequest(), id="controller-caps"
        ),
    ],
)
def test_health_calls_are_answered_while_volume_calls_hold_every_worker(
    stuck: tuple[Stuck, CsiClient], method: str, request_: Any
) -> None:
    backend, client = stuck
    calls, refused, finished = _fill_the_backlog(backend, client)
    stub = client.identity if method in ("Probe", "GetPluginInfo") else client.controller
    if method == "NodeGetInfo":
        stub = client.node
    getattr(stub, method)(request_, timeout=10)  # DEADLINE_EXCEEDED here if it queued behind them
    assert finished.empty(), "the admitted creates still wait"
    assert not backend.started.acquire(timeout=0), f"no more than {WORKERS} creates ran at once"
    backend.go.set()
    waited = [c for c in calls if c is not refused]
    assert all(c.result(timeout=30).volume.volume_id for c in waited), "every admitted call completes"


def _fill_the_backlog(backend: Stuck, client: CsiClient) -> tuple[list[Any], Any, queue.Queue[Any]]:
    """Creates holding every worker and every place in the backlog, and the one more refused busy;
    `finished` gets each call as it completes."""
    finished: queue.Queue[Any] = queue.Queue()
    calls = [_create(client, i) for i in range(ADMITTED + 1)]
    for call in calls:
        call.add_done_callback(finished.put)
    for _ in range(WORKERS):
        assert backend.started.acquire(timeout=30), "the running creates started"
    refused = finished.get(timeout=30)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
    assert "busy" in refused.details()
    return calls, refused, finished


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        pytest.param(
            "GetMetadataDelta",
            csi_pb2.GetMetadataDeltaRequest(base_snapshot_id="s-1", target_snapshot_id="s-2"),
            id="metadata-delta",
        ),
        pytest.param(
            "GetMetadataAllocated",
            csi_pb2.GetMetadataAllocatedRequest(snapshot_id="s-1"),
            id="metadata-allocated",
        ),
    ],
)
def test_a_snapshot_metadata_stream_beyond_the_backlog_is_unavailable(
    stuck: tuple[Stuck, CsiClient], method: str, request_: Any
) -> None:
    """A metadata scan holds its thread as long as a volume call does: streams count against
    --workers too, or a burst of them would take every thread and starve Probe."""
    backend, client = stuck
    calls, refused, _ = _fill_the_backlog(backend, client)
    with pytest.raises(grpc.RpcError) as raised:
        list(getattr(client.snapshot_metadata, method)(request_, timeout=10))
    details = raised.value.details() or ""
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "busy" in details, details
    backend.go.set()
    assert all(c.result(timeout=30).volume.volume_id for c in calls if c is not refused)


def _hold_every_worker(backend: Stuck, client: CsiClient) -> list[Any]:
    running = [_create(client, i) for i in range(WORKERS)]
    for _ in range(WORKERS):
        assert backend.started.acquire(timeout=30), "the running creates started"
    return running


def test_a_call_without_a_deadline_waits_for_a_worker(stuck: tuple[Stuck, CsiClient]) -> None:
    """grpcio reports a call without a deadline as having ~9e18 s left, which no lock accepts as a
    timeout: such a call waits its turn, as any other, instead of failing INTERNAL."""
    backend, client = stuck
    running = _hold_every_worker(backend, client)
    request = csi_pb2.CreateVolumeRequest(name="patient", volume_capabilities=[MOUNT])
    patient = client.controller.CreateVolume.future(request)  # no timeout
    time.sleep(0.5)
    assert not patient.done(), "it waits for a worker"
    backend.go.set()
    assert patient.result(timeout=30).volume.volume_id
    assert all(c.result(timeout=30).volume.volume_id for c in running)


def test_a_call_cancelled_while_it_waits_is_not_run(stuck: tuple[Stuck, CsiClient]) -> None:
    backend, client = stuck
    running = _hold_every_worker(backend, client)
    request = csi_pb2.CreateVolumeRequest(name="ghost", volume_capabilities=[MOUNT])
    ghost = client.controller.CreateVolume.future(request, timeout=60)
    time.sleep(0.3)
    assert ghost.cancel()
    time.sleep(0.3)  # the server sees the cancellation
    backend.go.set()
    assert all(c.result(timeout=30).volume.volume_id for c in running)
    assert not backend.started.acquire(timeout=2), "the cancelled create ran once a worker was free"
    assert "ghost" not in {d.name for d in backend.volumes.values()}
