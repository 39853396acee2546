"""A single snapshot is one point in time of its volume on a data dir that cannot reflink, too.

The data dir is on an ext4 the test makes on a loop device, so every copy is the piece-by-piece
fallback whatever filesystem the host has. The driver takes that copy with the volume's staged
filesystem frozen: checked directly (the filesystem is frozen while the copy runs, thawed after), and
by its effect (writers stamping a sequence into two files of the volume while snapshots are taken: each
restored snapshot fscks clean and holds one cut; without the freeze the copy tears). A volume published
as a raw block device cannot be frozen: its snapshot is refused unless `consistency: best-effort`. A
copy, single or group, that the free space cannot hold is refused before anything freezes.
(With reflink the copy is atomic and none of this applies: tests/integration/test_cbt.py snapshots a
raw block publish on xfs without any parameter.)
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import freeze
from csi._proto import csi_pb2
from csi.backends.local import files
from tests.conftest import require_tool
from tests.csiclient import assert_code
from tests.integration.conftest import force_clean, leftovers, loop_filesystem
from tests.reliability.conftest import MiB
from tests.reliability.inprocess import Local, start_local
from tests.reliability.test_group_freeze import (
    assert_one_cut,
    fsck_clean,
    not_frozen,
    published,
    published_raw,
    restore,
    snapshots_under_writers,
    stamps,
    take_down,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]
Code = grpc.StatusCode


@pytest.fixture
def ext4_data_dir(leak_check: Path, root_tools: None) -> Iterator[Local]:
    """The driver in this process with its data dir on a fresh ext4 (no reflink) on a loop device."""
    require_tool("debugfs")
    (leak_check / "fs").mkdir()
    with loop_filesystem(leak_check / "fs", "ext4", 1024 * MiB) as mnt:
        env = start_local(leak_check, mnt / "data")
        try:
            yield env
        finally:
            env.stop()
            mounts, loops = leftovers(env.kubelet, env.data_dir)
            force_clean(env.kubelet, env.data_dir)  # before the data dir's filesystem goes
    assert not mounts and not loops, f"leaked mounts {mounts} and loop devices {loops}"


def snapshot(env: Local, name: str, volume_id: str, **params: str) -> Any:
    request = csi_pb2.CreateSnapshotRequest(name=name, source_volume_id=volume_id, parameters=params)
    return env.client.controller.CreateSnapshot(request, timeout=120).snapshot


def frozen(path: str) -> bool:
    """Whether the filesystem at `path` is frozen, leaving it as it is (a second freeze is EBUSY)."""
    try:
        held = freeze.freeze(path)
    except freeze.FreezeError as exc:
        if exc.errno == errno.EBUSY:
            return True
        raise
    freeze.thaw_held(held)
    return False


def frozen_during_copies(env: Local, vid: str, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, whether `vid`'s filesystem was frozen when each piece-by-piece copy began."""
    seen: list[bool] = []
    real = files._sparse_copy

    def probed(src_fd: int, dst_fd: int, length: int) -> None:
        seen.append(frozen(env.target(vid)))
        real(src_fd, dst_fd, length)

    monkeypatch.setattr(files, "_sparse_copy", probed)
    return seen


def test_the_copy_runs_with_the_staged_filesystem_frozen(
    ext4_data_dir: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ext4_data_dir
    (vid,) = published(env, 1, "frozen")
    seen = frozen_during_copies(env, vid, monkeypatch)
    snapshot(env, "s", vid)
    assert seen == [True], "the piece-by-piece copy ran while the volume's filesystem took writes"
    not_frozen(env, [vid])
    take_down(env, [vid])


def _single(env: Local, vid: str) -> Any:
    return env.client.controller.CreateSnapshot, csi_pb2.CreateSnapshotRequest(name="s", source_volume_id=vid)


def _group(env: Local, vid: str) -> Any:
    request = csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=[vid])
    return env.client.group.CreateVolumeGroupSnapshot, request


@pytest.mark.parametrize("take", [_single, _group], ids=["snapshot", "group-snapshot"])
def test_a_copy_that_cannot_fit_is_refused_before_it_holds_the_writers(
    ext4_data_dir: Local, monkeypatch: pytest.MonkeyPatch, take: Callable[[Local, str], Any]
) -> None:
    """More data in the volume than free space in the data dir: RESOURCE_EXHAUSTED at once, the pod's
    writes never held for a copy that cannot finish, and no partial copy left behind."""
    env = ext4_data_dir
    (vid,) = published(env, 1, "full")
    with open(os.path.join(env.target(vid), "data"), "wb") as fh:
        fh.write(b"\x01" * (48 * MiB))
        os.fsync(fh.fileno())
    frozen_at: list[str] = []
    real = freeze.freeze

    def recorded(point: str) -> int:
        frozen_at.append(point)
        return real(point)

    monkeypatch.setattr(freeze, "freeze", recorded)
    filler = env.data_dir / "filler"
    with open(filler, "wb") as fh:
        st = os.fstatvfs(fh.fileno())
        os.posix_fallocate(fh.fileno(), 0, st.f_bfree * st.f_frsize - 24 * MiB)  # root's reserve too
    snapshots = set(os.listdir(env.data_dir / "snapshots"))
    call, request = take(env, vid)
    assert_code(call, request, Code.RESOURCE_EXHAUSTED, contains="free")
    assert frozen_at == [] and set(os.listdir(env.data_dir / "snapshots")) == snapshots
    filler.unlink()
    call(request, timeout=120)
    assert frozen_at == [env.staging(vid)], "with room the copy runs, frozen"
    not_frozen(env, [vid])
    take_down(env, [vid])


def test_snapshots_taken_while_writers_run_are_point_in_time(ext4_data_dir: Local) -> None:
    """Two files of one volume, stamped one after the other: a point-in-time image has the same
    numbers in both, but for the last one in the first file. Without the freeze the copy tears."""
    env = ext4_data_dir
    (vid,) = published(env, 1, "written")
    dirs = [os.path.join(env.target(vid), d) for d in ("a", "b")]
    for d in dirs:
        os.mkdir(d)
    taken, writer = snapshots_under_writers(dirs, lambda k: snapshot(env, f"cut-{k}", vid), 3)
    cuts = []
    for snap in taken:
        image = restore(env, snap.snapshot_id)
        fsck_clean(image)
        cuts.append(assert_one_cut({d: stamps(image, f"/{d}/seq") for d in ("a", "b")}))
    assert cuts == sorted(cuts) and cuts[-1] < writer.stamped, f"cuts {cuts} of {writer.stamped} stamps"
    not_frozen(env, [vid])
    take_down(env, [vid])


def test_a_raw_block_publish_is_refused_unless_best_effort(ext4_data_dir: Local) -> None:
    env = ext4_data_dir
    raw = published_raw(env, "raw")
    request = csi_pb2.CreateSnapshotRequest(name="raw-snap", source_volume_id=raw)
    message = assert_code(env.client.controller.CreateSnapshot, request, Code.FAILED_PRECONDITION)
    for said in (
        "raw block device",
        raw,
        "reflink",
        "VolumeSnapshotClass parameter consistency: best-effort",
    ):
        assert said in message, message
    assert list((env.data_dir / "snapshots").iterdir()) == [], "a refused snapshot left its copy"
    taken = snapshot(env, "raw-snap", raw, consistency="best-effort")
    assert snapshot(env, "raw-snap", raw).snapshot_id == taken.snapshot_id  # the name is taken now
    for params in ({"consistency": "x"}, {"quiesce": "no"}):
        bad = csi_pb2.CreateSnapshotRequest(name="bad", source_volume_id=raw, parameters=params)
        assert_code(env.client.controller.CreateSnapshot, bad, Code.INVALID_ARGUMENT)
    take_down(env, [raw], block=[raw])


def clone(env: Local, name: str, volume_id: str) -> csi_pb2.CreateVolumeRequest:
    source = csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=volume_id))
    return csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER),
        )],
        volume_content_source=source,
    )  # fmt: skip


def test_a_clone_of_a_volume_in_use_is_copied_frozen(
    ext4_data_dir: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone copies its source volume as a snapshot does: piece by piece here, so with the source's
    staged filesystem frozen; before, it copied a live filesystem and could come back torn."""
    env = ext4_data_dir
    (vid,) = published(env, 1, "source")
    seen = frozen_during_copies(env, vid, monkeypatch)
    copy = env.client.controller.CreateVolume(clone(env, "copy", vid), timeout=120).volume
    assert seen == [True], "the clone's copy ran while its source's filesystem took writes"
    not_frozen(env, [vid])
    env.client.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=copy.volume_id), timeout=60)
    take_down(env, [vid])


def test_a_clone_of_a_raw_block_publish_is_refused(ext4_data_dir: Local) -> None:
    """Nothing can hold a raw block device's writes, and CreateVolume has no parameter that accepts a
    torn copy: refused, naming the cause and what to do, with no file left."""
    env = ext4_data_dir
    raw = published_raw(env, "raw-source")
    before = sorted(p.name for p in (env.data_dir / "volumes").iterdir())
    message = assert_code(env.client.controller.CreateVolume, clone(env, "c", raw), Code.FAILED_PRECONDITION)
    for said in ("clone 'c' would not be crash-consistent", "raw block device", "reflink"):
        assert said in message, message
    assert "best-effort" not in message, message
    assert sorted(p.name for p in (env.data_dir / "volumes").iterdir()) == before
    take_down(env, [raw], block=[raw])
