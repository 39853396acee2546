"""SIGKILL the real driver (its whole process group, as a container kill does) right after a request is
sent, at each step of a volume's life, restart it, retry the request, and check the end state.

Where the kill lands depends on timing; the assertions do not: whatever state the kill left, after the
restart and the retry the operation is done exactly once, state and disk agree, nothing is leaked and
the data written before is intact.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conformance.driver import NODE_ID
from tests.conftest import require_tool
from tests.csiclient import CsiClient, connect
from tests.reliability.conftest import MiB, Proc, assert_consistent, mount_cap, read_state, retry

pytestmark = [pytest.mark.root, pytest.mark.slow]
DELAYS = [pytest.param(0.001, id="at-once"), pytest.param(0.01, id="10ms"), pytest.param(0.05, id="50ms")]


@dataclass
class World:
    """What a scenario made, for the request, the checks and the final teardown."""

    proc: Proc
    client: CsiClient
    volumes: dict[str, str] = field(default_factory=dict)  # label -> id
    digests: dict[str, str] = field(default_factory=dict)  # label -> digest of its first 8 MiB
    staged: dict[str, str] = field(default_factory=dict)  # id -> staging path
    published: dict[str, str] = field(default_factory=dict)  # id -> target path
    pc: dict[str, dict[str, str]] = field(default_factory=dict)
    fs: str = "ext4"
    size: int = 64 * MiB

    @property
    def data(self) -> Path:
        return self.proc.data_dir

    def file(self, volume_id: str) -> Path:
        return self.data / "volumes" / f"{volume_id}.img"

    def staging(self, volume_id: str) -> str:
        return str(self.proc.workdir / "stg" / volume_id)

    def target(self, volume_id: str) -> str:
        return str(self.proc.workdir / "pods" / volume_id / "mount")


def digest(path: Path | str, size: int = 8 * MiB) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


# ---------------------------------------------------------------------------- requests


def create_req(name: str, size: int = 64 * MiB, source: str = "") -> csi_pb2.CreateVolumeRequest:
    req = csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap()],
    )
    if source:
        req.volume_content_source.volume.volume_id = source
    return req


def stage_req(w: World, vid: str) -> csi_pb2.NodeStageVolumeRequest:
    return csi_pb2.NodeStageVolumeRequest(
        volume_id=vid,
        staging_target_path=w.staging(vid),
        volume_capability=mount_cap(w.fs),
        publish_context=w.pc[vid],
    )


def publish_req(w: World, vid: str) -> csi_pb2.NodePublishVolumeRequest:
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=vid,
        staging_target_path=w.staging(vid),
        target_path=w.target(vid),
        volume_capability=mount_cap(w.fs),
        publish_context=w.pc[vid],
    )


def volume(w: World, label: str, *, data: bool = False) -> str:
    vid = str(retry(w.client.controller.CreateVolume, create_req(label, w.size)).volume.volume_id)
    w.volumes[label] = vid
    if data:
        with open(w.file(vid), "r+b") as f:
            f.write(os.urandom(8 * MiB))
            os.fsync(f.fileno())
        w.digests[label] = digest(w.file(vid))
    return vid


def attached(w: World, label: str) -> str:
    vid = volume(w, label)
    resp = retry(
        w.client.controller.ControllerPublishVolume,
        csi_pb2.ControllerPublishVolumeRequest(volume_id=vid, node_id=NODE_ID, volume_capability=mount_cap()),
    )
    w.pc[vid] = dict(resp.publish_context)
    return vid


def stage(w: World, vid: str) -> None:
    retry(w.client.node.NodeStageVolume, stage_req(w, vid))
    w.staged[vid] = w.staging(vid)


def publish(w: World, vid: str) -> None:
    retry(w.client.node.NodePublishVolume, publish_req(w, vid))
    w.published[vid] = w.target(vid)


def unpublish(w: World, vid: str) -> None:
    retry(
        w.client.node.NodeUnpublishVolume,
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=w.target(vid)),
    )
    w.published.pop(vid, None)


def unstage(w: World, vid: str) -> None:
    retry(
        w.client.node.NodeUnstageVolume,
        csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=w.staging(vid)),
    )
    w.staged.pop(vid, None)


def with_files(w: World, label: str) -> str:
    """An attached volume with an ext4 filesystem holding one file of random data, unstaged again."""
    vid = attached(w, label)
    stage(w, vid)
    publish(w, vid)
    payload = os.urandom(2 * MiB)
    with open(Path(w.target(vid)) / "data.bin", "wb") as f:
        f.write(payload)
        os.fsync(f.fileno())
    w.digests[label] = hashlib.sha256(payload).hexdigest()
    unpublish(w, vid)
    unstage(w, vid)
    return vid


def file_digest_at(w: World, vid: str, label: str) -> None:
    got = hashlib.sha256((Path(w.target(vid)) / "data.bin").read_bytes()).hexdigest()
    assert got == w.digests[label], "data written before the kill changed"


# ---------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    prepare: Callable[[World], Any]
    request: Callable[[World], tuple[str, str, Any]]  # (service, method, request)
    check: Callable[[World], None]


def _create_check(w: World) -> None:
    st = assert_consistent(w.data)
    assert "k-new" in st.names and len(st.volume_rows) == 1


def _clone_check(w: World) -> None:
    st = assert_consistent(w.data)
    clone = st.names["k-clone"]
    assert digest(w.file(clone)) == w.digests["src"] == digest(w.file(w.volumes["src"]))
    assert len(st.volume_rows) == 2


def _snapshot_check(w: World) -> None:
    st = assert_consistent(w.data)
    snaps = w.client.controller.ListSnapshots(
        csi_pb2.ListSnapshotsRequest(source_volume_id=w.volumes["src"]), timeout=30
    ).entries
    assert len(snaps) == 1 == len(st.snapshot_rows), "exactly one snapshot per name"
    snap = snaps[0].snapshot.snapshot_id
    assert digest(w.data / "snapshots" / f"{snap}.img") == w.digests["src"]


def _cpublish_check(w: World) -> None:
    vid = w.volumes["v"]
    got = w.client.controller.ControllerGetVolume(
        csi_pb2.ControllerGetVolumeRequest(volume_id=vid), timeout=30
    )
    assert list(got.status.published_node_ids) == [NODE_ID]
    assert_consistent(w.data)


def _staged_check(w: World) -> None:
    vid = w.volumes["v"]
    mount = Mounter().mount_at(w.staging(vid))
    assert mount is not None and mount.fs_type == "ext4"
    w.staged[vid] = w.staging(vid)
    publish(w, vid)
    if "v" in w.digests:
        file_digest_at(w, vid, "v")
    assert_consistent(w.data)


def _published_check(w: World) -> None:
    vid = w.volumes["v"]
    w.published[vid] = w.target(vid)
    file_digest_at(w, vid, "v")
    assert Mounter().mount_at(w.target(vid)) is not None


def _expand_check(w: World) -> None:
    vid = w.volumes["v"]
    st = assert_consistent(w.data)
    assert st.volume_rows[vid] == 128 * MiB and st.volume_files[vid] == 128 * MiB
    stage(w, vid)  # an unmounted ext4 volume grows offline at stage
    publish(w, vid)
    file_digest_at(w, vid, "v")
    assert os.statvfs(w.target(vid)).f_blocks * os.statvfs(w.target(vid)).f_frsize > 100 * MiB


def _prepare_node_expand(w: World) -> None:
    """xfs (it grows online with CAP_SYS_ADMIN alone; online ext4 growth also needs CAP_SYS_RESOURCE),
    staged and published, then grown on the controller side."""
    require_tool("mkfs.xfs")
    require_tool("xfs_growfs")
    w.fs, w.size = "xfs", 320 * MiB  # mkfs.xfs refuses filesystems under 300 MiB
    vid = with_files(w, "v")
    stage(w, vid)
    publish(w, vid)
    retry(
        w.client.controller.ControllerExpandVolume,
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=csi_pb2.CapacityRange(required_bytes=512 * MiB)
        ),
    )


def _node_expand_check(w: World) -> None:
    vid = w.volumes["v"]
    st = os.statvfs(w.target(vid))
    assert st.f_blocks * st.f_frsize > 400 * MiB, "the filesystem did not grow (it held ~256 MiB)"
    file_digest_at(w, vid, "v")
    assert_consistent(w.data)


def _delete_check(w: World) -> None:
    st = assert_consistent(w.data)
    assert w.volumes["v"] not in st.volume_rows
    w.volumes.pop("v")


SCENARIOS = {
    "create": Scenario(
        lambda w: None, lambda w: ("controller", "CreateVolume", create_req("k-new")), _create_check
    ),
    "clone": Scenario(
        lambda w: volume(w, "src", data=True),
        lambda w: ("controller", "CreateVolume", create_req("k-clone", source=w.volumes["src"])),
        _clone_check,
    ),
    "snapshot": Scenario(
        lambda w: volume(w, "src", data=True),
        lambda w: (
            "controller",
            "CreateSnapshot",
            csi_pb2.CreateSnapshotRequest(name="k-snap", source_volume_id=w.volumes["src"]),
        ),
        _snapshot_check,
    ),
    "controller-publish": Scenario(
        lambda w: volume(w, "v"),
        lambda w: (
            "controller",
            "ControllerPublishVolume",
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id=w.volumes["v"], node_id=NODE_ID, volume_capability=mount_cap()
            ),
        ),
        _cpublish_check,
    ),
    "stage-format": Scenario(
        lambda w: attached(w, "v"),
        lambda w: ("node", "NodeStageVolume", stage_req(w, w.volumes["v"])),
        _staged_check,
    ),
    "stage-existing": Scenario(
        lambda w: with_files(w, "v"),
        lambda w: ("node", "NodeStageVolume", stage_req(w, w.volumes["v"])),
        _staged_check,
    ),
    "publish": Scenario(
        lambda w: stage(w, with_files(w, "v")),
        lambda w: ("node", "NodePublishVolume", publish_req(w, w.volumes["v"])),
        _published_check,
    ),
    "expand": Scenario(
        lambda w: with_files(w, "v"),
        lambda w: (
            "controller",
            "ControllerExpandVolume",
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id=w.volumes["v"], capacity_range=csi_pb2.CapacityRange(required_bytes=128 * MiB)
            ),
        ),
        _expand_check,
    ),
    "node-expand": Scenario(
        _prepare_node_expand,
        lambda w: (
            "node",
            "NodeExpandVolume",
            csi_pb2.NodeExpandVolumeRequest(
                volume_id=w.volumes["v"],
                volume_path=w.target(w.volumes["v"]),
                capacity_range=csi_pb2.CapacityRange(required_bytes=512 * MiB),
            ),
        ),
        _node_expand_check,
    ),
    "delete": Scenario(
        lambda w: volume(w, "v", data=True),
        lambda w: ("controller", "DeleteVolume", csi_pb2.DeleteVolumeRequest(volume_id=w.volumes["v"])),
        _delete_check,
    ),
}


def teardown(w: World) -> None:
    """Take everything down through the API; the data dir must end empty."""
    for vid in list(w.published):
        unpublish(w, vid)
    for vid in list(w.staged):
        unstage(w, vid)
    c = w.client.controller
    for e in c.ListSnapshots(csi_pb2.ListSnapshotsRequest(), timeout=30).entries:
        retry(c.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=e.snapshot.snapshot_id))
    for e in c.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=30).entries:
        vid = e.volume.volume_id
        retry(c.ControllerUnpublishVolume, csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid))
        retry(c.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=vid))
    st = read_state(w.data)
    assert st.volume_files == st.snapshot_files == {} == st.volume_rows == st.snapshot_rows


@pytest.mark.parametrize("delay", DELAYS)
@pytest.mark.parametrize("step", list(SCENARIOS))
def test_sigkill_then_restart_and_retry_finishes_the_step(proc: Proc, step: str, delay: float) -> None:
    scenario = SCENARIOS[step]
    proc.start()
    w = World(proc=proc, client=connect(proc.current.endpoint))  # type: ignore[union-attr]
    try:
        scenario.prepare(w)
        service, method, request = scenario.request(w)
        future = getattr(getattr(w.client, service), method).future(request, timeout=60)
        time.sleep(delay)
        proc.kill()
        with contextlib.suppress(grpc.RpcError):  # cut off by the kill, or done just before it: both fine
            future.result()
        w.client.close()

        proc.start()
        w.client = connect(proc.current.endpoint)  # type: ignore[union-attr]
        call = getattr(getattr(w.client, service), method)
        retry(call, request)
        retry(call, request)  # the retry is idempotent too
        scenario.check(w)
        teardown(w)
    finally:
        w.client.close()
        proc.stop()
