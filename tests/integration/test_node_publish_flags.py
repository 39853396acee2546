"""NodePublishVolume on real mounts: one volume per path when two requests race for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from csi.mount import Mounter
from tests.integration.conftest import NodeEnv, Volume, mount_cap

pytestmark = pytest.mark.root


def _formatted(env: NodeEnv) -> Volume:
    """A volume holding a filesystem, unstaged again (a read-only stage never formats)."""
    vol = env.volume()
    env.stage(vol, mount_cap())
    env.unstage(vol)
    return vol


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
