"""The driver in this process over a real unix socket, with fault seams: a backend whose operations can
be made to fail with TransientError, a loop module that can run out of devices, and a command runner
that makes chosen programs (mkfs, mount...) fail while every other command really runs."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from csi import loop as real_loop
from csi._proto import csi_pb2
from csi.backends.local import LocalBackend
from csi.config import parse_args
from csi.failures import TransientError
from csi.mount import Result, SubprocessRunner
from csi.server import Driver
from tests.csiclient import CsiClient, connect
from tests.reliability.conftest import MiB, mount_cap

NODE_ID = "rel-node"
FAULTABLE = (
    "create_volume",
    "delete_volume",
    "expand_volume",
    "attach",
    "detach",
    "create_snapshot",
    "delete_snapshot",
    "resolve_device",
    "release_device",
)


class FlakyBackend(LocalBackend):
    """LocalBackend whose operations named in `faults` raise TransientError the next N times."""

    faults: dict[str, int]

    def fail(self, operation: str, times: int = 1) -> None:
        self.faults[operation] = times

    def _maybe_fail(self, operation: str) -> None:
        left = self.faults.get(operation, 0)
        if left:
            self.faults[operation] = left - 1
            raise TransientError(f"{operation}: the storage API timed out (injected); retry")


def _faultable(name: str) -> Callable[..., Any]:
    inner = getattr(LocalBackend, name)

    def method(self: FlakyBackend, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail(name)
        return inner(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in FAULTABLE:
    setattr(FlakyBackend, _name, _faultable(_name))


class ScarceLoop(ModuleType):
    """csi.loop, except that `attach` finds no free device while `exhausted` is set (as the kernel
    answers LOOP_CTL_GET_FREE when max_loop is reached)."""

    def __init__(self) -> None:
        super().__init__("scarce_loop")
        self.exhausted = False
        self.attempts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(real_loop, name)

    def attach(self, backing_file: str) -> str:
        self.attempts += 1
        if self.exhausted:
            raise real_loop._no_free(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return real_loop.attach(backing_file)


@dataclass
class FaultRunner:
    """Runs every command for real, except the next N runs of a program told to fail (a version query,
    `-V`, is not such a run: it touches no device)."""

    faults: dict[str, tuple[int, str]] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    real: SubprocessRunner = field(default_factory=SubprocessRunner)

    def fail(self, program: str, stderr: str, times: int = 1) -> None:
        self.faults[program] = (times, stderr)

    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result:
        self.calls.append(tuple(argv))
        times, stderr = self.faults.get(argv[0], (0, ""))
        if times and tuple(argv[1:]) != ("-V",):
            self.faults[argv[0]] = (times - 1, stderr)
            return Result(tuple(argv), 32, "", stderr)
        return self.real(argv, timeout)


@dataclass
class Local:
    """One in-process driver (all services, local backend) rooted at `tmp`."""

    tmp: Path
    data_dir: Path
    backend: FlakyBackend
    driver: Driver
    client: CsiClient
    count: int = 0

    @property
    def kubelet(self) -> Path:
        return self.tmp / "kubelet"

    def stop(self) -> None:
        self.client.close()
        self.driver.stop(grace=5)

    def create(self, size: int = 32 * MiB, name: str = "") -> str:
        self.count += 1
        vol = self.client.controller.CreateVolume(
            csi_pb2.CreateVolumeRequest(
                name=name or f"vol-{self.count}",
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capabilities=[mount_cap()],
            ),
            timeout=60,
        ).volume
        return str(vol.volume_id)

    def publish_context(self, volume_id: str) -> dict[str, str]:
        resp = self.client.controller.ControllerPublishVolume(
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id=volume_id, node_id=NODE_ID, volume_capability=mount_cap()
            ),
            timeout=60,
        )
        return dict(resp.publish_context)

    def staging(self, volume_id: str) -> str:
        return str(self.kubelet / "plugins" / volume_id / "globalmount")

    def target(self, volume_id: str) -> str:
        return str(self.kubelet / "pods" / volume_id / "mount")

    def stage_request(self, volume_id: str, pc: dict[str, str]) -> csi_pb2.NodeStageVolumeRequest:
        return csi_pb2.NodeStageVolumeRequest(
            volume_id=volume_id,
            staging_target_path=self.staging(volume_id),
            volume_capability=mount_cap(),
            publish_context=pc,
        )

    def unstage(self, volume_id: str) -> None:
        self.client.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(
                volume_id=volume_id, staging_target_path=self.staging(volume_id)
            ),
            timeout=60,
        )

    def publish(self, volume_id: str, pc: dict[str, str]) -> None:
        self.client.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                staging_target_path=self.staging(volume_id),
                target_path=self.target(volume_id),
                volume_capability=mount_cap(),
                publish_context=pc,
            ),
            timeout=60,
        )

    def unpublish(self, volume_id: str) -> None:
        self.client.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=self.target(volume_id)),
            timeout=60,
        )


def start_local(tmp: Path, data_dir: Path | None = None, loop: Any = None, *extra: str) -> Local:
    data = data_dir or tmp / "data"
    (tmp / "kubelet").mkdir(exist_ok=True)
    config, _ = parse_args(
        [
            "--endpoint", f"unix://{tmp}/csi.sock",
            "--data-dir", str(data),
            "--kubelet-dir", str(tmp / "kubelet"),
            "--node-id", NODE_ID,
            *extra,
        ]
    )  # fmt: skip
    backend = FlakyBackend.open(str(data), node_id=NODE_ID, loop=loop)
    backend.faults = {}
    driver = Driver(config, backend=backend)
    driver.start()
    return Local(tmp=tmp, data_dir=data, backend=backend, driver=driver, client=connect(f"{tmp}/csi.sock"))
