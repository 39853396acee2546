"""The real `ballast-csi` process on a real unix socket: identity answers, socket hygiene, signals."""

from __future__ import annotations

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
