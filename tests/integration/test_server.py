"""The real `ballast-csi` process on a real unix socket: identity answers, socket hygiene, signals."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2
from csi.config import parse_args, version
from csi.server import Driver
from tests.csiclient import assert_code, client
from tests.fakes import FAKE_NODE, FakeBackend

BIN = Path(sys.executable).parent / "ballast-csi"


def _start(tmp_path: Path, *extra: str, umask: int = 0o022) -> subprocess.Popen[bytes]:
    sock = tmp_path / "t.sock"
    proc = subprocess.Popen(
        [str(BIN), "--endpoint", f"unix://{sock}", "--data-dir", str(tmp_path / "d"), *extra],
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.umask(umask),
    )
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"driver did not start: {proc.communicate()[1].decode()}")
        time.sleep(0.02)
    return proc


def _run(sock: Path, data_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One driver run that is expected to stop by itself (a refused start)."""
    return subprocess.run(
        [str(BIN), "--endpoint", f"unix://{sock}", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def driver_proc(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = _start(tmp_path, umask=0)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_identity_over_real_socket(driver_proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    with client(str(tmp_path / "t.sock")) as c:
        info = c.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
        assert info.name == "local.csi.ballast.dev"
        assert info.vendor_version == version() != "0.0.0+unknown"
        caps = c.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
        services = {cap.service.type for cap in caps.capabilities if cap.HasField("service")}
        Service = csi_pb2.PluginCapability.Service
        assert Service.CONTROLLER_SERVICE in services
        assert Service.VOLUME_ACCESSIBILITY_CONSTRAINTS in services
        assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True


def test_socket_is_0660_even_with_umask_0(driver_proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    mode = os.stat(tmp_path / "t.sock").st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660


def test_sigterm_exits_0_and_removes_socket(driver_proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    driver_proc.send_signal(signal.SIGTERM)
    assert driver_proc.wait(timeout=30) == 0
    assert not (tmp_path / "t.sock").exists()


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "t.sock"))
    stale.close()  # the file stays behind, as after a crash
    proc = _start(tmp_path)
    try:
        with client(str(tmp_path / "t.sock")) as c:
            assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def test_refuses_a_socket_another_driver_serves(driver_proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    second_data = tmp_path / "second"
    done = _run(tmp_path / "t.sock", second_data)
    assert done.returncode != 0
    assert "another process is serving" in done.stderr
    assert not second_data.exists()  # refused before the backend touched anything
    with client(str(tmp_path / "t.sock")) as c:
        assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value


def test_a_second_controller_on_the_same_data_dir_exits(
    driver_proc: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    done = _run(tmp_path / "other.sock", tmp_path / "d")
    assert done.returncode == 1
    assert f"data dir {tmp_path / 'd'} is in use by ballast-csi controller" in done.stderr
    assert not (tmp_path / "other.sock").exists()
    with client(str(tmp_path / "t.sock")) as c:
        assert c.identity.Probe(csi_pb2.ProbeRequest()).ready.value


def test_refuses_to_replace_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "t.sock").write_text("precious")
    done = _run(tmp_path / "t.sock", tmp_path / "d")
    assert done.returncode != 0
    assert "not a socket" in done.stderr
    assert (tmp_path / "t.sock").read_text() == "precious"


def test_a_metrics_address_in_use_stops_the_start_in_one_line_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _run(tmp_path / "t.sock", tmp_path / "d", env={"BALLAST_METRICS_ADDRESS": f"127.0.0.1:{port}"})
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"ballast-csi: --metrics-address 127.0.0.1:{port}: Address already in use"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "t.sock").exists(), "no gRPC socket is left behind"


@pytest.mark.parametrize("spec", ["@2", "local.create.recorded@0", "a,b@x"])
def test_a_malformed_failpoint_setting_stops_the_start(tmp_path: Path, spec: str) -> None:
    """BALLAST_FAILPOINTS is parsed at start-up, so a typo stops the driver before it serves (instead of
    failing the first operation that reaches a step, or never firing)."""
    done = _run(tmp_path / "t.sock", tmp_path / "d", env={"BALLAST_FAILPOINTS": spec})
    assert done.returncode == 1
    assert "BALLAST_FAILPOINTS" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "t.sock").exists() and not (tmp_path / "d").exists()


def test_node_mode_serves_no_controller(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--mode", "node", "--node-id", "n1")
    try:
        with client(str(tmp_path / "t.sock")) as c:
            assert_code(
                c.controller.ControllerGetCapabilities,
                csi_pb2.ControllerGetCapabilitiesRequest(),
                grpc.StatusCode.UNIMPLEMENTED,
            )
            assert c.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == "n1"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_stop_drains_in_flight_calls(tmp_path: Path) -> None:
    class Slow(FakeBackend):
        def probe(self) -> bool:
            time.sleep(1.0)
            return True

    config, _ = parse_args(["--endpoint", f"unix://{tmp_path}/s.sock", "--node-id", FAKE_NODE])
    driver = Driver(config, backend=Slow())
    driver.start()
    results: list[bool] = []
    with client(str(tmp_path / "s.sock")) as c:
        t = threading.Thread(
            target=lambda: results.append(c.identity.Probe(csi_pb2.ProbeRequest()).ready.value)
        )
        t.start()
        time.sleep(0.3)
        driver.stop(grace=10)
        t.join(timeout=10)
    assert results == [True], "the call in flight when stop() began completed successfully"
    assert not (tmp_path / "s.sock").exists()


class _Hung(FakeBackend):
    """A Probe whose handler runs on, past the grace, until `release` is set; `close` notes whether that
    handler had returned by then."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.closed_after_return: bool | None = None

    def probe(self) -> bool:
        self.release.wait(30)
        self.returned.set()
        return True

    def close(self) -> None:
        self.closed_after_return = self.returned.is_set()
        super().close()


def _probe_in_background(sock: Path) -> threading.Thread:
    def call() -> None:
        with client(str(sock)) as c, contextlib.suppress(grpc.RpcError):
            c.identity.Probe(csi_pb2.ProbeRequest(), timeout=30)

    t = threading.Thread(target=call)
    t.start()
    return t


@pytest.mark.parametrize(
    ("returns_after", "settle", "released"),
    [
        pytest.param(1.0, 10.0, True, id="handler-returns-after-the-grace-then-release"),
        pytest.param(None, 0.5, False, id="handler-stuck-past-the-settle-time-keeps-the-backend"),
    ],
)
def test_stop_waits_for_handlers_past_the_grace_before_releasing_the_backend(
    tmp_path: Path, returns_after: float | None, settle: float, released: bool
) -> None:
    """gRPC cancels calls at the end of the grace but their handlers run on; the backend (the data dir
    lock with it) is closed only once they have returned, or not at all (the process must end)."""
    backend = _Hung()
    config, _ = parse_args(["--endpoint", f"unix://{tmp_path}/s.sock", "--node-id", FAKE_NODE])
    driver = Driver(config, backend=backend)
    driver.start()
    caller = _probe_in_background(tmp_path / "s.sock")
    try:
        time.sleep(0.3)
        if returns_after is not None:
            threading.Timer(returns_after, backend.release.set).start()
        assert driver.stop(grace=0.2, settle=settle) is released
        assert backend.closed is released
        if released:
            assert backend.closed_after_return, "the backend closed while a handler still ran"
            assert not (tmp_path / "s.sock").exists()
    finally:
        backend.release.set()
        caller.join(timeout=10)


HUNG_DRIVER = """
import subprocess, sys
from csi import server
from csi.config import parse_args
from tests.integration.test_server import _Hung

class Formatting(_Hung):
    def probe(self):
        child = subprocess.Popen(["sleep", "60"])  # the program a stuck call waits for, an mkfs say
        open("%(pid)s", "w").write(str(child.pid))
        return super().probe()

server.GRACE_SECONDS, server.SETTLE_SECONDS = 0.2, 0.5
server.build_backend = lambda config: Formatting()
sys.exit(server.run(parse_args(["--endpoint", "unix://%(sock)s", "--node-id", "n"])[0]))
"""


def test_a_handler_stuck_past_the_grace_ends_the_process(tmp_path: Path) -> None:
    """Exit 1 at once rather than a normal exit, which would wait for the stuck handler's thread; the
    program that handler runs is ended too."""
    sock, pid_file = tmp_path / "s.sock", tmp_path / "child.pid"
    script = HUNG_DRIVER % {"sock": sock, "pid": pid_file}
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        caller = _probe_in_background(sock)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    caller.join(timeout=10)
    assert proc.returncode == 1, err
    assert "calls still running" in err and "the process's end releases the data dir" in err
    assert "stopped" not in err.splitlines()[-1]
    child = int(pid_file.read_text())
    for _ in range(100):
        if _ended(child):
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the stuck call's program outlived the driver")


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
