"""Hostile node requests over the real socket: INVALID_ARGUMENT, and nothing mounted, attached or created."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest

from csi import loopfind
from csi._proto import csi_pb2
from tests.csiclient import assert_code
from tests.integration.conftest import NodeEnv, block_cap, leftovers, mount_cap

CASES = [
    pytest.param({"staging": "relative/staging"}, id="relative-staging"),
    pytest.param({"target": "relative/target"}, id="relative-target"),
    pytest.param({"staging": "{k}/plugins/../../../../etc/x"}, id="dotdot-staging"),
    pytest.param({"target": "{k}/pods/../../../../root/x"}, id="dotdot-target"),
    pytest.param({"staging": "/etc/ballast-staging"}, id="staging-outside-roots"),
    pytest.param({"target": "/tmp/ballast-target"}, id="target-outside-roots"),
    pytest.param({"flags": ["exec;rm -rf /"]}, id="flag-shell-injection"),
    pytest.param({"flags": ["unknownopt"]}, id="flag-unknown"),
    pytest.param({"flags": ["errors=panic"]}, id="flag-dangerous-value"),
    pytest.param({"fs_type": "btrfs"}, id="fs-type-btrfs"),
    pytest.param({"fs_type": "vfat"}, id="fs-type-vfat"),
    pytest.param({"context": {"partition": "-1"}}, id="partition-negative"),
    pytest.param({"context": {"partition": "1a"}}, id="partition-not-integer"),
    pytest.param({"context": {"partition": "4096"}}, id="partition-too-large"),
    pytest.param({"context": {"blockSize": "3"}, "stage_only": True}, id="mkfs-option-invalid"),
    pytest.param({"block": True, "context": {"partition": "0x1"}}, id="block-partition-hex"),
]


def _requests(env: NodeEnv, spec: dict[str, Any], vol_id: str) -> tuple[Any, Any]:
    k = str(env.kubelet)
    staging = spec.get("staging", f"{k}/plugins/adv/globalmount").replace("{k}", k)
    target = spec.get("target", f"{k}/pods/adv/volumes/mount").replace("{k}", k)
    if spec.get("block"):
        cap = block_cap()
    else:
        cap = mount_cap(spec.get("fs_type", "ext4"), tuple(spec.get("flags", ())))
    context = spec.get("context", {})
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol_id, staging_target_path=staging, volume_capability=cap, volume_context=context
    )
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol_id,
        staging_target_path=staging,
        target_path=target,
        volume_capability=cap,
        volume_context=context,
    )
    return stage, publish


@pytest.mark.parametrize("spec", CASES)
def test_hostile_requests_are_rejected_without_side_effects(node_env: NodeEnv, spec: dict[str, Any]) -> None:
    vol = node_env.volume()
    stage, publish = _requests(node_env, spec, vol.id)
    before = sorted(str(p) for p in node_env.kubelet.rglob("*"))
    if "target" not in spec:
        assert_code(node_env.client.node.NodeStageVolume, stage, grpc.StatusCode.INVALID_ARGUMENT)
    if not spec.get("stage_only") and ("staging" not in spec or "target" in spec):
        assert_code(node_env.client.node.NodePublishVolume, publish, grpc.StatusCode.INVALID_ARGUMENT)
    mounts, loops = leftovers(node_env.tmp, node_env.data_dir)
    assert mounts == [] and loops == []
    assert loopfind.devices_for(os.stat(vol.file)) == []
    assert sorted(str(p) for p in node_env.kubelet.rglob("*")) == before
    assert not os.path.exists("/etc/ballast-staging") and not os.path.exists("/tmp/ballast-target")


def test_unstage_undoes_a_stage_whose_file_was_replaced_behind_the_driver(node_env: NodeEnv) -> None:
    """Health then reports the device lost and says to unstage and stage again: both must work."""
    vol = node_env.volume()
    cap = mount_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    with open(vol.file, "rb") as src, open(vol.file + ".new", "wb") as dst:
        dst.write(src.read())
    os.rename(vol.file + ".new", vol.file)
    node_env.unpublish(vol)
    node_env.unstage(vol)
    mounts, loops = leftovers(node_env.tmp, node_env.data_dir)
    assert (mounts, loops) == ([], [])
    node_env.stage(vol, cap)
