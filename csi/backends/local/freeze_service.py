"""Group-snapshot freezes across the chart's split layout: the controller (non-root, without the kubelet's
mounts) asks the node plugin (root, which staged the volumes) over `<data-dir>/freeze.sock`.

The protocol is one JSON line each way, on one connection per hold:

    controller -> {"freeze": ["lv-...", ...]}
    node       -> {"frozen": [...], "unfrozen": {"lv-...": "why"}}      (or {"error": "..."})
    controller -> "thaw"                                                (after copying)
    node       -> {"thawed": true, "held": true}

The freeze lives as long as the connection: the node thaws when the controller says so, when the
connection drops (a killed controller), or after `hold_limit` seconds (then `held` is false and the
controller fails the snapshot). A killed node plugin thaws at its next start (quiesce.thaw_staged).
The socket is the data dir owner's alone (mode 0600), like the rest of the data dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from csi.backends.local import ownership
from csi.backends.local.layout import Layout
from csi.backends.local.quiesce import LocalQuiescer, Quiesced
from csi.failures import DriverError, FailedPreconditionError

log = logging.getLogger("ballast.local")
HOLD_LIMIT = 60.0  # seconds a node keeps members frozen for one request
MAX_LINE = 64 * 1024


def _send(conn: socket.socket, message: Any) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _receive(stream: Any) -> Any:
    line = stream.readline(MAX_LINE)
    if not line:
        raise ConnectionError("the peer closed the connection")
    return json.loads(line)


class FreezeServer:
    """The node plugin's side: freezes members for a controller in another process."""

    def __init__(self, layout: Layout, quiescer: LocalQuiescer, hold_limit: float = HOLD_LIMIT) -> None:
        self._layout = layout
        self._quiescer = quiescer
        self._hold_limit = hold_limit
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen on the data dir's freeze socket (replacing a stale one), mode 0600; a root process
        hands it to the data dir's owner (ownership.py)."""
        path = self._layout.freeze_socket
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        ownership.hand_over(path, self._layout.data_dir)
        listener.listen(8)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="freeze-service", daemon=True)
        self._thread.start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._layout.freeze_socket)

    def _accept(self) -> None:
        while self._listener is not None:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="freeze-hold", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            try:
                conn.settimeout(10.0)
                ids = _receive(stream)["freeze"]
                volumes = {str(v): self._layout.volume_file(str(v)) for v in ids}
                with self._quiescer.hold(volumes) as report:
                    _send(conn, {"frozen": report.frozen, "unfrozen": report.unfrozen})
                    conn.settimeout(self._hold_limit)
                    held = self._wait_for_thaw(stream)
                _send(conn, {"thawed": True, "held": held})
            except (OSError, ValueError, KeyError, TypeError, DriverError) as exc:
                log.warning("freeze request failed: %s", exc)
                with contextlib.suppress(OSError):
                    _send(conn, {"error": str(exc)})

    def _wait_for_thaw(self, stream: Any) -> bool:
        """True when the controller asked for the thaw within the limit."""
        try:
            return bool(_receive(stream) == "thaw")
        except TimeoutError:
            log.warning(
                "a snapshot or clone held its volumes frozen for %.0f s; thawed them", self._hold_limit
            )
            return False
        except ConnectionError:
            log.warning(
                "the controller went away while the volumes of its snapshot or clone were frozen; thawed them"
            )
            return False


class RemoteQuiescer:
    """The controller's side: asks the node plugin serving `layout`'s freeze socket."""

    def __init__(self, layout: Layout, loop: Any = None) -> None:
        self._layout = layout
        self._loop = loop

    def _in_use(self, volumes: Mapping[str, str]) -> list[str]:
        if self._loop is None:
            from csi import loop

            self._loop = loop
        return [v for v, path in volumes.items() if self._loop.backed_by(path)]

    @contextlib.contextmanager
    def hold(self, volumes: Mapping[str, str]) -> Iterator[Quiesced]:
        """Hold through the node plugin. No node plugin answering: members in use through a loop device
        are reported unfrozen (nothing here can freeze them); idle ones need no hold."""
        path = self._layout.freeze_socket
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(HOLD_LIMIT + 10.0)  # a freeze flushes the filesystem first, which takes a while
        try:
            conn.connect(path)
        except OSError as exc:
            conn.close()
            why = f"the node plugin's freeze service at {path} is not answering ({exc.strerror or exc})"
            yield Quiesced(unfrozen={v: why for v in self._in_use(volumes)})
            return
        with conn, conn.makefile("rb") as stream:
            _send(conn, {"freeze": list(volumes)})
            reply = _receive(stream)
            if "error" in reply:
                raise FailedPreconditionError(
                    f"the node plugin could not freeze the volumes: {reply['error']}"
                )
            try:
                yield Quiesced(frozen=list(reply["frozen"]), unfrozen=dict(reply["unfrozen"]))
            except BaseException:
                with contextlib.suppress(OSError, ValueError):  # the failure that got us here matters more
                    _send(conn, "thaw")
                    _receive(stream)
                raise
            _send(conn, "thaw")
            if not _receive(stream).get("held"):
                raise FailedPreconditionError(
                    f"the node plugin thawed the volumes before the copies were done (they may take at most "
                    f"{HOLD_LIMIT:.0f} s); the copy would not be one instant: retry, or see docs/install.md"
                )
