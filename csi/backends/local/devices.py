"""The node side of the local backend: a volume's loop device, attached over its backing file.

`resolve` attaches (or reuses) a loop device, refreshes its size when the file grew, and proves the
device maps that file (the same inode) before returning it; `prepared` does the same for a device
already bound, binding nothing; `release` detaches every loop device over the file. The device last
proved for a file is remembered and proved again (one ioctl) before it is used, so these need no scan of
every loop device on the node, which grows with the node's volumes and runs for each stats call. `users`
names the devices bound over the file's path, or over a file unlinked from it while bound (a volume
deleted while staged); reading sysfs, it needs no privilege. Those, `leftovers` and `release` also
count a file a delete set aside (`<file>.deleting`, files.doomed), perhaps unlinked since. `unused`
keeps any loop device from being bound over a file while a delete sets it aside. The loop module is
injectable (csi.loop by default, imported on first use) so unit tests need no root.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

from csi import keys
from csi.backends.local import files
from csi.failures import BusyError, FailedPreconditionError

SET_ASIDE = (files.DOOMED,)  # a backing file a delete renamed: still the volume's until it is removed


class LoopDevices:
    def __init__(self, loop: ModuleType | Any = None) -> None:
        self._loop = loop
        self._known: dict[str, str] = {}  # backing file -> the device last proved to map it

    def _remembered(self, loop: Any, path: str) -> str | None:
        """The device remembered for `path` while it still maps the file there, else None (forgotten)."""
        device = self._known.get(path)
        if device is not None and loop.maps(device, path):
            return device
        self._known.pop(path, None)
        return None

    def _module(self) -> Any:
        if self._loop is None:
            from csi import loop

            self._loop = loop
        return self._loop

    def resolve(self, volume_id: str, path: str, size: int, publish_context: Mapping[str, str]) -> str:
        """The verified loop device of the volume whose backing file is `path` and size `size`."""
        expected = publish_context.get(keys.PC_VOLUME_FILE)
        if expected and expected != path and os.path.realpath(expected) != os.path.realpath(path):
            raise FailedPreconditionError(
                f"publish context names {expected!r}, but volume {volume_id} lives in {path}"
            )
        if files.size_of(path) is None:
            raise FailedPreconditionError(f"the backing file of {volume_id} is missing")
        loop = self._module()
        device = self._remembered(loop, path) or self._proved(loop, volume_id, loop.attach(path), path)
        return self._sized(loop, device, size)

    def prepared(self, volume_id: str, path: str, size: int) -> str | None:
        """The loop device already bound over `path` (refreshed to `size`, verified), or None. Binds
        nothing."""
        loop = self._module()
        device = self._remembered(loop, path)
        if device is None:
            found: str | None = loop.bound(path)
            if found is None:
                return None
            device = self._proved(loop, volume_id, found, path)
        return self._sized(loop, device, size)

    def _proved(self, loop: Any, volume_id: str, device: str, path: str) -> str:
        """`device`, remembered for `path` once it is shown to map the file there."""
        if not loop.maps(device, path):
            backing = loop.backing_file(device)
            raise FailedPreconditionError(f"loop device {device} maps {backing!r}, not volume {volume_id}")
        self._known[path] = device
        return device

    @staticmethod
    def _sized(loop: Any, device: str, size: int) -> str:
        if loop.device_size(device) < size:
            loop.refresh_capacity(device)
        return device

    def users(self, path: str, fd: int | None = None) -> list[str]:
        """Loop devices bound over the file at `path`, or over a file since unlinked from it, by the name
        the kernel gives their backing file; binds nothing. A file there that nobody holds open has none:
        no device is over it, and none over an earlier file at its path (volume ids are never reused).
        `fd`: the caller's own open file there, which does not count as holding it."""
        loop = self._module()
        free = loop.unheld(path) if fd is None else loop.unopened(fd)
        return [] if free else list(loop.backed_by(path, unlinked=True, renamed=SET_ASIDE))

    @contextlib.contextmanager
    def unused(self, volume_id: str, path: str) -> Iterator[None]:
        """Run the block while no loop device is over the volume's file at `path` (`users`) and none can
        be bound to it: an exclusive flock of the file, which csi.loop.attach, binding under a shared one
        (kept by the device it binds), waits for in any process of the host. A device over it ->
        FailedPreconditionError (still staged on this node); an attach about to bind one -> BusyError.
        No file there: none is locked."""
        with _exclusive(path) as (fd, locked):
            users = self.users(path, fd if locked else None)
            if users:
                raise FailedPreconditionError(
                    f"the file of volume {volume_id} is still in use by {', '.join(users)}: the volume is "
                    "still staged on the node; unstage it there (NodeUnstageVolume), then delete it"
                )
            if not locked:
                raise BusyError(
                    f"volume {volume_id} is being attached on this host (NodeStageVolume) right now; "
                    "retry the delete once that is over"
                )
            yield

    def leftovers(self, path: str) -> list[str]:
        """Loop devices bound over the file at `path`, or over a file since unlinked from it (replaced
        behind the driver's back), whether or not anything holds the file there now; binds nothing."""
        return list(self._module().backed_by(path, unlinked=True, renamed=SET_ASIDE))

    def release(self, path: str) -> None:
        """Detach every loop device over `path`, or over a file since unlinked from it. Idempotent. The
        remembered device goes first; when that leaves the file unheld no other device is over it (the
        file there is the one it mapped). Otherwise the loop devices are scanned."""
        loop = self._module()
        device = self._known.pop(path, None)
        if device is not None and loop.detach(device, path) and loop.unheld(path):
            return None
        loop.detach_file(path, unlinked=True, renamed=SET_ASIDE)


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[tuple[int | None, bool]]:
    """An fd on the file at `path` (None when no file is there) and whether it holds an exclusive flock,
    for the block: not when another fd holds a flock on it (an attach, or the device it bound)."""
    fd = None
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    if fd is None:
        yield None, True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield fd, False
        else:
            yield fd, True
    finally:
        os.close(fd)
