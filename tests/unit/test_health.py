"""The v1.13 health RPCs over the FakeBackend: codes, paging, the wire mapping of statuses, and the
node-side checks that need no real device (the rest: tests/integration/test_health.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.failures import FailedPreconditionError
from csi.health import Issue, Status, StorageIssue, StorageStatus, distinct
from tests.unit.test_controller import CTX, Env, code_of
from tests.unit.test_node import Env as NodeEnv

Code = grpc.StatusCode
LOSS = Issue(Status.DATA_LOSS, "BackingFileShort", "half of it is gone")
SLOW = Issue(Status.DEGRADED, "IoPerformanceDegraded", "slow")


@pytest.fixture
def env() -> Env:
    return Env()


def _get(env: Env, volume_id: str) -> csi_pb2.VolumeHealth:
    req = csi_pb2.ControllerGetVolumeHealthRequest(volume_id=volume_id)
    return env.ctl.ControllerGetVolumeHealth(req, CTX).volume_health


def test_get_volume_health_of_a_healthy_volume_is_an_empty_list(env: Env) -> None:
    vol = env.create()
    health = _get(env, vol.volume_id)
    assert health.volume_id == vol.volume_id
    assert list(health.health_statuses) == []


def test_get_volume_health_maps_every_status(env: Env) -> None:
    vol = env.create()
    lost = Issue(Status.INACCESSIBLE, "BackingFileMissing", "gone")
    env.backend.issues[vol.volume_id] = (LOSS, SLOW, lost)
    got = [(e.status, e.reason, e.message) for e in _get(env, vol.volume_id).health_statuses]
    assert got == [
        (csi_pb2.DATA_LOSS, "BackingFileShort", "half of it is gone"),
        (csi_pb2.DEGRADED, "IoPerformanceDegraded", "slow"),
        (csi_pb2.INACCESSIBLE, "BackingFileMissing", "gone"),
    ]


@pytest.mark.parametrize(
    ("volume_id", "code"),
    [
        pytest.param("", Code.INVALID_ARGUMENT, id="no-volume-id"),
        pytest.param("fv-" + "x" * 197, Code.INVALID_ARGUMENT, id="200-byte-volume-id"),
        pytest.param("fv-\x01", Code.INVALID_ARGUMENT, id="control-character-in-volume-id"),
        pytest.param("fv-unknown", Code.NOT_FOUND, id="unknown-volume"),
    ],
)
def test_get_volume_health_rejects(env: Env, volume_id: str, code: Code) -> None:
    req = csi_pb2.ControllerGetVolumeHealthRequest(volume_id=volume_id)
    assert code_of(env.ctl.ControllerGetVolumeHealth, req) == code


def test_list_volume_health_leaves_healthy_volumes_out_and_pages(env: Env) -> None:
    ids = [env.create(f"v{i}").volume_id for i in range(7)]
    sick = ids[1::2]  # three of the seven
    for vid in sick:
        env.backend.issues[vid] = (LOSS,)
    seen: list[str] = []
    token, pages = "", 0
    while True:
        req = csi_pb2.ControllerListVolumeHealthRequest(max_entries=2, starting_token=token)
        resp = env.ctl.ControllerListVolumeHealth(req, CTX)
        assert len(resp.entries) <= 2
        seen += [e.volume_id for e in resp.entries]
        assert all(e.health_statuses[0].reason == "BackingFileShort" for e in resp.entries)
        token, pages = resp.next_token, pages + 1
        if not token:
            break
    assert seen == sorted(sick) and pages == 2


@pytest.mark.parametrize(
    ("request_fields", "code"),
    [
        pytest.param({"starting_token": "bogus"}, Code.ABORTED, id="foreign-token"),
        pytest.param({"max_entries": -1}, Code.INVALID_ARGUMENT, id="negative-max-entries"),
    ],
)
def test_list_volume_health_rejects(env: Env, request_fields: dict[str, Any], code: Code) -> None:
    req = csi_pb2.ControllerListVolumeHealthRequest(**request_fields)
    assert code_of(env.ctl.ControllerListVolumeHealth, req) == code


def test_health_rpcs_are_unimplemented_without_the_capability() -> None:
    env = Env(volume_health=False)
    vol = env.create()
    get = csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vol.volume_id)
    assert code_of(env.ctl.ControllerGetVolumeHealth, get) == Code.UNIMPLEMENTED
    assert code_of(env.ctl.ControllerListVolumeHealth, csi_pb2.ControllerListVolumeHealthRequest()) == (
        Code.UNIMPLEMENTED
    )
    rpcs = {
        c.rpc.type
        for c in env.ctl.ControllerGetCapabilities(
            csi_pb2.ControllerGetCapabilitiesRequest(), CTX
        ).capabilities
    }
    RPC = csi_pb2.ControllerServiceCapability.RPC
    assert not {RPC.GET_VOLUME_HEALTH, RPC.LIST_VOLUME_HEALTH} & rpcs


def test_issues_are_distinct_by_status_and_reason() -> None:
    again = Issue(Status.DATA_LOSS, "BackingFileShort", "another message")
    other = Issue(Status.INACCESSIBLE, "BackingFileShort", "same reason, other status")
    assert distinct([LOSS, again, other, SLOW]) == (LOSS, other, SLOW)


# ---------------------------------------------------------------- node side


@pytest.fixture
def node(tmp_path: Path) -> NodeEnv:
    return NodeEnv(tmp_path)


def _node_health(node: NodeEnv, **fields: str) -> csi_pb2.VolumeHealth:
    req = csi_pb2.NodeGetVolumeHealthRequest(**fields)
    return node.node.NodeGetVolumeHealth(req, None).volume_health  # type: ignore[arg-type]


def _node_code(node: NodeEnv, **fields: str) -> Code:
    return code_of(node.node.NodeGetVolumeHealth, csi_pb2.NodeGetVolumeHealthRequest(**fields))


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"volume_id": ""}, Code.INVALID_ARGUMENT, id="no-volume-id"),
        pytest.param({"volume_id": "fv-" + "x" * 197}, Code.INVALID_ARGUMENT, id="200-byte-volume-id"),
        pytest.param({"volume_id": "fv-\x01"}, Code.INVALID_ARGUMENT, id="control-character-in-volume-id"),
        pytest.param({"volume_publish_path": "relative"}, Code.INVALID_ARGUMENT, id="relative-path"),
        pytest.param({"staging_target_path": "/etc/x"}, Code.INVALID_ARGUMENT, id="outside-the-roots"),
        pytest.param({"volume_id": "fv-unknown"}, Code.NOT_FOUND, id="unknown-volume"),
        pytest.param({}, Code.NOT_FOUND, id="known-but-not-on-this-node"),
    ],
)
def test_node_volume_health_rejects(node: NodeEnv, fields: dict[str, str], code: Code) -> None:
    assert _node_code(node, **{"volume_id": node.volume_id, **fields}) == code


def test_a_published_path_with_nothing_mounted_is_inaccessible(node: NodeEnv) -> None:
    target = str(node.kubelet / "pods" / "p" / "volumes" / "v" / "mount")
    health = _node_health(node, volume_id=node.volume_id, volume_publish_path=target)
    assert [(e.status, e.reason) for e in health.health_statuses] == [(csi_pb2.INACCESSIBLE, "NotPublished")]
    assert target in health.health_statuses[0].message


def test_a_mount_whose_device_is_gone_is_device_lost(node: NodeEnv) -> None:
    staging = f"{node.kubelet}/plugins/v/globalmount"
    node.mountinfo.write_text(
        f"1 0 254:0 / / rw - ext4 /dev/vda rw\n2 1 7:9 / {staging} rw - ext4 /dev/loop9 rw\n"
    )
    health = _node_health(node, volume_id=node.volume_id, staging_target_path=staging)
    assert [(e.status, e.reason) for e in health.health_statuses] == [(csi_pb2.INACCESSIBLE, "DeviceLost")]


def test_a_device_that_is_not_the_volume_is_inaccessible(node: NodeEnv) -> None:
    node.backend.fail["prepared_device"] = FailedPreconditionError("loop0 maps another file")
    health = _node_health(node, volume_id=node.volume_id)
    assert [(e.reason, e.message) for e in health.health_statuses] == [
        ("DeviceUnverified", "loop0 maps another file")
    ]


def test_storage_health_maps_storage_statuses(node: NodeEnv) -> None:
    node.backend.storage_issues = [
        StorageIssue(StorageStatus.DEGRADED, "DataDirNearlyFull", "96% full"),
        StorageIssue(StorageStatus.UNREACHABLE, "DataDirReadOnly", "read-only"),
    ]
    resp = node.node.NodeGetStorageHealth(csi_pb2.NodeGetStorageHealthRequest(), None)  # type: ignore[arg-type]
    assert [(h.status, h.reason, h.message) for h in resp.backend_health] == [
        (csi_pb2.STORAGE_DEGRADED, "DataDirNearlyFull", "96% full"),
        (csi_pb2.STORAGE_UNREACHABLE, "DataDirReadOnly", "read-only"),
    ]
