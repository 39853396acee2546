"""Crash-consistent group snapshots in the chart's split layout, on one host: the controller runs as a
non-root user (nobody) with no access to the kubelet dir, the node plugin as root, both on one data dir
owned by the controller's user (as the chart's init container leaves it). The controller has the node
plugin freeze the members through `<data-dir>/freeze.sock`.

Checked: writers stamping a shared sequence into two members while group snapshots are taken get one
cut in every restored member; a controller killed while the members are frozen releases them at once;
with the node plugin gone, a group snapshot of members in use is refused, saying why.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from csi import freeze
from csi._proto import csi_pb2
from tests.conformance.driver import NOBODY, NODE_ID, Driver, as_user, start_driver
from tests.conftest import require_tool
from tests.csiclient import CsiClient, assert_code, connect
from tests.integration.conftest import force_clean, leftovers
from tests.reliability.conftest import MiB, kill_group, mount_cap
from tests.reliability.test_group_freeze import assert_one_cut, fsck_clean, snapshots_under_writers, stamps

pytestmark = [pytest.mark.root, pytest.mark.slow]
Code = grpc.StatusCode


@dataclass
class Split:
    base: Path
    data: Path
    controller: Driver
    node: Driver
    c: CsiClient
    n: CsiClient

    def start_controller(self, failpoint: str = "") -> None:
        """The controller as nobody (setpriv drops root before the driver starts)."""
        kill_group(self.controller)
        self.c.close()
        self.controller = _controller(self.base, self.data, failpoint)
        self.c = connect(self.controller.endpoint)

    def stop_node(self) -> None:
        self.n.close()
        self.node.stop()

    def start_node(self) -> None:
        self.node = start_driver(self.base / "node", "--mode", "node", data_dir=self.data)
        self.n = connect(self.node.endpoint)

    def target(self, vid: str) -> str:
        return str(self.base / "node" / "pods" / vid / "mount")

    def staging(self, vid: str) -> str:
        return str(self.base / "node" / "stg" / vid)


def _controller(base: Path, data: Path, failpoint: str = "") -> Driver:
    env = {"BALLAST_FAILPOINTS": failpoint, "BALLAST_FAILPOINTS_RECORD": str(base / "controller" / "record")}
    args = ("--mode", "controller")
    return start_driver(base / "controller", *args, data_dir=data, wrapper=as_user(), env=env)


@pytest.fixture
def split(root_tools: None) -> Iterator[Split]:
    require_tool("debugfs")
    base = Path(tempfile.mkdtemp(prefix="ballast-split-"))
    started: list[Driver] = []
    split: Split | None = None
    try:  # a driver that fails to start still has its directory and the other driver cleaned up
        os.chmod(base, 0o755)  # nobody must reach its own directories inside
        for mine in ("data", "controller"):
            (base / mine).mkdir(mode=0o700)
            os.chown(base / mine, NOBODY, NOBODY)
        started.append(_controller(base, base / "data"))
        started.append(start_driver(base / "node", "--mode", "node", data_dir=base / "data"))
        controller, node = started
        split = Split(
            base, base / "data", controller, node, connect(controller.endpoint), connect(node.endpoint)
        )
        yield split
    finally:
        if split is not None:  # the drivers a test restarted replace the first ones
            split.c.close()
            split.n.close()
            started = [split.node, split.controller]
        for driver in started:
            kill_group(driver)
        mounts, loops = leftovers(base, base / "data")
        force_clean(base, base / "data")
        shutil.rmtree(base, ignore_errors=True)
        assert not mounts and not loops, f"leaked mounts {mounts} and loop devices {loops}"


def published(s: Split, name: str) -> str:
    vid = s.c.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB),
            volume_capabilities=[mount_cap()],
        ),
        timeout=60,
    ).volume.volume_id
    pc = s.c.controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=mount_cap()),
        timeout=60,
    ).publish_context
    s.n.node.NodeStageVolume(
        csi_pb2.NodeStageVolumeRequest(
            volume_id=vid,
            staging_target_path=s.staging(vid),
            volume_capability=mount_cap(),
            publish_context=pc,
        ),
        timeout=60,
    )
    s.n.node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=vid,
            staging_target_path=s.staging(vid),
            target_path=s.target(vid),
            volume_capability=mount_cap(),
            publish_context=pc,
        ),
        timeout=60,
    )
    return str(vid)


def take_down(s: Split, ids: list[str]) -> None:
    for vid in ids:
        s.n.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=s.target(vid)), timeout=60
        )
        s.n.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=s.staging(vid)), timeout=60
        )


def writable(path: str, timeout: float = 10.0) -> bool:
    """True when a synced write under `path` completes within `timeout` (a frozen filesystem holds it;
    then it is thawed here, so the test fails without leaving it frozen)."""
    done = threading.Event()

    def write() -> None:
        probe = os.path.join(path, "probe")
        with open(probe, "wb") as f:
            f.write(b"x")
            os.fsync(f.fileno())
        os.unlink(probe)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    if done.wait(timeout):
        return True
    freeze.thaw(path)
    done.wait(timeout)
    return False


def _group(s: Split, name: str, ids: list[str]) -> csi_pb2.CreateVolumeGroupSnapshotRequest:
    return csi_pb2.CreateVolumeGroupSnapshotRequest(name=name, source_volume_ids=ids)


def test_the_node_plugin_freezes_for_a_non_root_controller(split: Split) -> None:
    uid = [
        line
        for line in Path(f"/proc/{split.controller.proc.pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    ]
    assert uid and uid[0].split()[1] == str(NOBODY), f"the controller runs as {uid}"
    ids = [published(split, f"split-{i}") for i in range(2)]
    groups, _ = snapshots_under_writers(
        [split.target(v) for v in ids],
        lambda k: split.c.group.CreateVolumeGroupSnapshot(_group(split, f"cut-{k}", ids), timeout=120),
        3,
    )
    for g in groups:
        found = {}
        for snap in g.group_snapshot.snapshots:
            image = split.data / "snapshots" / f"{snap.snapshot_id}.img"
            copy = split.base / "restored.img"
            shutil.copyfile(image, copy)
            fsck_clean(copy)
            found[snap.source_volume_id] = stamps(copy)
        assert_one_cut(found)
    assert all(writable(split.target(v)) for v in ids)
    take_down(split, ids)


def test_a_controller_killed_while_members_are_frozen_releases_them(split: Split) -> None:
    ids = [published(split, f"killed-{i}") for i in range(2)]
    split.start_controller(failpoint="local.group-snapshot.frozen")
    with pytest.raises(grpc.RpcError):
        split.c.group.CreateVolumeGroupSnapshot(_group(split, "killed", ids), timeout=60)
    assert split.controller.proc.wait(10) in (-signal.SIGKILL, signal.SIGKILL + 128)
    assert (split.base / "controller" / "record").read_text().split()[0] == "local.group-snapshot.frozen"
    assert all(writable(split.target(v)) for v in ids), "the node plugin kept the members frozen"
    split.start_controller()
    taken = split.c.group.CreateVolumeGroupSnapshot(_group(split, "killed", ids), timeout=120)
    assert len(taken.group_snapshot.snapshots) == 2
    take_down(split, ids)


def test_without_the_node_plugin_members_in_use_are_refused(split: Split) -> None:
    (vid,) = [published(split, "orphaned")]
    split.stop_node()
    message = assert_code(
        split.c.group.CreateVolumeGroupSnapshot, _group(split, "alone", [vid]), Code.FAILED_PRECONDITION
    )
    assert "not answering" in message and "best-effort" in message, message
    assert not list((split.data / "snapshots").iterdir())
    split.start_node()
    take_down(split, [vid])
