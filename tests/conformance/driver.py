"""The real `ballast-csi` as a subprocess on a unix socket, for conformance, integration and crash tests.

`start_driver` returns once Probe answers; `running_driver` stops it (SIGTERM, then SIGKILL) on exit,
so no process outlives a test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.common import removed
from csi._proto import csi_pb2, csi_pb2_grpc
from tests.conftest import REPO, require_tool

DRIVER = REPO / ".venv" / "bin" / "ballast-csi"
NODE_ID = "sanity-node"
NOBODY = 65534  # uid and gid of nobody/nogroup: an unprivileged user for drivers that must not be root


def as_user(uid: int = NOBODY, gid: int = NOBODY) -> list[str]:
    """A `wrapper` for start_driver that drops root to `uid`/`gid`, with no supplementary groups, before
    the driver starts (setpriv; a missing setpriv skips the test, or fails it in CI)."""
    return [require_tool("setpriv"), f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


@dataclass
class Driver:
    """A running `ballast-csi` process."""

    proc: subprocess.Popen[bytes]
    endpoint: str  # unix:///...
    socket: Path
    data_dir: Path
    log: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def files(self, kind: str, timeout: float = 10) -> list[str]:
        """The sorted names in the data dir's `kind` directory ("volumes", "snapshots") once the driver
        has removed the files of the deletes it answered (benchmarks.common.removed)."""
        removed(self.data_dir / kind, timeout=timeout)
        return sorted(os.listdir(self.data_dir / kind))


def _wait_ready(driver: Driver, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.proc.poll() is not None:
            raise RuntimeError(
                f"driver exited with {driver.proc.returncode}:\n{driver.log.read_text()[-4000:]}"
            )
        if driver.socket.exists():
            with grpc.insecure_channel(driver.endpoint) as ch:
                try:
                    resp = csi_pb2_grpc.IdentityStub(ch).Probe(csi_pb2.ProbeRequest(), timeout=2)
                    if not resp.HasField("ready") or resp.ready.value:
                        return
                except grpc.RpcError:
                    pass
        time.sleep(0.05)
    raise RuntimeError(f"driver not ready after {timeout}s:\n{driver.log.read_text()[-4000:]}")


def start_driver(
    workdir: Path,
    *extra_args: str,
    data_dir: Path | None = None,
    node_id: str = NODE_ID,
    timeout: float = 30,
    env: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> Driver:
    """Start `ballast-csi` on `<workdir>/csi.sock` with the local backend in `<workdir>/data` (or
    `data_dir`), staging/target paths allowed under `workdir`, with `env` added to this process's
    environment, run by `wrapper` when given (e.g. strace and its options). Returns once Probe answers
    ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "csi.sock"
    data = data_dir or workdir / "data"
    log = workdir / "driver.log"
    argv = [
        *wrapper,
        str(DRIVER),
        "--endpoint", f"unix://{sock}",
        "--data-dir", str(data),
        "--node-id", node_id,
        f"--allowed-path-prefix={workdir}",
        *extra_args,
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    driver = Driver(proc=proc, endpoint=f"unix://{sock}", socket=sock, data_dir=data, log=log)
    try:
        _wait_ready(driver, timeout)
    except BaseException:
        driver.kill()
        raise
    return driver


@contextlib.contextmanager
def running_driver(
    workdir: Path, *extra_args: str, data_dir: Path | None = None, node_id: str = NODE_ID
) -> Iterator[Driver]:
    driver = start_driver(workdir, *extra_args, data_dir=data_dir, node_id=node_id)
    try:
        yield driver
    finally:
        driver.stop()
