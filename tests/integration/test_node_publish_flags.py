"""NodePublishVolume on real mounts: the flags a bind keeps from its staging mount, the answers to a
repeated publish, and one volume per path when two requests race for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.csiclient import assert_code
from tests.integration.conftest import MiB, NodeEnv, Volume, block_cap, mount_cap

pytestmark = pytest.mark.root


def _options(path: str) -> set[str]:
    mount = Mounter().mount_at(path)
    assert mount is not None, f"nothing mounted at {path}"
    return set(mount.options)


def _formatted(env: NodeEnv) -> Volume:
    """A volume holding a filesystem, unstaged again (a read-only stage never formats)."""
    vol = env.volume()
    env.stage(vol, mount_cap())
    env.unstage(vol)
    return vol


@pytest.mark.parametrize(
    ("stage_flags", "publish_flags", "shown"),
    [
        pytest.param(("nodev",), (), {"nodev"}, id="nodev-staged"),
        pytest.param(("noexec",), (), {"noexec"}, id="noexec-staged"),
        pytest.param(("noatime",), (), {"noatime"}, id="noatime-staged"),
        pytest.param(("nodev",), ("noatime",), {"nodev", "noatime"}, id="staged-and-published-flags"),
        pytest.param((), ("nosuid", "ro"), {"nosuid", "ro"}, id="published-flags-only"),
        pytest.param(("ro",), ("ro",), {"ro"}, id="read-only-staged-read-only-published"),
    ],
)
def test_a_repeated_publish_gives_the_same_answer_whatever_the_staging_flags(
    node_env: NodeEnv, stage_flags: tuple[str, ...], publish_flags: tuple[str, ...], shown: set[str]
) -> None:
    vol = _formatted(node_env)
    node_env.stage(vol, mount_cap("ext4", stage_flags))
    node_env.publish(vol, mount_cap("ext4", publish_flags))
    assert shown <= _options(vol.target), "the bind keeps the staging flags and adds the requested ones"
    node_env.publish(vol, mount_cap("ext4", publish_flags))  # spec: idempotent -> OK


@pytest.mark.parametrize("flag", ["nodev", "nosuid", "noexec", "noatime", "nodiratime"])
@pytest.mark.parametrize(
    "first_with_flag",
    [
        pytest.param(True, id="published-with-then-without"),
        pytest.param(False, id="published-without-then-with"),
    ],
)
def test_a_republish_with_other_per_mount_flags_is_already_exists(
    node_env: NodeEnv, flag: str, first_with_flag: bool
) -> None:
    """CSI NodePublishVolume: published at target_path "but is incompatible with the specified
    volume_capability or readonly flag" -> ALREADY_EXISTS; the per-mount flags are compared like ro,
    and the mount at the target is left as it was."""
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, mount_cap())
    with_flag, without = mount_cap("ext4", (flag,)), mount_cap()
    first, then = (with_flag, without) if first_with_flag else (without, with_flag)
    node_env.publish(vol, first)
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        target_path=vol.target,
        volume_capability=then,
        publish_context=vol.publish_context,
    )
    assert_code(
        node_env.client.node.NodePublishVolume,
        request,
        grpc.StatusCode.ALREADY_EXISTS,
        contains="other options",
    )
    assert (flag in _options(vol.target)) == first_with_flag


def test_a_read_write_publish_of_a_read_only_staging_is_refused_every_time(node_env: NodeEnv) -> None:
    vol = _formatted(node_env)
    node_env.stage(vol, mount_cap("ext4", ("ro",)))
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        target_path=vol.target,
        volume_capability=mount_cap(),
        publish_context=vol.publish_context,
    )
    for _ in range(2):
        assert_code(
            node_env.client.node.NodePublishVolume,
            request,
            grpc.StatusCode.FAILED_PRECONDITION,
            contains="staged read-only",
        )
    assert Mounter().mount_at(vol.target) is None
    node_env.publish(vol, mount_cap(), readonly=True)
    node_env.publish(vol, mount_cap(), readonly=True)


def test_a_target_holding_another_device_node_names_that_device(node_env: NodeEnv) -> None:
    first, second = node_env.volume(16 * MiB), node_env.volume(16 * MiB)
    for vol in (first, second):
        node_env.stage(vol, block_cap())
    node_env.publish(first, block_cap())
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=second.id,
        staging_target_path=second.staging,
        target_path=first.target,
        volume_capability=block_cap(),
        publish_context=second.publish_context,
    )
    message = assert_code(node_env.client.node.NodePublishVolume, request, grpc.StatusCode.ALREADY_EXISTS)
    assert "/dev/loop" in message and "devtmpfs" not in message, message


def _race(*calls: Callable[[], Any]) -> list[str]:
    """Run `calls` at once; each one's outcome: OK or its status code name."""
    barrier = threading.Barrier(len(calls))
    outcomes = [""] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            calls[i]()
            outcomes[i] = "OK"
        except grpc.RpcError as err:
            outcomes[i] = err.code().name

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return outcomes


def _mounts_at(path: str) -> int:
    return sum(1 for m in Mounter().mounts((path,)) if m.mount_point == path)


@pytest.mark.parametrize("step", ["stage", "publish"])
def test_two_volumes_at_one_path_at_once_one_wins(node_env: NodeEnv, step: str) -> None:
    """Two different volumes staged at one staging path, or published at one target, at once: one
    answers OK, the other ABORTED or ALREADY_EXISTS, and one mount is there (spec: the path holds
    another volume -> ALREADY_EXISTS). Repeated, as a race may not overlap every time."""
    volumes = [_formatted(node_env), _formatted(node_env)]
    shared = str(node_env.kubelet / "shared")
    for _ in range(5):
        if step == "stage":
            for vol in volumes:
                vol.staging = shared
            outcomes = _race(*(lambda v=vol: node_env.stage(v, mount_cap()) for vol in volumes))
        else:
            for vol in volumes:
                node_env.stage(vol, mount_cap())
            outcomes = _race(
                *(lambda v=vol: node_env.publish(v, mount_cap(), target=shared) for vol in volumes)
            )
        assert sorted(outcomes)[-1] == "OK" and sorted(outcomes)[0] in ("ABORTED", "ALREADY_EXISTS"), outcomes
        assert _mounts_at(shared) == 1
        for vol in volumes:
            if step == "publish":
                node_env.unpublish(vol, shared)
            node_env.unstage(vol)
        assert _mounts_at(shared) == 0
