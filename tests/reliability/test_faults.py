"""Injected faults on the local backend and the node layer, with real files, loop devices and mounts.

After each fault: the RPC fails with the right code and a message saying what to do, the retry
succeeds once the fault is gone, state and disk agree (no file without its record or record without
its file, no loop device or mount left), and data written before the fault is still there.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

import csi.node
from csi._proto import csi_pb2
from csi.backends.base import DiskOptions, GiB
from csi.backends.local import LocalBackend
from csi.backends.local.files import space
from csi.backends.local.reserve import RESERVE_BYTES
from csi.mount import Mounter
from tests.csiclient import assert_code
from tests.e2e.process import wait_for
from tests.reliability.conftest import (
    MiB,
    assert_consistent,
    fill,
    fill_up,
    loops_over,
    mount_cap,
    read_state,
)
from tests.reliability.inprocess import NODE_ID, FaultRunner, Local, ScarceLoop, start_local

pytestmark = pytest.mark.root
Code = grpc.StatusCode


@pytest.fixture
def local(leak_check: Path, root_tools: None) -> Iterator[Local]:
    env = start_local(leak_check)
    yield env
    env.stop()


def write_user_data(path: str, size: int = 4 * MiB) -> str:
    """Random bytes at the start of `path`, synced; returns their digest."""
    payload = os.urandom(size)
    with open(path, "r+b") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(payload).hexdigest()


def digest_of(path: str, size: int = 4 * MiB) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(size)).hexdigest()


def volume_file(env: Local, volume_id: str) -> str:
    return str(env.data_dir / "volumes" / f"{volume_id}.img")


# ---------------------------------------------------------------------------- transient backend errors


def _create(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.controller.CreateVolume, csi_pb2.CreateVolumeRequest(
        name="flaky-create",
        capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
        volume_capabilities=[mount_cap()],
    )


def _clone(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    call, req = _create(env, ids)
    req.name = "flaky-clone"
    req.capacity_range.required_bytes = 32 * MiB
    req.volume_content_source.volume.volume_id = ids["vol"]
    return call, req


def _delete(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=ids["spare"])


def _attach(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.controller.ControllerPublishVolume, csi_pb2.ControllerPublishVolumeRequest(
        volume_id=ids["spare"], node_id=NODE_ID, volume_capability=mount_cap()
    )


def _snapshot(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.controller.CreateSnapshot, csi_pb2.CreateSnapshotRequest(
        name="flaky-snap", source_volume_id=ids["vol"]
    )


def _expand(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.controller.ControllerExpandVolume, csi_pb2.ControllerExpandVolumeRequest(
        volume_id=ids["vol"], capacity_range=csi_pb2.CapacityRange(required_bytes=48 * MiB)
    )


def _stage(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    return env.client.node.NodeStageVolume, env.stage_request(ids["vol"], env.publish_context(ids["vol"]))


def _detach(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    env.publish_context(ids["spare"])
    return env.client.controller.ControllerUnpublishVolume, csi_pb2.ControllerUnpublishVolumeRequest(
        volume_id=ids["spare"], node_id=NODE_ID
    )


def _delete_snapshot(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    snap = env.client.controller.CreateSnapshot(
        csi_pb2.CreateSnapshotRequest(name="doomed", source_volume_id=ids["spare"]), timeout=60
    ).snapshot.snapshot_id
    return env.client.controller.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=snap)


def _unstage(env: Local, ids: dict[str, str]) -> tuple[Callable[..., Any], Any]:
    env.client.node.NodeStageVolume(
        env.stage_request(ids["spare"], env.publish_context(ids["spare"])), timeout=60
    )
    return env.client.node.NodeUnstageVolume, csi_pb2.NodeUnstageVolumeRequest(
        volume_id=ids["spare"], staging_target_path=env.staging(ids["spare"])
    )


TRANSIENT = [
    pytest.param(_create, "create_volume", id="CreateVolume"),
    pytest.param(_clone, "create_volume", id="CreateVolume-clone"),
    pytest.param(_delete, "delete_volume", id="DeleteVolume"),
    pytest.param(_attach, "attach", id="ControllerPublishVolume"),
    pytest.param(_snapshot, "create_snapshot", id="CreateSnapshot"),
    pytest.param(_expand, "expand_volume", id="ControllerExpandVolume"),
    pytest.param(_stage, "resolve_device", id="NodeStageVolume"),
    pytest.param(_detach, "detach", id="ControllerUnpublishVolume"),
    pytest.param(_delete_snapshot, "delete_snapshot", id="DeleteSnapshot"),
    pytest.param(_unstage, "release_device", id="NodeUnstageVolume"),
]


@pytest.mark.parametrize(("build", "operation"), TRANSIENT)
def test_transient_backend_error_is_unavailable_and_the_retry_succeeds(
    local: Local, build: Callable[[Local, dict[str, str]], tuple[Callable[..., Any], Any]], operation: str
) -> None:
    ids = {"vol": local.create(), "spare": local.create(8 * MiB)}
    digest = write_user_data(volume_file(local, ids["vol"]))
    call, request = build(local, ids)
    before = assert_consistent(local.data_dir)

    local.backend.fail(operation)
    message = assert_code(call, request, Code.UNAVAILABLE, contains="retry")
    assert "injected" in message
    if operation != "release_device":  # unstage unmounts before it releases the device
        assert assert_consistent(local.data_dir) == before, "a failed call must change nothing"

    call(request, timeout=60)
    call(request, timeout=60)  # and the retry is idempotent
    assert_consistent(local.data_dir)
    if operation == "resolve_device":
        local.unstage(ids["vol"])  # staging formatted the (signature-less) volume: no digest to compare
    else:
        assert digest_of(volume_file(local, ids["vol"])) == digest
    assert loops_over(local.data_dir) == []


# ---------------------------------------------------------------------------- node layer


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> FaultRunner:
    """Every node command runs for real through this runner (mount too: no libc fast path)."""
    fr = FaultRunner()
    monkeypatch.setattr(csi.node, "Mounter", lambda: Mounter(runner=fr, syscalls=False))
    return fr


@pytest.fixture
def node_local(leak_check: Path, root_tools: None, runner: FaultRunner) -> Iterator[Local]:
    env = start_local(leak_check)
    yield env
    env.stop()


def _assert_not_staged(env: Local, volume_id: str) -> None:
    """A failed stage may never be retried (the kubelet gives up on a final error and never unstages),
    so it must leave neither a mount nor the loop device it attached."""
    mounted = [m.mount_point for m in Mounter().mounts() if m.mount_point.startswith(str(env.tmp) + "/")]
    assert mounted == [], f"a failed stage left mounts {mounted}"
    assert loops_over(env.data_dir) == [], "a failed stage left its loop device attached"


def test_mkfs_failure_is_reported_formats_nothing_and_the_retry_formats(
    node_local: Local, runner: FaultRunner
) -> None:
    env = node_local
    vid = env.create()
    pc = env.publish_context(vid)
    runner.fail("mkfs.ext4", "mkfs.ext4: Input/output error while writing out and closing file system")
    message = assert_code(env.client.node.NodeStageVolume, env.stage_request(vid, pc), Code.INTERNAL)
    assert "mkfs.ext4" in message and "Input/output error" in message
    _assert_not_staged(env, vid)

    mark = len(runner.calls)
    env.client.node.NodeStageVolume(env.stage_request(vid, pc), timeout=60)
    assert ("mkfs.ext4",) in [c[:1] for c in runner.calls[mark:]], "the retry formats the still-blank device"
    env.publish(vid, pc)
    Path(env.target(vid), "kept.txt").write_text("written after the retry")
    env.unpublish(vid)
    env.unstage(vid)
    assert loops_over(env.data_dir) == []


def test_mount_failure_leaves_nothing_mounted_and_loses_no_data(
    node_local: Local, runner: FaultRunner
) -> None:
    env = node_local
    vid = env.create()
    pc = env.publish_context(vid)
    env.client.node.NodeStageVolume(env.stage_request(vid, pc), timeout=60)
    env.publish(vid, pc)
    Path(env.target(vid), "precious.txt").write_text("data written before the fault")
    env.unpublish(vid)
    env.unstage(vid)

    mark = len(runner.calls)
    runner.fail("mount", "mount: /staging: wrong fs type, bad option, bad superblock on /dev/loop9")
    message = assert_code(env.client.node.NodeStageVolume, env.stage_request(vid, pc), Code.INTERNAL)
    assert "mount" in message and "bad superblock" in message
    _assert_not_staged(env, vid)
    reformatted = [c for c in runner.calls[mark:] if c[0].startswith("mkfs")]
    assert not reformatted, "a device with a filesystem was formatted again"

    env.client.node.NodeStageVolume(env.stage_request(vid, pc), timeout=60)
    env.publish(vid, pc)
    assert Path(env.target(vid), "precious.txt").read_text() == "data written before the fault"
    env.unpublish(vid)
    env.unstage(vid)
    assert loops_over(env.data_dir) == []


@pytest.fixture
def scarce(leak_check: Path, root_tools: None) -> Iterator[tuple[Local, ScarceLoop]]:
    seam = ScarceLoop()
    env = start_local(leak_check, None, seam)
    yield env, seam
    env.stop()


def test_no_free_loop_device_is_unavailable_with_advice(scarce: tuple[Local, ScarceLoop]) -> None:
    env, seam = scarce
    vid = env.create()
    pc = env.publish_context(vid)
    seam.exhausted = True
    message = assert_code(env.client.node.NodeStageVolume, env.stage_request(vid, pc), Code.UNAVAILABLE)
    assert "no free loop device" in message and "losetup -d" in message
    assert seam.attempts == 1
    _assert_not_staged(env, vid)
    assert loops_over(env.data_dir) == []

    seam.exhausted = False
    env.client.node.NodeStageVolume(env.stage_request(vid, pc), timeout=60)
    assert len(loops_over(env.data_dir)) == 1
    env.unstage(vid)
    assert loops_over(env.data_dir) == []


# ---------------------------------------------------------------------------- a full data dir


@pytest.fixture
def full(small_fs: Path) -> Iterator[Local]:
    env = start_local(small_fs.parent, small_fs / "data")
    yield env
    env.stop()


def test_full_data_dir_is_resource_exhausted_and_keeps_nothing_half_made(full: Local, small_fs: Path) -> None:
    env = full
    vid = env.create(16 * MiB, name="full-source")  # the clone must fit in what the snapshot leaves free
    digest = write_user_data(volume_file(env, vid), 16 * MiB)
    filler = fill(small_fs)
    before = assert_consistent(env.data_dir)

    snap = csi_pb2.CreateSnapshotRequest(name="full-snap", source_volume_id=vid)
    message = assert_code(env.client.controller.CreateSnapshot, snap, Code.RESOURCE_EXHAUSTED)
    assert str(env.data_dir) in message, message
    clone = csi_pb2.CreateVolumeRequest(
        name="full-clone",
        capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
        volume_capabilities=[mount_cap()],
        volume_content_source=csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=vid)
        ),
    )
    message = assert_code(env.client.controller.CreateVolume, clone, Code.RESOURCE_EXHAUSTED)
    assert str(env.data_dir) in message, message
    assert assert_consistent(env.data_dir) == before
    assert digest_of(volume_file(env, vid), 16 * MiB) == digest

    filler.unlink()
    snap_id = env.client.controller.CreateSnapshot(snap, timeout=60).snapshot.snapshot_id
    clone_id = env.client.controller.CreateVolume(clone, timeout=60).volume.volume_id
    assert digest_of(str(env.data_dir / "snapshots" / f"{snap_id}.img"), 16 * MiB) == digest
    assert digest_of(volume_file(env, clone_id), 16 * MiB) == digest
    assert digest_of(volume_file(env, vid), 16 * MiB) == digest
    assert_consistent(env.data_dir)


def test_full_state_database_is_resource_exhausted_and_leaves_no_orphan_file(
    full: Local, small_fs: Path
) -> None:
    """With not a block left, even an empty (sparse) volume is refused before its file is made (it could
    never be written), and a change only the state database records cannot be recorded."""
    env = full
    vid = env.create(8 * MiB, name="fits")
    filler, pad = fill_up(small_fs)
    before = read_state(env.data_dir)
    names = [f"cannot-fit-{i}" for i in range(3)]
    for name in names:
        message = assert_code(
            env.client.controller.CreateVolume, _create_request(name, 8 * MiB), Code.RESOURCE_EXHAUSTED
        )
        assert f"{env.data_dir}/volumes has 0 bytes free" in message, message
    refused = 0
    for iops in range(100, 103):
        modify = csi_pb2.ControllerModifyVolumeRequest(volume_id=vid, mutable_parameters={"iops": str(iops)})
        try:
            env.client.controller.ControllerModifyVolume(modify, timeout=60)
        except grpc.RpcError as err:
            assert err.code() == Code.RESOURCE_EXHAUSTED, err.details()
            assert f"{env.data_dir} is full" in (err.details() or ""), err.details()
            refused += 1
    assert refused, "the fault did not happen: every change was recorded"
    assert read_state(env.data_dir).names == before.names
    assert_consistent(env.data_dir)

    filler.unlink()
    pad.unlink()
    for name in names:
        env.client.controller.CreateVolume(_create_request(name, 8 * MiB), timeout=60)
    assert set(assert_consistent(env.data_dir).names) == {"fits", *names}


# ---------------------------------------------------------------------------- room for volumes (--capacity 0)


def _create_request(name: str, size: int) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap()],
    )


def _capacity(env: Local) -> int:
    return int(env.client.controller.GetCapacity(csi_pb2.GetCapacityRequest(), timeout=60).available_capacity)


@pytest.mark.parametrize(
    ("expand", "size", "code", "says"),
    [
        pytest.param(False, 24 * MiB, Code.RESOURCE_EXHAUSTED, "bytes free", id="create-more-than-is-free"),
        pytest.param(False, 10 * GiB, Code.OUT_OF_RANGE, "holds", id="create-more-than-the-filesystem"),
        pytest.param(True, 32 * MiB, Code.OUT_OF_RANGE, "bytes free", id="expand-adding-more-than-is-free"),
        pytest.param(True, 10 * GiB, Code.OUT_OF_RANGE, "holds", id="expand-past-the-filesystem"),
    ],
)
def test_a_volume_that_could_never_be_filled_is_refused_and_nothing_changes(
    full: Local, small_fs: Path, expand: bool, size: int, code: grpc.StatusCode, says: str
) -> None:
    """Without --capacity, volumes are thin, but what a volume adds must fit in the free space now (the
    audit's case: a 48 MiB filesystem took five 10 GiB volumes)."""
    vid = full.create(8 * MiB, name="small")
    fill(small_fs, leave=16 * MiB)
    before = assert_consistent(full.data_dir)
    if expand:
        grow = csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=csi_pb2.CapacityRange(required_bytes=size)
        )
        message = assert_code(full.client.controller.ControllerExpandVolume, grow, code, contains=says)
    else:
        message = assert_code(
            full.client.controller.CreateVolume, _create_request("big", size), code, contains=says
        )
    assert str(full.data_dir) in message, message
    assert assert_consistent(full.data_dir) == before
    assert full.backend.health.ledger.growth() == {}, "no expand is left in progress"


def test_get_capacity_is_the_largest_volume_create_takes_and_volumes_are_thin(
    full: Local, small_fs: Path
) -> None:
    """GetCapacity (what Kubernetes schedules on) and CreateVolume agree. Sparse volumes reserve nothing,
    so the next volume may be as large again, and together they promise more than the filesystem holds."""
    fill(small_fs, leave=24 * MiB)
    room = _capacity(full)
    assert room % MiB == 0 and 16 * MiB < room <= 24 * MiB
    assert_code(
        full.client.controller.CreateVolume, _create_request("over", room + MiB), Code.RESOURCE_EXHAUSTED
    )
    for name in ("first", "second", "third"):
        full.client.controller.CreateVolume(_create_request(name, room), timeout=60)
        assert _capacity(full) == room
    st = os.statvfs(small_fs)
    assert sum(assert_consistent(full.data_dir).volume_rows.values()) == 3 * room > st.f_blocks * st.f_frsize


def test_second_stage_path_for_a_staged_volume_is_failed_precondition(local: Local) -> None:
    """Found by the fuzz test: fsck of the mounted device answered INTERNAL 'found errors it cannot fix
    safely; repair it by hand' -- a false alarm about a healthy filesystem."""
    vid = local.create()
    pc = local.publish_context(vid)
    local.client.node.NodeStageVolume(local.stage_request(vid, pc), timeout=60)
    other = local.stage_request(vid, pc)
    other.staging_target_path = str(local.kubelet / "plugins" / "other" / "globalmount")
    message = assert_code(local.client.node.NodeStageVolume, other, Code.FAILED_PRECONDITION)
    assert f"already mounted at {local.staging(vid)}" in message and "unstage" in message
    assert Mounter().mount_at(other.staging_target_path) is None
    assert len(loops_over(local.data_dir)) == 1, "the device still serves the first stage"
    local.unstage(vid)
    assert loops_over(local.data_dir) == []


HUGE = [pytest.param(2**62, id="4EiB"), pytest.param(2**63 - 1, id="int64-max")]


@pytest.mark.parametrize("size", HUGE)
def test_size_past_the_largest_file_is_out_of_range_and_never_recorded(local: Local, size: int) -> None:
    """Found by the fuzz test: EFBIG answered INTERNAL, and an expand kept the impossible size in the
    state database, so the next start-up's reconciliation failed on it and the driver would not start."""
    vid = local.create(16 * MiB, name="small")
    req = csi_pb2.CreateVolumeRequest(
        name="huge",
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        volume_capabilities=[mount_cap()],
    )
    assert_code(local.client.controller.CreateVolume, req, Code.OUT_OF_RANGE)
    grow = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vid, capacity_range=csi_pb2.CapacityRange(required_bytes=size)
    )
    assert_code(local.client.controller.ControllerExpandVolume, grow, Code.OUT_OF_RANGE)
    st = assert_consistent(local.data_dir)
    assert st.volume_rows == {vid: 16 * MiB} and st.volume_files == {vid: 16 * MiB}
    local.stop()
    restarted = start_local(local.tmp)
    try:
        assert restarted.client.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value
    finally:
        restarted.stop()
    local.client, local.driver = restarted.client, restarted.driver  # the fixture stops this one


def test_reconcile_undoes_a_recorded_size_the_file_cannot_reach(leak_check: Path) -> None:
    """A kill between recording an impossible expand and undoing it must not stop the next start."""
    data = leak_check / "data"
    b = LocalBackend.open(str(data), node_id=NODE_ID)
    vid = b.create_volume("v", DiskOptions(size_bytes=16 * MiB)).id
    b.store.set_size(vid, 2**62)
    b.close()
    b = LocalBackend.open(str(data), node_id=NODE_ID)
    try:
        assert b.get_volume(vid).size_bytes == 16 * MiB
    finally:
        b.close()


# ---------------------------------------------------------------------------- freeing a full data dir


@dataclass
class Stocked:
    """A driver on small_fs whose volumes, snapshot and group snapshot hold real (allocated) data."""

    fs: Path
    env: Local
    ids: dict[str, str] = field(default_factory=dict)
    digest: str = ""  # of volume "kept", which no case deletes

    def restart(self) -> None:
        self.env.stop()
        self.env = start_local(self.fs.parent, self.fs / "data")

    def free(self) -> int:
        return space(str(self.fs)).free


@pytest.fixture
def stocked(small_fs: Path) -> Iterator[Stocked]:
    s = Stocked(small_fs, start_local(small_fs.parent, small_fs / "data"))
    try:
        for name in ("kept", "spare", "published"):
            s.ids[name] = s.env.create(12 * MiB, name=name)
            digest = write_user_data(volume_file(s.env, s.ids[name]), 6 * MiB)
            s.digest = s.digest or digest
        s.env.publish_context(s.ids["published"])
        controller, group = s.env.client.controller, s.env.client.group
        s.ids["snap"] = controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name="snap", source_volume_id=s.ids["kept"]), timeout=60
        ).snapshot.snapshot_id
        s.ids["group"] = group.CreateVolumeGroupSnapshot(
            csi_pb2.CreateVolumeGroupSnapshotRequest(name="group", source_volume_ids=[s.ids["spare"]]),
            timeout=60,
        ).group_snapshot.group_snapshot_id
        yield s
    finally:
        s.env.stop()


Calls = list[tuple[Callable[..., Any], Any]]


def _free_snapshot(env: Local, ids: dict[str, str]) -> Calls:
    return [(env.client.controller.DeleteSnapshot, csi_pb2.DeleteSnapshotRequest(snapshot_id=ids["snap"]))]


def _free_volume(env: Local, ids: dict[str, str]) -> Calls:
    return [(env.client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=ids["spare"]))]


def _free_published_volume(env: Local, ids: dict[str, str]) -> Calls:
    vid = ids["published"]
    return [
        (
            env.client.controller.ControllerUnpublishVolume,
            csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=NODE_ID),
        ),
        (env.client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=vid)),
    ]


def _free_group(env: Local, ids: dict[str, str]) -> Calls:
    req = csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=ids["group"])
    return [(env.client.group.DeleteVolumeGroupSnapshot, req)]


FREEING = [
    pytest.param(_free_snapshot, id="DeleteSnapshot"),
    pytest.param(_free_volume, id="DeleteVolume"),
    pytest.param(_free_published_volume, id="ControllerUnpublishVolume-then-DeleteVolume"),
    pytest.param(_free_group, id="DeleteVolumeGroupSnapshot"),
]


def _assert_full(env: Local) -> None:
    """Not a block left: a blank (sparse) volume cannot even be recorded."""
    req = csi_pb2.CreateVolumeRequest(
        name="does-not-fit", capacity_range=csi_pb2.CapacityRange(required_bytes=MiB)
    )
    req.volume_capabilities.append(mount_cap())
    assert_code(env.client.controller.CreateVolume, req, Code.RESOURCE_EXHAUSTED, contains="free space")


@pytest.mark.parametrize("free", FREEING)
@pytest.mark.parametrize("filled", ["while-running", "while-stopped"])
def test_a_full_data_dir_frees_space_through_deletes_and_the_driver_starts_on_it(
    stocked: Stocked, free: Callable[[Local, dict[str, str]], Calls], filled: str
) -> None:
    """docs/recovery.md: free space by deleting snapshots or volumes. The deletes go through with not a
    block free, and so does a start: with the database's -wal and -shm left by a stop on the full
    filesystem (while-running), or removed by a stop with room before it filled (while-stopped)."""
    if filled == "while-stopped":
        stocked.env.stop()
        fill_up(stocked.fs)
        stocked.env = start_local(stocked.fs.parent, stocked.fs / "data")
        assert stocked.free() < RESERVE_BYTES, "the start used no more room than the space reserve's"
    else:
        fill_up(stocked.fs)
        _assert_full(stocked.env)
    before = stocked.free()
    for call, request in free(stocked.env, stocked.ids):
        call(request, timeout=60)
    freed = before + 4 * MiB  # the files of the answered deletes are removed in the background
    wait_for(lambda: stocked.free() >= freed, 10, "the deletes to free the space their files held", 0.01)
    assert_consistent(stocked.env.data_dir)

    again = stocked.fs / "again"
    again.mkdir()
    fill_up(again)
    _assert_full(stocked.env)
    stocked.restart()  # stopped and started on the full filesystem
    listed = stocked.env.client.controller.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=60).entries
    assert stocked.ids["kept"] in {e.volume.volume_id for e in listed}
    assert digest_of(volume_file(stocked.env, stocked.ids["kept"]), 6 * MiB) == stocked.digest
    assert_consistent(stocked.env.data_dir)
