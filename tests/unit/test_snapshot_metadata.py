"""The SnapshotMetadata service over a real gRPC socket with the FakeBackend: both block types, batching
by max_results, resume, the spec's error codes, secrets handed to the backend, and the capability."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import extents, failures, logs
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import BlockMap, DiskOptions
from csi.config import parse_args
from csi.extents import Range
from csi.server import Driver
from csi.snapshot_metadata import MAX_PER_MESSAGE
from tests.fakes import FAKE_NODE, FakeBackend, all_capabilities

KiB = 1024
BLOCK = 4 * KiB
SIZE = 1024 * KiB
SECRETS = {"token": "very-secret-cbt-token"}
# Changed ranges the fake serves: the first and last blocks, a run of three, one alone.
DELTA = [Range(0, BLOCK), Range(10 * BLOCK, 3 * BLOCK), Range(100 * BLOCK, BLOCK), Range(SIZE - BLOCK, BLOCK)]


class Served:
    def __init__(self, driver: Driver, backend: FakeBackend, log: io.StringIO) -> None:
        self.driver, self.backend, self.log = driver, backend, log
        self.channel = grpc.insecure_channel(driver.config.server.endpoint)
        self.stub = csi_pb2_grpc.SnapshotMetadataStub(self.channel)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        vol = backend.create_volume("v", DiskOptions(size_bytes=SIZE))
        self.base = backend.create_snapshot("base", vol.id, {}).id
        self.target = backend.create_snapshot("target", vol.id, {}).id
        backend.block_deltas[(self.base, self.target)] = DELTA
        backend.block_ranges[self.target] = [Range(0, 64 * BLOCK)]

    def delta(self, **fields: Any) -> list[csi_pb2.GetMetadataDeltaResponse]:
        req = csi_pb2.GetMetadataDeltaRequest(
            **{"base_snapshot_id": self.base, "target_snapshot_id": self.target, **fields}
        )
        return list(self.stub.GetMetadataDelta(req, timeout=30))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def run(*flags: str, **caps: Any) -> Served:
        log = io.StringIO()
        logs.setup("text", "debug", log)
        sock = tmp_path / f"m{len(started)}.sock"
        config, _ = parse_args(["--endpoint", f"unix://{sock}", "--node-id", FAKE_NODE, *flags])
        backend = FakeBackend(all_capabilities(**caps))
        driver = Driver(config, backend=backend)
        driver.start()
        served = Served(driver, backend, log)
        started.append(served)
        return served

    yield run
    for s in started:
        s.channel.close()
        s.driver.stop(grace=1)
    logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "ballast"]


def _ranges(responses: list[Any]) -> list[Range]:
    return [Range(b.byte_offset, b.size_bytes) for r in responses for b in r.block_metadata]


def test_variable_length_sends_the_backends_ranges_in_batches(start: Callable[..., Served]) -> None:
    s = start()
    responses = s.delta(max_results=3)
    assert [len(r.block_metadata) for r in responses] == [3, 1]
    assert _ranges(responses) == DELTA
    assert {(r.block_metadata_type, r.volume_capacity_bytes) for r in responses} == {
        (csi_pb2.VARIABLE_LENGTH, SIZE)
    }
    assert s.backend.calls[-1] == ("snapshot_delta", (s.base, s.target, 0, BLOCK, {}))


def test_fixed_length_describes_the_same_bytes_in_equal_blocks(start: Callable[..., Served]) -> None:
    variable = start()
    fixed = start("--snapshot-metadata-block-type", "fixed")
    fixed_ranges = _ranges(fixed.delta(max_results=2))
    assert {r.length for r in fixed_ranges} == {BLOCK}
    assert [r.offset for r in fixed_ranges] == [
        0,
        10 * BLOCK,
        11 * BLOCK,
        12 * BLOCK,
        100 * BLOCK,
        SIZE - BLOCK,
    ]

    def covered(ranges: list[Range]) -> set[int]:
        return {o for r in ranges for o in range(r.offset, r.end, BLOCK)}

    assert covered(fixed_ranges) == covered(_ranges(variable.delta()))
    assert {r.block_metadata_type for r in fixed.delta()} == {csi_pb2.FIXED_LENGTH}


def test_the_block_size_flag_reaches_the_backend(start: Callable[..., Served]) -> None:
    s = start("--snapshot-metadata-block-size", "64Ki")
    s.delta()
    assert s.backend.calls[-1][1][3] == 64 * KiB


def test_a_resumed_stream_continues_where_the_first_stopped(start: Callable[..., Served]) -> None:
    s = start()
    first = _ranges(s.delta(max_results=2))
    stop = first[1].end  # the client received two ranges, then lost the stream
    assert _ranges(s.delta(starting_offset=stop)) == first[2:]


def test_nothing_changed_is_one_empty_message(start: Callable[..., Served]) -> None:
    s = start()
    s.backend.block_deltas[(s.base, s.target)] = []
    responses = s.delta()
    assert len(responses) == 1 and not responses[0].block_metadata
    assert responses[0].volume_capacity_bytes == SIZE


def test_allocated(start: Callable[..., Served]) -> None:
    s = start()
    req = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=s.target, secrets=SECRETS)
    assert _ranges(list(s.stub.GetMetadataAllocated(req, timeout=30))) == [Range(0, 64 * BLOCK)]
    assert s.backend.calls[-1] == ("snapshot_allocated", (s.target, 0, BLOCK, SECRETS))


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"base_snapshot_id": ""}, grpc.StatusCode.INVALID_ARGUMENT, id="no-base"),
        pytest.param({"target_snapshot_id": ""}, grpc.StatusCode.INVALID_ARGUMENT, id="no-target"),
        pytest.param(
            {"base_snapshot_id": "fs-" + "x" * 197}, grpc.StatusCode.INVALID_ARGUMENT, id="200-byte-base"
        ),
        pytest.param(
            {"target_snapshot_id": "fs-\x01"},
            grpc.StatusCode.INVALID_ARGUMENT,
            id="control-character-in-target",
        ),
        pytest.param({"max_results": -1}, grpc.StatusCode.INVALID_ARGUMENT, id="negative-max-results"),
        pytest.param({"starting_offset": -1}, grpc.StatusCode.OUT_OF_RANGE, id="negative-offset"),
        pytest.param({"starting_offset": SIZE + 1}, grpc.StatusCode.OUT_OF_RANGE, id="offset-past-the-end"),
        pytest.param({"base_snapshot_id": "fs-unknown"}, grpc.StatusCode.NOT_FOUND, id="unknown-base"),
        pytest.param({"target_snapshot_id": "fs-unknown"}, grpc.StatusCode.NOT_FOUND, id="unknown-target"),
    ],
)
def test_delta_rejects(start: Callable[..., Served], fields: dict[str, Any], code: grpc.StatusCode) -> None:
    s = start()
    with pytest.raises(grpc.RpcError) as caught:
        s.delta(**fields)
    assert caught.value.code() == code


@pytest.mark.parametrize(
    ("snapshot_id", "code"),
    [
        pytest.param("", grpc.StatusCode.INVALID_ARGUMENT, id="no-snapshot"),
        pytest.param("fs-" + "x" * 197, grpc.StatusCode.INVALID_ARGUMENT, id="200-byte-snapshot-id"),
        pytest.param("fs-\x01", grpc.StatusCode.INVALID_ARGUMENT, id="control-character-in-snapshot-id"),
        pytest.param("fs-unknown", grpc.StatusCode.NOT_FOUND, id="unknown-snapshot"),
    ],
)
def test_allocated_rejects(start: Callable[..., Served], snapshot_id: str, code: grpc.StatusCode) -> None:
    s = start()
    req = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=snapshot_id)
    with pytest.raises(grpc.RpcError) as caught:
        list(s.stub.GetMetadataAllocated(req, timeout=30))
    assert caught.value.code() == code


def test_a_backend_failure_mid_stream_aborts_it(start: Callable[..., Served]) -> None:
    s = start()
    s.backend.stream_failure = (2, failures.TransientError("the disk went away"))
    received: list[csi_pb2.GetMetadataDeltaResponse] = []
    req = csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=s.base, target_snapshot_id=s.target, max_results=1)
    with pytest.raises(grpc.RpcError) as caught:
        for response in s.stub.GetMetadataDelta(req, timeout=30):
            received.append(response)
    assert len(received) == 2
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "the disk went away" in (caught.value.details() or "")


def test_secrets_reach_the_backend_and_never_the_log(start: Callable[..., Served]) -> None:
    s = start()
    s.delta(secrets=SECRETS)
    assert s.backend.calls[-1][1][-1] == SECRETS
    s.backend.stream_failure = (1, failures.NotFoundError("gone"))
    with pytest.raises(grpc.RpcError):
        s.delta(secrets=SECRETS)
    text = s.log.getvalue()
    assert "GetMetadataDelta OK" in text and "GetMetadataDelta NOT_FOUND" in text
    assert SECRETS["token"] not in text


def test_the_service_and_its_capability_follow_the_backend(start: Callable[..., Served]) -> None:
    Service = csi_pb2.PluginCapability.Service

    def advertised(s: Served) -> bool:
        caps = s.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=10)
        return any(c.service.type == Service.SNAPSHOT_METADATA_SERVICE for c in caps.capabilities)

    assert advertised(start())
    off = start(snapshot_metadata=False)
    assert not advertised(off)
    with pytest.raises(grpc.RpcError) as caught:
        off.delta()
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_message_never_holds_more_than_a_client_can_receive(start: Callable[..., Served]) -> None:
    """max_results is a ceiling the plugin may stay under: a huge one still gets messages of at most
    MAX_PER_MESSAGE ranges, each far below gRPC's default 4 MiB receive limit."""
    s = start()
    s.backend.block_ranges[s.target] = [Range(2 * i * BLOCK, BLOCK) for i in range(MAX_PER_MESSAGE + 10)]
    req = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=s.target, max_results=10_000_000)
    responses = list(s.stub.GetMetadataAllocated(req, timeout=60))
    assert [len(r.block_metadata) for r in responses] == [MAX_PER_MESSAGE, 10]
    assert max(r.ByteSize() for r in responses) < 2 * 1024 * 1024


class Scanning(FakeBackend):
    """Its delta scans a long unchanged stretch: nothing to send until the call is no longer wanted."""

    def __init__(self) -> None:
        super().__init__(all_capabilities())
        self.stopped = threading.Event()

    def snapshot_delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        secrets: Mapping[str, str],
        wanted: Callable[[], bool] = extents.always,
    ) -> BlockMap:
        def scan() -> Iterator[Range]:
            deadline = time.monotonic() + 30
            while wanted() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.stopped.set()
            raise extents.Abandoned("no longer wanted")
            yield  # a generator

        return BlockMap(SIZE, scan())


@pytest.mark.parametrize("cancel", [False, True], ids=["deadline", "cancelled"])
def test_a_scan_stops_when_the_client_leaves(tmp_path: Path, cancel: bool) -> None:
    """The worker a delta stream holds is free again as soon as its client leaves, not once a scan
    that yields nothing for long reaches its end; the call is logged as the client ended it."""
    log = io.StringIO()
    logs.setup("text", "debug", log)
    config, _ = parse_args(["--endpoint", f"unix://{tmp_path}/s.sock", "--node-id", FAKE_NODE])
    backend = Scanning()
    driver = Driver(config, backend=backend)
    driver.start()
    try:
        vol = backend.create_volume("v", DiskOptions(size_bytes=SIZE))
        base, target = (backend.create_snapshot(n, vol.id, {}).id for n in ("b", "t"))
        with grpc.insecure_channel(config.server.endpoint) as channel:
            stub = csi_pb2_grpc.SnapshotMetadataStub(channel)
            req = csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=base, target_snapshot_id=target)
            call = stub.GetMetadataDelta(req, timeout=30 if cancel else 0.5)
            if cancel:
                time.sleep(0.3)
                call.cancel()
            with pytest.raises(grpc.RpcError):
                list(call)
            assert backend.stopped.wait(5), "the scan went on after the client left"
        expected = "CANCELLED" if cancel else "DEADLINE_EXCEEDED"
        for _ in range(100):
            if f"GetMetadataDelta {expected}" in log.getvalue():
                break
            time.sleep(0.02)
        assert f"GetMetadataDelta {expected}" in log.getvalue()
    finally:
        driver.stop(grace=1)
        logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "ballast"]
