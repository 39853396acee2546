"""Named failpoints: documented fault injection for crash tests (docs/recovery.md lists every name).

A failpoint is a named step in a mutating operation. `hit(name)` does nothing unless the environment
variable BALLAST_FAILPOINTS names it when the process starts:

    BALLAST_FAILPOINTS="local.create.file-written"       kill the process the first time the step runs
    BALLAST_FAILPOINTS="migrate.pv.deleted@3"             ... the third time it runs
    BALLAST_FAILPOINTS="a,b@2"                            several points, each with its own count

The only action is SIGKILL of the process itself: the point of a failpoint is to prove that every step
survives a crash exactly there. Before dying, the process appends the name to the file named by
BALLAST_FAILPOINTS_RECORD (when set) and fsyncs it, so a test can assert where the kill landed.

This module lives in shim (the bottom of the tree: it imports nothing from csi or grpc) so the driver and
the migration controller share one mechanism.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "BALLAST_FAILPOINTS"
RECORD_ENV = "BALLAST_FAILPOINTS_RECORD"

_lock = threading.Lock()
_armed: dict[str, int] | None = None  # name -> hits left before the kill; parsed on first use


class FailpointSpecError(ValueError):
    """BALLAST_FAILPOINTS is malformed; the message names the bad entry."""


def parse(spec: str) -> dict[str, int]:
    """`"a,b@2"` -> {"a": 1, "b": 2}. Raises FailpointSpecError on an empty name or a count below 1."""
    armed: dict[str, int] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, _, count = entry.partition("@")
        name = name.strip()
        if not name:
            raise FailpointSpecError(f"{ENV}: entry {entry!r} has no failpoint name")
        try:
            hits = int(count) if count else 1
        except ValueError:
            raise FailpointSpecError(f"{ENV}: count in {entry!r} is not a whole number") from None
        if hits < 1:
            raise FailpointSpecError(f"{ENV}: count in {entry!r} must be 1 or more")
        armed[name] = hits
    return armed


def _load() -> dict[str, int]:
    global _armed
    if _armed is None:
        _armed = parse(os.environ.get(ENV, ""))
    return _armed


def validate_environment() -> None:
    """Parse BALLAST_FAILPOINTS now, so a malformed value stops start-up instead of a later step."""
    with _lock:
        _load()


def enabled() -> bool:
    """True when any failpoint is armed in this process."""
    with _lock:
        return bool(_load())


def hit(name: str) -> None:
    """Kill this process here when `name` is armed and its count is reached; otherwise return at once."""
    if _armed is not None and not _armed:
        return  # the common case: nothing armed, no lock taken
    with _lock:
        armed = _load()
        left = armed.get(name)
        if left is None:
            return
        if left > 1:
            armed[name] = left - 1
            return
        _record(name)
        os.kill(os.getpid(), signal.SIGKILL)


def _record(name: str) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{name} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
