"""A volume the CO force-detached while it was staged: ControllerUnpublishVolume without NodeUnstageVolume
(Kubernetes after maxWaitForUnmountDuration, or a node tainted out-of-service).

Real driver, real loop devices and mounts. DeleteVolume once answered OK here and unlinked the file
under the mounted filesystem; now it is refused while the loop device holds the file.
"""

from __future__ import annotations

import os

import grpc
import pytest

from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.csiclient import assert_code
from tests.integration.conftest import NODE_ID, MiB, NodeEnv, Volume, block_cap, leftovers, mount_cap

Code = grpc.StatusCode


def _mounted(path: str) -> bool:
    return Mounter().mount_at(path) is not None


def _force_detach(env: NodeEnv, vol: Volume) -> None:
    env.client.controller.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.id, node_id=NODE_ID), timeout=60
    )


def _delete(env: NodeEnv, vol: Volume) -> None:
    env.client.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.id), timeout=60)


@pytest.mark.parametrize(
    "access",
    [pytest.param("mount", id="filesystem"), pytest.param("block", id="block")],
)
def test_delete_of_a_force_detached_volume_is_refused_until_it_is_unstaged(
    node_env: NodeEnv, access: str
) -> None:
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, mount_cap() if access == "mount" else block_cap())
    _force_detach(node_env, vol)
    message = assert_code(
        node_env.client.controller.DeleteVolume,
        csi_pb2.DeleteVolumeRequest(volume_id=vol.id),
        Code.FAILED_PRECONDITION,
        contains="unstage",
    )
    (device,) = leftovers(node_env.tmp, node_env.data_dir)[1]
    assert device in message, "the refusal names the loop device that holds the file"
    assert os.path.exists(vol.file), "the file stays while it is in use"
    assert _mounted(vol.staging) == (access == "mount")
    node_env.unstage(vol)
    assert leftovers(node_env.tmp, node_env.data_dir) == ([], [])
    _delete(node_env, vol)
    _delete(node_env, vol)  # already deleted -> OK
    assert not os.path.exists(vol.file)
