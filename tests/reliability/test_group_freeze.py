"""Group snapshots are one crash-consistent instant across their members, with writers running.

A writer stamps a shared, increasing sequence number into a file on every member (each stamp synced,
as a database commits), one member after the other, while group snapshots are taken. Every member of
every group is restored to a new volume, which must fsck clean (after the journal replay any mount
would do), and the members must agree on one cut:
each holds the numbers 1..n without a gap, and no member holds a number past the first one missing in
another. Without the freeze the members are copied one after the other while the writer goes on, and
the cut tears.

Also: every error path thaws what it froze; a member whose writes cannot be held (a raw block publish)
makes the snapshot fail unless `consistency: best-effort` accepts it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import freeze
from csi._proto import csi_pb2
from csi.backends.local import files
from csi.backends.local.quiesce import LocalQuiescer
from csi.failures import OutOfCapacityError
from tests.conftest import require_tool
from tests.csiclient import CsiClient, assert_code
from tests.reliability.conftest import MiB, loops_over
from tests.reliability.inprocess import Local, start_local

pytestmark = [pytest.mark.root, pytest.mark.slow]
MEMBERS = 3
Code = grpc.StatusCode
AM = csi_pb2.VolumeCapability.AccessMode
BLOCK = csi_pb2.VolumeCapability(
    block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


class SequenceWriter(threading.Thread):
    """Appends n, n+1, ... to `<target>/seq` on every target in turn, fdatasync after each stamp."""

    def __init__(self, targets: Sequence[str]) -> None:
        super().__init__(name="sequence-writer", daemon=True)
        self.targets = targets
        self.stamped = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        fds = [
            os.open(os.path.join(t, "seq"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for t in self.targets
        ]
        try:
            n = 0
            while not self._halt.is_set():
                n += 1
                for fd in fds:
                    os.write(fd, f"{n}\n".encode())
                    os.fdatasync(fd)
                self.stamped = n
        except BaseException as exc:
            self.error = exc
        finally:
            for fd in fds:
                os.close(fd)

    def finish(self) -> None:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "the writer hangs: a member stayed frozen"
        assert self.error is None, self.error


def snapshots_under_writers(
    targets: Sequence[str], take: Callable[[int], Any], count: int
) -> tuple[list[Any], SequenceWriter]:
    """24 MiB of data on each target (so a member copy takes long enough for the writer to move on
    before the next one: an unfrozen group snapshot tears), then `count` group snapshots (`take(k)`)
    while a SequenceWriter stamps all targets. Returns the snapshots and the finished writer."""
    for target in targets:
        with open(os.path.join(target, "data"), "wb") as f:
            f.write(os.urandom(24 * MiB))
            os.fsync(f.fileno())
    writer = SequenceWriter(targets)
    writer.start()
    taken = []
    try:
        while writer.stamped < 20:
            time.sleep(0.01)
        for k in range(count):
            taken.append(take(k))
            time.sleep(0.1)
    finally:
        writer.finish()
    return taken, writer


def fsck_clean(image: Path) -> None:
    """What staging the restored volume would do first: replay its journal (a crash image may need it),
    then a full check that changes nothing, which must find nothing."""
    e2fsck = require_tool("e2fsck")
    subprocess.run([e2fsck, "-E", "journal_only", "-p", str(image)], capture_output=True, check=False)
    done = subprocess.run([e2fsck, "-f", "-n", str(image)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, (
        f"{image.name} does not fsck clean:\n{done.stdout[-2000:]}{done.stderr[-500:]}"
    )


def stamps(image: Path, path: str = "/seq") -> list[int]:
    """The sequence numbers in `path` of an unmounted ext4 image."""
    done = subprocess.run(
        [require_tool("debugfs"), "-R", f"cat {path}", str(image)], capture_output=True, text=True, check=True
    )
    return [int(line) if line.isdigit() else -1 for line in done.stdout.split("\n") if line]  # -1: torn


def assert_one_cut(found: Mapping[str, list[int]]) -> int:
    """Each member holds 1..n; none holds a number past another's first missing one. Returns the cut."""
    for member, numbers in found.items():
        assert numbers == list(range(1, len(numbers) + 1)), f"{member} holds {numbers[-5:]} with a gap"
    first_missing = {m: len(n) + 1 for m, n in found.items()}
    for a, numbers in found.items():
        for b, missing in first_missing.items():
            assert not numbers or numbers[-1] <= missing, (
                f"not one instant: {a} holds {numbers[-1]}, but {b} lacks {missing} "
                f"(last numbers per member: { {m: (n[-1] if n else 0) for m, n in found.items()} })"
            )
    return min(len(n) for n in found.values())


@pytest.fixture
def local(leak_check: Path, root_tools: None) -> Iterator[Local]:
    require_tool("debugfs")
    env = start_local(leak_check)
    yield env
    env.stop()


def published(env: Local, count: int, prefix: str) -> list[str]:
    ids = []
    for i in range(count):
        vid = env.create(64 * MiB, name=f"{prefix}-{i}")
        pc = env.publish_context(vid)
        env.client.node.NodeStageVolume(env.stage_request(vid, pc), timeout=60)
        env.publish(vid, pc)
        ids.append(vid)
    return ids


def published_raw(env: Local, name: str) -> str:
    """A new volume staged and published as a raw block device."""
    vid = env.create(32 * MiB, name=name)
    pc = env.publish_context(vid)
    env.client.node.NodeStageVolume(
        csi_pb2.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=env.staging(vid), volume_capability=BLOCK, publish_context=pc
        ),
        timeout=60,
    )
    env.client.node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=vid,
            staging_target_path=env.staging(vid),
            target_path=env.target(vid),
            volume_capability=BLOCK,
            publish_context=pc,
        ),
        timeout=60,
    )
    return vid


def take_down(env: Local, ids: Sequence[str], block: Sequence[str] = ()) -> None:
    for vid in ids:
        if vid in block:
            env.client.node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=env.target(vid)), timeout=60
            )
        else:
            env.unpublish(vid)
        env.unstage(vid)
    assert loops_over(env.data_dir) == []


def group(client: CsiClient, name: str, ids: Sequence[str], **params: str) -> Any:
    request = csi_pb2.CreateVolumeGroupSnapshotRequest(name=name, source_volume_ids=ids, parameters=params)
    return client.group.CreateVolumeGroupSnapshot(request, timeout=120).group_snapshot


def restore(env: Local, snapshot_id: str) -> Path:
    request = csi_pb2.CreateVolumeRequest(
        name=f"restored-{snapshot_id}",
        capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MiB),
        volume_capabilities=[BLOCK],
    )
    request.volume_content_source.snapshot.snapshot_id = snapshot_id
    vid = env.client.controller.CreateVolume(request, timeout=60).volume.volume_id
    return env.data_dir / "volumes" / f"{vid}.img"


def not_frozen(env: Local, ids: Sequence[str]) -> None:
    for vid in ids:
        assert not freeze.thaw(env.target(vid)), f"{env.target(vid)} was left frozen"
        probe = Path(env.target(vid)) / "probe"
        probe.write_bytes(b"written after the snapshot")
        probe.unlink()


def test_group_snapshots_are_one_cut_across_members_while_writers_run(local: Local) -> None:
    """Without the freeze the cut tears in every run (checked)."""
    ids = published(local, MEMBERS, "member")
    groups, writer = snapshots_under_writers(
        [local.target(v) for v in ids], lambda k: group(local.client, f"cut-{k}", ids), 5
    )
    cuts = []
    for g in groups:
        found = {}
        for snap in g.snapshots:
            image = restore(local, snap.snapshot_id)
            fsck_clean(image)
            found[snap.source_volume_id] = stamps(image)
        cuts.append(assert_one_cut(found))
    assert cuts == sorted(cuts) and cuts[0] < cuts[-1] < writer.stamped, (
        f"cuts {cuts} of {writer.stamped} stamps: the snapshots were not taken while the writer ran"
    )
    not_frozen(local, ids)
    take_down(local, ids)


def test_a_failing_copy_thaws_every_member(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = published(local, 2, "thaw")
    real, calls = files.copy, []

    def second_copy_fails(src: str, dst: str, size: int | None = None) -> bool:
        calls.append(dst)
        if len(calls) == 2:
            raise OutOfCapacityError("no space left (injected) while copying the second member")
        return real(src, dst, size)

    monkeypatch.setattr(files, "copy", second_copy_fails)
    request = csi_pb2.CreateVolumeGroupSnapshotRequest(name="fails", source_volume_ids=ids)
    assert_code(local.client.group.CreateVolumeGroupSnapshot, request, Code.RESOURCE_EXHAUSTED)
    assert len(calls) == 2
    assert list((local.data_dir / "snapshots").iterdir()) == [], "a member copy was left behind"
    not_frozen(local, ids)
    take_down(local, ids)


def test_a_member_whose_writes_cannot_be_held_fails_the_snapshot_unless_best_effort(local: Local) -> None:
    """A raw block publish cannot be frozen: the group snapshot is refused (FAILED_PRECONDITION, saying
    why and how to accept it), thawing the member it froze; with consistency best-effort it is taken."""
    (mounted,) = published(local, 1, "fs")
    raw = published_raw(local, "raw")
    request = csi_pb2.CreateVolumeGroupSnapshotRequest(name="mixed", source_volume_ids=[mounted, raw])
    message = assert_code(local.client.group.CreateVolumeGroupSnapshot, request, Code.FAILED_PRECONDITION)
    assert "raw block device" in message and "consistency: best-effort" in message, message
    not_frozen(local, [mounted])
    assert list((local.data_dir / "snapshots").iterdir()) == []
    taken = group(local.client, "mixed", [mounted, raw], consistency="best-effort")
    assert len(taken.snapshots) == 2
    bad = csi_pb2.CreateVolumeGroupSnapshotRequest(
        name="odd", source_volume_ids=[mounted], parameters={"consistency": "x"}
    )
    assert_code(
        local.client.group.CreateVolumeGroupSnapshot, bad, Code.INVALID_ARGUMENT, contains="best-effort"
    )
    not_frozen(local, [mounted])
    take_down(local, [mounted, raw], block=[raw])


def test_an_unstage_racing_a_freeze_is_refused_until_the_thaw(local: Local) -> None:
    """The hold keeps a descriptor open on each frozen filesystem: an unstage meanwhile fails (busy)
    instead of unmounting a frozen filesystem, which would leave it frozen, its loop device bound,
    with nothing left to thaw it through. After the thaw the unstage succeeds."""
    (vid,) = published(local, 1, "racing")
    local.unpublish(vid)
    quiescer = LocalQuiescer()
    with quiescer.hold({vid: str(local.data_dir / "volumes" / f"{vid}.img")}) as held:
        assert held.frozen == [vid]
        request = csi_pb2.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=local.staging(vid))
        assert_code(local.client.node.NodeUnstageVolume, request, Code.INTERNAL, contains="busy")
    assert not freeze.thaw(local.staging(vid)), "the hold did not thaw"
    local.unstage(vid)
    assert loops_over(local.data_dir) == []
