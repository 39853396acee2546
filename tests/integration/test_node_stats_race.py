"""NodeGetVolumeStats while the volume is unpublished: never the numbers of the filesystem beneath the
target (kubelet would report them as the PVC's usage), and a target gone meanwhile is NOT_FOUND (spec:
"Volume does not exist on volume_path"), not INTERNAL. Real driver, loop devices and mounts."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import grpc
import pytest

from csi import loopfind, sizing
from csi._proto import csi_pb2
from csi.failures import NotFoundError
from csi.mount import Mounter, MountInfo
from tests.integration.conftest import MiB, NodeEnv, mount_cap

SIZE = 64 * MiB


class _StaleMounter(Mounter):
    """Answers with the mount table read before an unmount: the interleaving of a stats that checked
    the mount and then read the path by name."""

    def __init__(self, seen: MountInfo) -> None:
        super().__init__()
        self._seen = seen

    def mount_at(self, path: str, table: Sequence[MountInfo] | None = None) -> MountInfo | None:
        return self._seen


@pytest.mark.parametrize(
    "target_removed",
    [pytest.param(False, id="unmounted-directory-left"), pytest.param(True, id="target-removed")],
)
def test_stats_of_a_target_unmounted_after_the_mount_check_is_not_found(
    node_env: NodeEnv, target_removed: bool
) -> None:
    vol = node_env.volume(SIZE)
    node_env.stage(vol, mount_cap())
    node_env.publish(vol, mount_cap())
    seen = Mounter().mount_at(vol.target)
    assert seen is not None
    (device,) = loopfind.devices_for(os.stat(vol.file))
    if target_removed:
        node_env.unpublish(vol)
    else:
        Mounter().unmount(vol.target)
    with pytest.raises(NotFoundError):
        sizing.stats(_StaleMounter(seen), vol.id, device, vol.target)


def test_stats_racing_unpublish_never_reports_another_filesystem(node_env: NodeEnv) -> None:
    vol = node_env.volume(SIZE)
    node_env.stage(vol, mount_cap())
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=vol.target)
    problems: list[str] = []

    def stats(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                reply = node_env.client.node.NodeGetVolumeStats(request, timeout=30)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    problems.append(f"{err.code().name}: {err.details()}")
                continue
            total = sum(u.total for u in reply.usage if u.unit == csi_pb2.VolumeUsage.BYTES)
            if total > SIZE:
                problems.append(f"OK with {total} bytes, more than the volume's {SIZE}")

    for _ in range(100):
        node_env.publish(vol, mount_cap())
        stop = threading.Event()
        readers = [threading.Thread(target=stats, args=(stop,)) for _ in range(2)]
        for reader in readers:
            reader.start()
        node_env.unpublish(vol)
        stop.set()
        for reader in readers:
            reader.join()
    assert problems == []
