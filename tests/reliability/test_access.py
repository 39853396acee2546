"""Access: secrets never leave the driver, and only loopback tcp endpoints are accepted.

(The unix socket's 0660 mode under umask 000 is tested in tests/integration/test_server.py.)

The secrets check runs the real driver with debug JSON logs and a metrics endpoint, sends a marker
secret through every RPC that has a secrets field -- once in a request that succeeds, once in one that
fails -- and then searches everything the driver let out: its stdout/stderr, the /metrics and /healthz
bodies, and every status message.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.config import parse_args
from tests.conformance.driver import NODE_ID
from tests.csiclient import CsiClient, connect
from tests.reliability.conftest import MiB, Proc, mount_cap, retry

KEY, VALUE = "marker-key-Q9Zx", "marker-value-7Kp2W"
SECRETS = {KEY: VALUE, "password": VALUE[::-1]}
NEEDLES = (KEY, VALUE, VALUE[::-1])


def _options(field: Any) -> Any:
    """A field's options; the protobuf stubs cannot type an extension lookup by a custom option."""
    return field.GetOptions()


def secret_methods() -> set[str]:
    """Every RPC whose request has a `secrets` map or a csi_secret field."""
    out = set()
    for service in ("Controller", "Node", "GroupController", "Identity", "SnapshotMetadata"):
        for m in csi_pb2.DESCRIPTOR.services_by_name[service].methods:
            if any(
                f.name == "secrets" or _options(f).Extensions[csi_pb2.csi_secret] for f in m.input_type.fields
            ):
                out.add(m.name)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """Calls RPCs, keeping every status message and the names of the RPCs that carried secrets."""

    def __init__(self, client: CsiClient) -> None:
        self.client = client
        self.messages: list[str] = []
        self.sent: set[str] = set()

    def call(self, service: str, method: str, request: Any, *, ok: bool) -> Any:
        if "secrets" in request.DESCRIPTOR.fields_by_name:
            request.secrets.update(SECRETS)
            self.sent.add(method)
        call: Callable[..., Any] = getattr(getattr(self.client, service), method)
        try:
            if service == "snapshot_metadata":  # a stream: read it all (a failure may come mid-stream)
                response = list(call(request, timeout=60))
            else:
                response = retry(call, request) if ok else call(request, timeout=60)
        except grpc.RpcError as err:
            self.messages.append(err.details() or "")
            assert not ok, f"{method} failed: {err.details()}"
            return None
        assert ok, f"{method} was expected to fail"
        return response


def lifecycle(r: Recorder, work: Path) -> None:
    """Each secret-carrying RPC once with a good request and once with a bad one."""
    cap = mount_cap()
    vol = r.call(
        "controller",
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="sec",
            capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB),
            volume_capabilities=[cap],
        ),
        ok=True,
    ).volume
    vid = vol.volume_id
    r.call(
        "controller", "CreateVolume", csi_pb2.CreateVolumeRequest(name="bad", parameters={"x": "y"}), ok=False
    )
    r.call(
        "controller",
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=vid, volume_capabilities=[cap]),
        ok=True,
    )
    r.call(
        "controller",
        "ValidateVolumeCapabilities",
        csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id="lv-" + "0" * 32, volume_capabilities=[cap]),
        ok=False,
    )
    pc = r.call(
        "controller",
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=cap),
        ok=True,
    ).publish_context
    r.call(
        "controller",
        "ControllerPublishVolume",
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id="elsewhere", volume_capability=cap),
        ok=False,
    )
    staging, target = str(work / "stg" / vid), str(work / "pods" / vid / "mount")
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vid, staging_target_path=staging, volume_capability=cap, publish_context=pc
    )
    r.call("node", "NodeStageVolume", stage, ok=True)
    bad_stage = csi_pb2.NodeStageVolumeRequest()
    bad_stage.CopyFrom(stage)
    bad_stage.staging_target_path = "/etc/not-allowed"
    r.call("node", "NodeStageVolume", bad_stage, ok=False)
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=vid,
        staging_target_path=staging,
        target_path=target,
        volume_capability=cap,
        publish_context=pc,
    )
    r.call("node", "NodePublishVolume", publish, ok=True)
    bad_publish = csi_pb2.NodePublishVolumeRequest()
    bad_publish.CopyFrom(publish)
    bad_publish.target_path = "relative"
    r.call("node", "NodePublishVolume", bad_publish, ok=False)
    r.call(
        "controller",
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=csi_pb2.CapacityRange(required_bytes=48 * MiB)
        ),
        ok=True,
    )
    r.call(
        "controller",
        "ControllerExpandVolume",
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=csi_pb2.CapacityRange(limit_bytes=-1)
        ),
        ok=False,
    )
    r.call(
        "node",
        "NodeExpandVolume",
        csi_pb2.NodeExpandVolumeRequest(
            volume_id=vid,
            volume_path=target,
            volume_capability=csi_pb2.VolumeCapability(
                block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=cap.access_mode
            ),
        ),
        ok=True,
    )  # a block capability: reports the device size without growing a filesystem
    r.call(
        "node",
        "NodeExpandVolume",
        csi_pb2.NodeExpandVolumeRequest(volume_id=vid, volume_path=str(work / "missing")),
        ok=False,
    )
    r.call(
        "controller",
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(volume_id=vid, mutable_parameters={"iops": "300"}),
        ok=True,
    )
    r.call(
        "controller",
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(volume_id=vid, mutable_parameters={"iops": "x"}),
        ok=False,
    )
    snap = r.call(
        "controller",
        "CreateSnapshot",
        csi_pb2.CreateSnapshotRequest(name="sec-snap", source_volume_id=vid),
        ok=True,
    ).snapshot.snapshot_id
    r.call("controller", "CreateSnapshot", csi_pb2.CreateSnapshotRequest(name="sec-snap2"), ok=False)
    r.call("controller", "GetSnapshot", csi_pb2.GetSnapshotRequest(snapshot_id=snap), ok=True)
    r.call("controller", "GetSnapshot", csi_pb2.GetSnapshotRequest(snapshot_id="ls-" + "1" * 32), ok=False)
    health_rpcs(r, vid)
    snapshot_metadata(r, vid, snap)
    r.call("controller", "ListSnapshots", csi_pb2.ListSnapshotsRequest(snapshot_id=snap), ok=True)
    r.call("controller", "ListSnapshots", csi_pb2.ListSnapshotsRequest(starting_token="forged"), ok=False)
    group = r.call(
        "group",
        "CreateVolumeGroupSnapshot",
        csi_pb2.CreateVolumeGroupSnapshotRequest(name="sec-group", source_volume_ids=[vid]),
        ok=True,
    ).group_snapshot.group_snapshot_id
    r.call(
        "group", "CreateVolumeGroupSnapshot", csi_pb2.CreateVolumeGroupSnapshotRequest(name="g2"), ok=False
    )
    r.call(
        "group",
        "GetVolumeGroupSnapshot",
        csi_pb2.GetVolumeGroupSnapshotRequest(group_snapshot_id=group),
        ok=True,
    )
    r.call(
        "group",
        "GetVolumeGroupSnapshot",
        csi_pb2.GetVolumeGroupSnapshotRequest(group_snapshot_id="x"),
        ok=False,
    )
    r.call(
        "group",
        "DeleteVolumeGroupSnapshot",
        csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group),
        ok=True,
    )
    r.call("group", "DeleteVolumeGroupSnapshot", csi_pb2.DeleteVolumeGroupSnapshotRequest(), ok=False)
    r.call("controller", "DeleteSnapshot", csi_pb2.DeleteSnapshotRequest(snapshot_id=snap), ok=True)
    r.call("controller", "DeleteSnapshot", csi_pb2.DeleteSnapshotRequest(), ok=False)
    r.client.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=target), timeout=60
    )
    r.client.node.NodeUnstageVolume(
        csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=staging), timeout=60
    )
    r.call("controller", "DeleteVolume", csi_pb2.DeleteVolumeRequest(volume_id=vid), ok=False)  # published
    r.call(
        "controller",
        "ControllerUnpublishVolume",
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=NODE_ID),
        ok=True,
    )
    r.call("controller", "ControllerUnpublishVolume", csi_pb2.ControllerUnpublishVolumeRequest(), ok=False)
    r.call("controller", "DeleteVolume", csi_pb2.DeleteVolumeRequest(volume_id=vid), ok=True)
    r.call("controller", "DeleteVolume", csi_pb2.DeleteVolumeRequest(), ok=False)


def health_rpcs(r: Recorder, vid: str) -> None:
    """The v1.13 health RPCs that carry secrets."""
    r.call(
        "controller",
        "ControllerGetVolumeHealth",
        csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vid),
        ok=True,
    )
    unknown = csi_pb2.ControllerGetVolumeHealthRequest(volume_id="lv-" + "0" * 32)
    r.call("controller", "ControllerGetVolumeHealth", unknown, ok=False)
    r.call("controller", "ControllerListVolumeHealth", csi_pb2.ControllerListVolumeHealthRequest(), ok=True)
    forged = csi_pb2.ControllerListVolumeHealthRequest(starting_token="forged")
    r.call("controller", "ControllerListVolumeHealth", forged, ok=False)
    r.call("node", "NodeGetStorageHealth", csi_pb2.NodeGetStorageHealthRequest(), ok=True)


def snapshot_metadata(r: Recorder, vid: str, snap: str) -> None:
    """Both SnapshotMetadata RPCs (server streams), each with a good and a bad request."""
    later = r.call(
        "controller",
        "CreateSnapshot",
        csi_pb2.CreateSnapshotRequest(name="sec-later", source_volume_id=vid),
        ok=True,
    ).snapshot.snapshot_id
    delta = csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=snap, target_snapshot_id=later)
    r.call("snapshot_metadata", "GetMetadataDelta", delta, ok=True)
    r.call(
        "snapshot_metadata",
        "GetMetadataDelta",
        csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=snap),
        ok=False,
    )
    r.call(
        "snapshot_metadata",
        "GetMetadataAllocated",
        csi_pb2.GetMetadataAllocatedRequest(snapshot_id=snap),
        ok=True,
    )
    past = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=snap, starting_offset=1 << 40)
    r.call("snapshot_metadata", "GetMetadataAllocated", past, ok=False)
    r.call("controller", "DeleteSnapshot", csi_pb2.DeleteSnapshotRequest(snapshot_id=later), ok=True)


@pytest.mark.root
def test_no_secret_reaches_logs_metrics_or_errors(proc: Proc) -> None:
    port = free_port()
    proc.extra = ("--log-level", "debug", "--log-format", "json", "--metrics-address", f"127.0.0.1:{port}")
    driver = proc.start()
    client = connect(driver.endpoint)
    recorder = Recorder(client)
    try:
        lifecycle(recorder, proc.workdir)
        scraped = ""
        for path in ("/metrics", "/healthz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                scraped += resp.read().decode()
    finally:
        client.close()
        proc.stop()
    log = driver.log.read_text()

    assert recorder.sent == secret_methods(), "every RPC with a secrets field was exercised"
    assert len(recorder.messages) >= len(secret_methods()), "each one failed once too"
    assert '"level": "debug"' in log and "CreateVolume" in log, "debug logging was on and captured"
    assert "ballast_" in scraped or "grpc" in scraped.lower(), "metrics were scraped"
    for needle in NEEDLES:
        assert needle not in log, f"secret {needle!r} in the driver log"
        assert needle not in scraped, f"secret {needle!r} in /metrics"
        leaked = [m for m in recorder.messages if needle in m]
        assert not leaked, f"secret {needle!r} in error messages {leaked}"


@pytest.mark.parametrize(
    "endpoint",
    [
        pytest.param("tcp://0.0.0.0:10000", id="any-ipv4"),
        pytest.param("tcp://[::]:10000", id="any-ipv6"),
        pytest.param("tcp://:10000", id="empty-host"),
        pytest.param("tcp://127.0.0.1.nip.io:10000", id="loopback-lookalike-name"),
        pytest.param("tcp://localhost.example.com:10000", id="localhost-prefix"),
        pytest.param("tcp://[::ffff:10.0.0.1]:10000", id="mapped-ipv4"),
        pytest.param("tcp://192.168.1.10:10000", id="private-address"),
        pytest.param("tcp://10.0.0.1:10000@127.0.0.1", id="userinfo-trick"),
    ],
)
def test_tcp_endpoints_that_are_not_loopback_are_refused(endpoint: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--endpoint", endpoint])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "endpoint",
    [
        pytest.param("tcp://127.0.0.1:10000", id="ipv4-loopback"),
        pytest.param("tcp://[::1]:10000", id="ipv6-loopback"),
        pytest.param("tcp://localhost:10000", id="localhost"),
    ],
)
def test_loopback_tcp_endpoints_are_accepted(endpoint: str) -> None:
    config, _ = parse_args(["--endpoint", endpoint])
    assert config.server.endpoint == endpoint
