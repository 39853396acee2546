"""Volume health as this node sees it (NodeGetVolumeHealth), grpc-free, beside the staging core.

What is checked, in order:
1. the device: the backend's `prepared_device` (no side effects). A device that cannot be proven to be the
   volume is INACCESSIBLE (DeviceUnverified).
2. the paths the CO names: a publish path with nothing mounted is INACCESSIBLE (NotPublished); a staging
   or publish path showing another device is INACCESSIBLE (WrongDevice), or (DeviceLost) when no device
   holds the volume any more, e.g. its loop device was detached or its backing file replaced.
3. no device, no path: a volume this process staged or published is INACCESSIBLE (DeviceLost); one it
   knows nothing of is not on this node -> NotFoundError.
4. the filesystems on the device mounted under the allowed roots: csi.fshealth (kernel error counters,
   xfs sickness or shutdown, read-only remounts).

Spec: the CO MAY call this for a volume that is not staged or published when it recently tried to; the
paths are where it staged/published or tried to. Nothing here writes to the host.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from csi import devices, fshealth, paths
from csi.backends.base import Backend
from csi.failures import FailedPreconditionError, NotFoundError
from csi.health import Issue, Status, distinct
from csi.mount import Mounter, MountInfo
from csi.staging import Stager


def _shows(mount: MountInfo, device: str) -> bool:
    """True when `mount` is the device's filesystem or a bind of its device node."""
    if devices.belongs((mount.major, mount.minor), device):
        return True
    if mount.fs_type == "devtmpfs":  # a block publish: the device node bound from /dev
        node = os.path.join("/dev", mount.root.lstrip("/"))
        return devices.is_block_device(node) and devices.belongs(devices.rdev(node), device)
    return False


def _lost(volume_id: str, where: str) -> Issue:
    return Issue(
        Status.INACCESSIBLE,
        "DeviceLost",
        f"volume {volume_id} is in use {where}, but no device on this node holds it any more (its loop "
        "device was detached, or its backing file replaced); unpublish and unstage it, then stage it again",
    )


class NodeHealth:
    def __init__(self, backend: Backend, mounter: Mounter, roots: Sequence[str], stager: Stager) -> None:
        self._backend = backend
        self._mounter = mounter
        self._roots = roots
        self._stager = stager

    def volume(self, volume_id: str, staging: str = "", publish: str = "") -> tuple[Issue, ...]:
        """The volume's issues on this node; paths already validated (empty: not given)."""
        try:
            device = self._backend.prepared_device(volume_id)
        except FailedPreconditionError as exc:
            return (Issue(Status.INACCESSIBLE, "DeviceUnverified", str(exc)),)
        mounts = self._mounter.mounts()
        issues = list(self._paths(volume_id, device, mounts, staging, publish))
        if device is None:
            if not issues and not self._stager.knows(volume_id):
                raise NotFoundError(
                    f"volume {volume_id} is not on this node: no device holds it, and it was not staged "
                    "or published here"
                )
            return distinct(issues or [_lost(volume_id, "on this node")])
        return distinct([*issues, *self._filesystems(device, mounts)])

    def _paths(
        self, volume_id: str, device: str | None, mounts: list[MountInfo], staging: str, publish: str
    ) -> Iterator[Issue]:
        for path, required in ((staging, False), (publish, True)):
            if not path:
                continue
            mount = _top(mounts, path)
            if mount is None:
                if required:
                    yield Issue(
                        Status.INACCESSIBLE,
                        "NotPublished",
                        f"nothing is mounted at {path}, where volume {volume_id} should be published; "
                        "the workload there sees an empty directory: publish the volume again",
                    )
            elif device is None:
                yield _lost(volume_id, f"at {path}")
            elif not _shows(mount, device):
                yield Issue(
                    Status.INACCESSIBLE,
                    "WrongDevice",
                    f"{path} shows {mount.source}, not {device}, which holds volume {volume_id}; "
                    "unpublish and unstage it there, then stage and publish it again",
                )

    def _filesystems(self, device: str, mounts: list[MountInfo]) -> Iterator[Issue]:
        """Issues of each filesystem of the device mounted under the allowed roots (once each)."""
        seen: set[tuple[int, int]] = set()
        members = devices.family(device)
        for m in mounts:
            numbers = (m.major, m.minor)
            if numbers in seen or m.fs_type == "devtmpfs" or numbers not in members:
                continue
            if not paths.under_roots(m.mount_point, self._roots):
                continue
            seen.add(numbers)
            yield from fshealth.filesystem_issues(numbers, m.mount_point, fshealth.forced_readonly(m))
        if not seen and devices.is_block_device(device):  # block access: the sysfs counters still speak
            yield from fshealth.filesystem_issues(devices.rdev(device), None)


def _top(mounts: list[MountInfo], path: str) -> MountInfo | None:
    """The mount visible at `path` (the last one stacked there)."""
    found = [m for m in mounts if m.mount_point == os.path.normpath(path)]
    return found[-1] if found else None
