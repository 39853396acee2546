"""Child processes of the test bed: each in its own process group, its output in a log file.

`Processes` owns every process it started and stops them all (SIGTERM to the group, SIGKILL after a
grace period) in reverse start order; stopping is idempotent and never raises, so it is safe in
finalizers after a failed test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry when it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Process:
    """One started child: its argv, its log and its process group."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 4000) -> str:
        """The end of the process's log (for failure messages)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole group, SIGKILL it after `grace` seconds; idempotent, never raises."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        # The leader may be gone while children it forked linger in the group: kill what is left.
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, as far as the process can tell)."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@dataclass
class Processes:
    """The processes one owner (a cluster, a deployment) started; `stop_all` ends every one of them."""

    log_dir: Path
    started: list[Process] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Process:
        """Start `argv` in a new session (its own process group); output goes to <log_dir>/<name>.log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
            )
        started = Process(name=name, argv=list(argv), proc=proc, log=log)
        self.started.append(started)
        return started

    def stop(self, process: Process, grace: float = 10.0) -> None:
        process.stop(grace)
        if process in self.started:
            self.started.remove(process)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop everything started here, newest first; never raises."""
        while self.started:
            self.started.pop().stop(grace)


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.1,
    diagnose: Callable[[], str] = lambda: "",
) -> None:
    """Poll `condition` until true; on timeout raise AssertionError naming `what` (and `diagnose()`)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() >= deadline:
            detail = diagnose()
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{detail}" if detail else "")
            )
        time.sleep(interval)
