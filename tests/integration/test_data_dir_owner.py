"""The chart's split layout on one host, started in either order: the data dir belongs to an unprivileged
user (nobody, as the chart's init container leaves it for controller.runAsUser), the controller runs as
that user and the node plugin as root. The init container does not run again when a container restarts,
so whatever the node plugin creates there must be the data dir's owner's from the start: otherwise a
controller started after it fails with "Permission denied" on volumes/ or state.db, at every restart.

Checked with the real driver processes: each one starts and serves (the controller a CreateVolume, the
node NodeGetInfo), and while it runs and after it stops, every entry of the data dir -- the
subdirectories, state.db with its -wal and -shm files, owner.lock, freeze.sock, volume files -- is the
data dir owner's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from csi._proto import csi_pb2
from tests.conformance.driver import NOBODY, Driver, as_user, start_driver
from tests.conftest import require_root
from tests.csiclient import client

pytestmark = [pytest.mark.root]
MiB = 1024**2
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)


@dataclass
class Host:
    """A data dir owned by nobody, and the driver processes started on it (all stopped by the fixture)."""

    base: Path
    data: Path
    started: list[Driver] = field(default_factory=list)

    def start(self, role: str) -> Driver:
        """The controller as nobody (setpriv drops root before the driver starts), the node as root."""
        wrapper = as_user() if role == "controller" else []
        driver = start_driver(self.base / role, "--mode", role, data_dir=self.data, wrapper=wrapper)
        self.started.append(driver)
        return driver


@pytest.fixture
def host() -> Iterator[Host]:
    require_root()
    as_user()  # skips (or fails in CI) before anything is made when setpriv is missing
    base = Path(tempfile.mkdtemp(prefix="ballast-owner-"))  # short: unix socket paths are limited
    h = Host(base, base / "data")
    try:
        os.chmod(base, 0o755)  # nobody must reach its own directories inside
        for mine in ("data", "controller"):
            (base / mine).mkdir(mode=0o700)
            os.chown(base / mine, NOBODY, NOBODY)
        yield h
    finally:
        for driver in h.started:
            driver.kill()
        shutil.rmtree(base, ignore_errors=True)


def not_the_owners(data: Path) -> list[str]:
    """Entries of `data` (itself included) that do not belong to nobody:nogroup, with their owners."""
    found = []
    for parent, dirs, files in os.walk(data):
        for name in [".", *dirs, *files] if parent == str(data) else [*dirs, *files]:
            st = os.lstat(os.path.join(parent, name))
            if (st.st_uid, st.st_gid) != (NOBODY, NOBODY):
                found.append(f"{os.path.relpath(os.path.join(parent, name), data)} ({st.st_uid}:{st.st_gid})")
    return found


def serve(driver: Driver, role: str, step: int) -> set[str]:
    """One call the role must answer; returns the names then in the data dir (besides volume files)."""
    with client(driver.endpoint) as c:
        if role == "controller":
            c.controller.CreateVolume(
                csi_pb2.CreateVolumeRequest(
                    name=f"owner-{step}",
                    capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
                    volume_capabilities=[MOUNT],
                ),
                timeout=30,
            )
        else:
            assert c.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=30).node_id
    return set(os.listdir(driver.data_dir))


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(("node", "controller"), id="node-first-then-the-controller"),
        pytest.param(
            ("controller", "node", "controller"), id="controller-first-then-the-node-then-a-restart"
        ),
    ],
)
def test_each_process_starts_whichever_made_the_data_dir(host: Host, order: tuple[str, ...]) -> None:
    seen: set[str] = set()
    for step, role in enumerate(order):
        driver = host.start(role)
        seen |= serve(driver, role, step)
        assert not not_the_owners(host.data), f"{role} running: {not_the_owners(host.data)}"
        driver.stop()
        assert driver.proc.returncode == 0, driver.log.read_text()[-4000:]
        assert not not_the_owners(host.data), f"{role} stopped: {not_the_owners(host.data)}"
    assert {"volumes", "snapshots", "state.db", "state.db-wal", "state.db-shm", "owner.lock"} <= seen
    assert "freeze.sock" in seen  # the node plugin serves the controller's freezes
    volumes = os.listdir(host.data / "volumes")
    assert len(volumes) == order.count("controller"), volumes
