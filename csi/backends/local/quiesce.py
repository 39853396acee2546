"""Holding writes to a group snapshot's members while their files are copied, so the copies are one
crash-consistent instant.

A member is written through its loop device, by the filesystem staged on it or, for block access, by
whoever opened the device published into a pod. `LocalQuiescer.hold` freezes (FIFREEZE) every writable
filesystem staged on a member's loop device, yields, and thaws them all again, on every path out,
through descriptors it keeps open meanwhile (so an unstage racing the hold fails with "busy" instead
of unmounting a frozen filesystem, which would strand it frozen with its loop device); it
needs CAP_SYS_ADMIN and the node's mount table, so it runs in the process that stages volumes (all mode,
or the node plugin; csi.backends.local.freeze_service lets a controller elsewhere ask that process).
A member it cannot hold -- published as a raw block device, whose writes no freeze stops -- is reported
in `Quiesced.unfrozen` with the reason, and the caller decides.

`thaw_staged` thaws every staged filesystem of the data dir that a killed process left frozen; a driver
that stages volumes calls it when it starts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from csi import devices, freeze
from csi.failures import DriverError, FailedPreconditionError
from csi.mount import Mounter, MountInfo

log = logging.getLogger("ballast.local")


@dataclass
class Quiesced:
    """What a hold achieved: members whose filesystems are frozen, and members whose writes are not
    held, with the reason. Members in neither list have nothing writing to them (not staged, or staged
    read-only)."""

    frozen: list[str] = field(default_factory=list)
    unfrozen: dict[str, str] = field(default_factory=dict)


class Quiescer(Protocol):
    def hold(self, volumes: Mapping[str, str]) -> contextlib.AbstractContextManager[Quiesced]:
        """Hold the writes to `volumes` (id -> backing file) for the duration of the context."""
        ...


class LocalQuiescer:
    """Freezes the staged filesystems of member volumes in this process (needs CAP_SYS_ADMIN)."""

    def __init__(self, mounter: Mounter | None = None, loop: Any = None) -> None:
        self._mounter = mounter or Mounter()
        self._loop = loop

    def _loop_module(self) -> Any:
        if self._loop is None:
            from csi import loop

            self._loop = loop
        return self._loop

    def _points(self, volume_id: str, path: str, mounts: list[MountInfo]) -> tuple[list[str], str]:
        """(one mount point per writable filesystem on the volume's loop device, why its writes cannot be
        held or "")."""
        device = self._loop_module().bound(path)
        if device is None:
            return [], ""  # not staged here: nothing writes through it
        node = "/" + os.path.basename(device)
        raw = [m for m in mounts if m.fs_type == "devtmpfs" and devices.names_node(m.root, node)]
        if raw:
            return [], (
                f"volume {volume_id} is published as a raw block device at {raw[0].mount_point}; "
                "writes to a block device cannot be frozen"
            )
        points: dict[tuple[int, int], str] = {}
        members = devices.family(device)
        for m in mounts:
            if not m.readonly and (m.major, m.minor) in members:
                points.setdefault((m.major, m.minor), m.mount_point)  # one per filesystem
        return list(points.values()), ""

    @contextlib.contextmanager
    def hold(self, volumes: Mapping[str, str]) -> Iterator[Quiesced]:
        """Freeze every writable staged filesystem of `volumes` (id -> backing file); thaw them all when
        the context ends, however it ends. A freeze that fails thaws what was frozen and raises."""
        report, frozen = Quiesced(), []  # frozen: the holds (descriptors) to thaw
        mounts = self._mounter.mounts()
        try:
            for volume_id, path in volumes.items():
                points, why = self._points(volume_id, path, mounts)
                if why:
                    report.unfrozen[volume_id] = why
                for point in points:
                    frozen.append(_freeze(point, volume_id))
                if points:
                    report.frozen.append(volume_id)
            yield report
        finally:
            _thaw_all(frozen)


def _freeze(point: str, volume_id: str) -> int:
    try:
        return freeze.freeze(point)
    except freeze.FreezeError as exc:
        hint = " (already frozen by someone else?)" if exc.errno == errno.EBUSY else ""
        raise FailedPreconditionError(f"volume {volume_id}: {exc.strerror}{hint}") from exc


def _thaw_all(holds: list[int]) -> None:
    """Thaw each hold (in reverse); try every one, then raise the first failure."""
    failures = []
    for fd in reversed(holds):
        try:
            freeze.thaw_held(fd)
        except freeze.FreezeError as exc:
            failures.append(exc)
    if failures:
        raise DriverError(f"{failures[0].strerror}; thaw it with `fsfreeze --unfreeze`") from failures[0]


def thaw_staged(volumes_dir: str, mounter: Mounter, loop: Any) -> list[str]:
    """Thaw every filesystem staged on a loop device over a file in `volumes_dir` that is frozen (a
    process killed while it held a group snapshot's members). Returns the mount points it thawed."""
    thawed = []
    members: set[tuple[int, int]] = set()
    for device in loop.backed_under(volumes_dir):
        members |= devices.family(device)
    seen: set[tuple[int, int]] = set()
    for m in mounter.mounts():
        numbers = (m.major, m.minor)
        if numbers in seen or numbers not in members:
            continue
        seen.add(numbers)
        try:
            was_frozen = freeze.thaw(m.mount_point)
        except freeze.FreezeError as exc:  # e.g. no CAP_SYS_ADMIN: say so, and go on starting
            log.warning("could not check %s for a left-over freeze: %s", m.mount_point, exc)
            continue
        if was_frozen:
            log.warning("thawed %s: a previous driver process was killed while it was frozen", m.mount_point)
            thawed.append(m.mount_point)
    return thawed
