"""Running one program to its end with a deadline, its output captured.

`subprocess.run(timeout=...)` reads the output until both pipes close, then waits for the exit by
polling with sleeps that start at 1 ms (CPython's Popen.wait with a timeout). A program has closed its
pipes a moment before it has exited, so the first poll usually misses and every run paid a millisecond
of sleep (mkfs inside NodeStageVolume included). Here the exit is awaited on a pidfd (Linux 5.3) in the
same select() as the pipes, so the run returns as soon as the program has exited; where pidfds are
unavailable it falls back to subprocess.run.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence


def run(argv: Sequence[str], timeout: float | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `argv` (no shell, stdin /dev/null; output decoded as UTF-8, any
    undecodable byte replaced). Not finished within `timeout` seconds -> killed, reaped, and
    subprocess.TimeoutExpired raised."""
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        try:
            try:
                pidfd = os.pidfd_open(proc.pid)
            except OSError:  # no pidfds here (ENOSYS) or no descriptor left: the standard library's way
                out, err = proc.communicate(timeout=timeout)
                return proc.returncode, _text(out), _text(err)
            try:
                out, err = _collect(proc, pidfd, None if timeout is None else time.monotonic() + timeout)
            finally:
                os.close(pidfd)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout or 0.0) from None
        return proc.wait(), _text(out), _text(err)


def _collect(proc: subprocess.Popen[bytes], pidfd: int, deadline: float | None) -> tuple[bytes, bytes]:
    """The program's stdout and stderr, once both are closed and it has exited (its pidfd readable)."""
    assert proc.stdout is not None and proc.stderr is not None
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    with selectors.DefaultSelector() as selector:
        for fd in (*chunks, pidfd):
            selector.register(fd, selectors.EVENT_READ)
        waiting = len(chunks) + 1
        while waiting:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536) if key.fd != pidfd else b""
                if data:
                    chunks[key.fd].append(data)
                else:  # end of a pipe, or the exit
                    selector.unregister(key.fd)
                    waiting -= 1
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
