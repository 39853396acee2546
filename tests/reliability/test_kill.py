"""Kill the real driver exactly at each named crash point of each mutating RPC (shim/failpoints.py,
docs/recovery.md), restart it, retry the request, and check the end state.

Every driver failpoint has a scenario (a test fails when one is missing). For each: the request is sent
to a driver with that one point armed; the process must die there (SIGKILL, and the record file names the
point and the pid). A fresh driver then answers the retried request, twice, and the operation is done
exactly once: state and disk agree, no loop device or mount is left after the teardown, and data written
before the kill is intact.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import freeze
from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conformance.driver import NODE_ID
from tests.conftest import require_tool
from tests.csiclient import CsiClient, connect
from tests.failpoint_names import in_code
from tests.reliability.conftest import MiB, Proc, assert_consistent, loops_over, mount_cap, read_state, retry

pytestmark = [pytest.mark.root, pytest.mark.slow]


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


def create_req(
    name: str, size: int = 64 * MiB, source: str = "", snapshot: str = ""
) -> csi_pb2.CreateVolumeRequest:
    req = csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap()],
    )
    if source:
        req.volume_content_source.volume.volume_id = source
    if snapshot:
        req.volume_content_source.snapshot.snapshot_id = snapshot
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


def publish_ro_req(w: World, vid: str, cap: csi_pb2.VolumeCapability | None = None) -> Any:
    """A read-only NodePublishVolume; `cap` (block) replaces the mount capability."""
    req = publish_req(w, vid)
    req.readonly = True
    if cap is not None:
        req.volume_capability.CopyFrom(cap)
    return req


def unpublish_req(w: World, vid: str) -> csi_pb2.NodeUnpublishVolumeRequest:
    return csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=w.target(vid))


def unstage_req(w: World, vid: str) -> csi_pb2.NodeUnstageVolumeRequest:
    return csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=w.staging(vid))


def unpublish(w: World, vid: str) -> None:
    retry(w.client.node.NodeUnpublishVolume, unpublish_req(w, vid))
    w.published.pop(vid, None)


def unstage(w: World, vid: str) -> None:
    retry(w.client.node.NodeUnstageVolume, unstage_req(w, vid))
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


def _one_volume_named(name: str, count: int = 1) -> Callable[[World], None]:
    def check(w: World) -> None:
        st = assert_consistent(w.data)
        assert name in st.names, f"volume {name} missing after the retry"
        assert len(st.volume_rows) == count, f"{len(st.volume_rows)} volumes, expected {count}"

    return check


def _copy_check(name: str) -> Callable[[World], None]:
    """A clone or restore holds exactly the source's data, and nothing else was made."""

    def check(w: World) -> None:
        _one_volume_named(name, count=2)(w)
        copy = read_state(w.data).names[name]
        assert digest(w.file(copy)) == w.digests["src"] == digest(w.file(w.volumes["src"]))

    return check


def _snapshot_check(w: World) -> None:
    st = assert_consistent(w.data)
    snaps = w.client.controller.ListSnapshots(
        csi_pb2.ListSnapshotsRequest(source_volume_id=w.volumes["src"]), timeout=30
    ).entries
    assert len(snaps) == 1 == len(st.snapshot_rows), "exactly one snapshot per name"
    snap = snaps[0].snapshot.snapshot_id
    assert digest(w.data / "snapshots" / f"{snap}.img") == w.digests["src"]


def _with_snapshot(w: World) -> None:
    volume(w, "src", data=True)
    snap = retry(
        w.client.controller.CreateSnapshot,
        csi_pb2.CreateSnapshotRequest(name="k-base", source_volume_id=w.volumes["src"]),
    ).snapshot
    w.volumes["snap"] = snap.snapshot_id


def _published_nodes(w: World) -> list[str]:
    got = w.client.controller.ControllerGetVolume(
        csi_pb2.ControllerGetVolumeRequest(volume_id=w.volumes["v"]), timeout=30
    )
    return list(got.status.published_node_ids)


def _cpublish_check(w: World) -> None:
    assert _published_nodes(w) == [NODE_ID]
    assert_consistent(w.data)


def _cunpublish_check(w: World) -> None:
    assert _published_nodes(w) == []
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


def write_refused(path: str, block: bool) -> int:
    """The errno of a write through a published target (0: the write went through)."""
    try:
        if block:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"written after the kill")
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            Path(path, "written-after-the-kill").write_bytes(b"x")
    except OSError as exc:
        return exc.errno or -1
    return 0


def _published_ro_check(w: World) -> None:
    """The retry of a read-only publish killed before its bind was attached: mounted read-only."""
    _published_check(w)
    mount = Mounter().mount_at(w.target(w.volumes["v"]))
    assert mount is not None and mount.readonly, "the read-only publish is writable"
    assert write_refused(w.target(w.volumes["v"]), block=False) == errno.EROFS


def _unpublished_check(w: World) -> None:
    vid = w.volumes["v"]
    assert Mounter().mount_at(w.target(vid)) is None and not os.path.lexists(w.target(vid))
    w.published.pop(vid, None)


def _unstaged_check(w: World) -> None:
    vid = w.volumes["v"]
    assert Mounter().mount_at(w.staging(vid)) is None
    assert loops_over(w.data) == [], "the unstage left the loop device bound"
    w.staged.pop(vid, None)


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
    assert w.volumes["v"] not in st.volume_rows and w.volumes["v"] not in st.volume_files
    kept = sorted(p.name for p in (w.data / "orphans").rglob("*") if p.is_file())
    assert kept == [], f"a deleted volume's data was kept: {kept}"
    w.volumes.pop("v")


def _staged_with_files(w: World) -> None:
    stage(w, with_files(w, "v"))


def _published_with_files(w: World) -> None:
    vid = with_files(w, "v")
    stage(w, vid)
    publish(w, vid)


def _create(w: World) -> tuple[str, str, Any]:
    return "controller", "CreateVolume", create_req("k-new")


def _clone(w: World) -> tuple[str, str, Any]:
    return "controller", "CreateVolume", create_req("k-copy", source=w.volumes["src"])


def _restore(w: World) -> tuple[str, str, Any]:
    return "controller", "CreateVolume", create_req("k-copy", snapshot=w.volumes["snap"])


def _snapshot(w: World) -> tuple[str, str, Any]:
    req = csi_pb2.CreateSnapshotRequest(name="k-snap", source_volume_id=w.volumes["src"])
    return "controller", "CreateSnapshot", req


def _cpublish(w: World) -> tuple[str, str, Any]:
    req = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=w.volumes["v"], node_id=NODE_ID, volume_capability=mount_cap()
    )
    return "controller", "ControllerPublishVolume", req


def _cunpublish(w: World) -> tuple[str, str, Any]:
    req = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=w.volumes["v"], node_id=NODE_ID)
    return "controller", "ControllerUnpublishVolume", req


def _expand(w: World) -> tuple[str, str, Any]:
    req = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=w.volumes["v"], capacity_range=csi_pb2.CapacityRange(required_bytes=128 * MiB)
    )
    return "controller", "ControllerExpandVolume", req


def _delete(w: World) -> tuple[str, str, Any]:
    return "controller", "DeleteVolume", csi_pb2.DeleteVolumeRequest(volume_id=w.volumes["v"])


def _stage(w: World) -> tuple[str, str, Any]:
    return "node", "NodeStageVolume", stage_req(w, w.volumes["v"])


def _unstage(w: World) -> tuple[str, str, Any]:
    return "node", "NodeUnstageVolume", unstage_req(w, w.volumes["v"])


def _publish(w: World) -> tuple[str, str, Any]:
    return "node", "NodePublishVolume", publish_req(w, w.volumes["v"])


def _publish_ro(w: World) -> tuple[str, str, Any]:
    return "node", "NodePublishVolume", publish_ro_req(w, w.volumes["v"])


def _unpublish(w: World) -> tuple[str, str, Any]:
    return "node", "NodeUnpublishVolume", unpublish_req(w, w.volumes["v"])


def _node_expand(w: World) -> tuple[str, str, Any]:
    vid = w.volumes["v"]
    req = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vid,
        volume_path=w.target(vid),
        capacity_range=csi_pb2.CapacityRange(required_bytes=512 * MiB),
    )
    return "node", "NodeExpandVolume", req


def _source(w: World) -> None:
    volume(w, "src", data=True)


def _blank(w: World) -> None:
    volume(w, "v")


def _attached_blank(w: World) -> None:
    attached(w, "v")


def _with_data(w: World) -> None:
    volume(w, "v", data=True)


def _two_published(w: World) -> None:
    """Two volumes with data, staged and published: a group snapshot must freeze both."""
    for label in ("a", "b"):
        vid = with_files(w, label)
        stage(w, vid)
        publish(w, vid)
        w.volumes.setdefault("v", vid)


def _group(w: World) -> tuple[str, str, Any]:
    req = csi_pb2.CreateVolumeGroupSnapshotRequest(
        name="k-group", source_volume_ids=[w.volumes["a"], w.volumes["b"]]
    )
    return "group", "CreateVolumeGroupSnapshot", req


def _group_check(w: World) -> None:
    """One group of two members, each the copy of its volume; the filesystems are thawed (a killed
    driver left them frozen; the restarted one thawed them)."""
    st = assert_consistent(w.data)
    groups = set()
    for label in ("a", "b"):
        vid = w.volumes[label]
        snaps = w.client.controller.ListSnapshots(
            csi_pb2.ListSnapshotsRequest(source_volume_id=vid), timeout=30
        ).entries
        assert len(snaps) == 1, f"{len(snaps)} snapshots of {label}"
        groups.add(snaps[0].snapshot.group_snapshot_id)
        assert not frozen(w.target(vid)), f"{w.target(vid)} was left frozen"
        file_digest_at(w, vid, label)
    assert len(groups) == 1 and "" not in groups and len(st.snapshot_rows) == 2


def frozen(path: str) -> bool:
    """True when the filesystem at `path` was frozen (it is thawed now: the caller fails anyway)."""
    return freeze.thaw(path)


GROUP = Scenario(_two_published, _group, _group_check)
CREATE = Scenario(lambda w: None, _create, _one_volume_named("k-new"))
CLONE = Scenario(_source, _clone, _copy_check("k-copy"))
RESTORE = Scenario(_with_snapshot, _restore, _copy_check("k-copy"))
SNAPSHOT = Scenario(_source, _snapshot, _snapshot_check)
EXPAND = Scenario(lambda w: with_files(w, "v"), _expand, _expand_check)
DELETE = Scenario(_with_data, _delete, _delete_check)
STAGE_BLANK = Scenario(_attached_blank, _stage, _staged_check)
STAGE_EXISTING = Scenario(lambda w: with_files(w, "v"), _stage, _staged_check)
PUBLISH = Scenario(_staged_with_files, _publish, _published_check)

SCENARIOS: dict[str, Scenario] = {
    "local.create.file-written": CREATE,
    "local.create.recorded": CREATE,
    "local.clone.file-written": CLONE,
    "local.clone.recorded": CLONE,
    "local.restore.file-written": RESTORE,
    "local.restore.recorded": RESTORE,
    "local.snapshot.file-written": SNAPSHOT,
    "local.snapshot.recorded": SNAPSHOT,
    "local.group-snapshot.frozen": GROUP,
    "local.group-snapshot.member-copied": GROUP,
    "local.group-snapshot.recorded": GROUP,
    "local.attach.recorded": Scenario(_blank, _cpublish, _cpublish_check),
    "local.detach.recorded": Scenario(_attached_blank, _cunpublish, _cunpublish_check),
    "local.expand.recorded": EXPAND,
    "local.expand.grown": EXPAND,
    "local.delete.recorded": DELETE,
    "local.delete.removed": DELETE,
    "node.stage.device-ready": STAGE_BLANK,
    "node.stage.formatted": STAGE_BLANK,
    "node.stage.checked": STAGE_EXISTING,
    "node.stage.mounted": STAGE_EXISTING,
    "node.unstage.unmounted": Scenario(_staged_with_files, _unstage, _unstaged_check),
    "node.publish.target-created": PUBLISH,
    "node.publish.bound": PUBLISH,
    "node.publish.flagged": Scenario(_staged_with_files, _publish_ro, _published_ro_check),
    "node.unpublish.unmounted": Scenario(_published_with_files, _unpublish, _unpublished_check),
    "node.expand.grown": Scenario(_prepare_node_expand, _node_expand, _node_expand_check),
}


def teardown(w: World) -> None:
    """Take everything down through the API; the data dir must end empty and no loop device stay."""
    for vid in list(w.published):
        unpublish(w, vid)
    for vid in list(w.staged):
        unstage(w, vid)
    c = w.client.controller
    for e in c.ListSnapshots(csi_pb2.ListSnapshotsRequest(), timeout=30).entries:
        group = e.snapshot.group_snapshot_id
        if group:
            request = csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group)
            retry(w.client.group.DeleteVolumeGroupSnapshot, request)
        else:
            retry(c.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=e.snapshot.snapshot_id))
    for e in c.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=30).entries:
        vid = e.volume.volume_id
        retry(c.ControllerUnpublishVolume, csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid))
        retry(c.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=vid))
    st = read_state(w.data)
    assert st.volume_files == st.snapshot_files == {} == st.volume_rows == st.snapshot_rows
    assert loops_over(w.data) == []


def test_every_driver_failpoint_has_a_kill_scenario() -> None:
    named = {n for n in in_code() if n.startswith(("local.", "node."))}
    assert named == set(SCENARIOS), (
        f"failpoints without a scenario: {sorted(named - set(SCENARIOS))}; "
        f"scenarios for no failpoint: {sorted(set(SCENARIOS) - named)}"
    )


def killed_at(proc: Proc, w: World, step: str, service: str, method: str, request: Any) -> None:
    """Send `request` to a driver with `step` armed; it must die exactly there."""
    proc.record.unlink(missing_ok=True)
    driver = proc.start(failpoint=step)
    w.client = connect(driver.endpoint)
    with pytest.raises(grpc.RpcError) as cut:
        getattr(getattr(w.client, service), method)(request, timeout=120)
    w.client.close()
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value.details()
    assert driver.proc.wait(10) == -signal.SIGKILL, "the driver did not die of the failpoint's SIGKILL"
    assert proc.record.read_text().split() == [step, str(driver.proc.pid)], "it died somewhere else"


@pytest.mark.parametrize("step", list(SCENARIOS))
def test_killed_at_a_step_then_restarted_the_retry_finishes_it_exactly_once(proc: Proc, step: str) -> None:
    scenario = SCENARIOS[step]
    proc.start()
    w = World(proc=proc, client=connect(proc.current.endpoint))  # type: ignore[union-attr]
    try:
        scenario.prepare(w)
        service, method, request = scenario.request(w)
        w.client.close()
        killed_at(proc, w, step, service, method, request)

        w.client = connect(proc.start().endpoint)
        call = getattr(getattr(w.client, service), method)
        retry(call, request)
        retry(call, request)  # the retry is idempotent too
        scenario.check(w)
        teardown(w)
    finally:
        w.client.close()
        proc.stop()


def test_a_read_only_block_publish_killed_before_its_bind_is_attached_is_read_only_after_the_retry(
    proc: Proc,
) -> None:
    """The block twin of the `node.publish.flagged` scenario: the device node is bound read-only and
    the device refuses writes once the retry answers OK."""
    block = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )
    proc.start()
    w = World(proc=proc, client=connect(proc.current.endpoint))  # type: ignore[union-attr]
    try:
        vid = attached(w, "v")
        stage_block = stage_req(w, vid)
        stage_block.volume_capability.CopyFrom(block)
        retry(w.client.node.NodeStageVolume, stage_block)
        w.staged[vid] = w.staging(vid)
        request = publish_ro_req(w, vid, block)
        w.client.close()
        killed_at(proc, w, "node.publish.flagged", "node", "NodePublishVolume", request)

        w.client = connect(proc.start().endpoint)
        w.published[vid] = w.target(vid)
        retry(w.client.node.NodePublishVolume, request)
        retry(w.client.node.NodePublishVolume, request)
        mount = Mounter().mount_at(w.target(vid))
        assert mount is not None and mount.readonly, "the read-only publish is writable"
        assert write_refused(w.target(vid), block=True) in (errno.EROFS, errno.EPERM, errno.EACCES)
        teardown(w)
    finally:
        w.client.close()
        proc.stop()
