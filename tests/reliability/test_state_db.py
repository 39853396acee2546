"""A damaged state database: the driver refuses to start with a message naming the recovery command and
touches no volume file; `ballast-csi recover-state` rebuilds the state from the files, after which the
driver serves every volume and snapshot again with its data intact."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import DiskOptions
from csi.backends.local import LocalBackend
from csi.backends.local.health import UNRECORDED, run_clear_health
from csi.backends.local.layout import Layout
from csi.backends.local.recovery import recover_state
from csi.backends.local.startup import StateUnusable, check_state
from csi.failures import FailedPreconditionError, NotFoundError
from csi.health import Status
from tests.conformance.driver import DRIVER, Driver, running_driver
from tests.csiclient import connect
from tests.reliability.conftest import MiB, fill, read_state

NODE = "sanity-node"


@dataclass
class Seeded:
    data_dir: Path
    volumes: dict[str, str]  # name -> id
    snapshot: str
    group: str
    digests: dict[str, str]  # file name -> sha256 of every file in volumes/ and snapshots/


def digests(data_dir: Path) -> dict[str, str]:
    out = {}
    for sub in ("volumes", "snapshots"):
        for p in sorted((data_dir / sub).iterdir()):
            out[f"{sub}/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def seed(data_dir: Path) -> Seeded:
    """Three volumes with data, a snapshot, a group snapshot and an attachment, written by the backend."""
    b = LocalBackend.open(str(data_dir), node_id=NODE)
    try:
        vols = {}
        for i in range(3):
            disk = b.create_volume(f"pvc-{i}", DiskOptions(size_bytes=(8 + i) * MiB))
            with open(data_dir / "volumes" / f"{disk.id}.img", "r+b") as f:
                f.seek(MiB * i)
                f.write(f"user data of pvc-{i}".encode() * 100)
            vols[f"pvc-{i}"] = disk.id
        snap = b.create_snapshot("snap-0", vols["pvc-0"], {})
        group = b.create_group_snapshot("group-0", [vols["pvc-1"], vols["pvc-2"]], {})
        b.attach(vols["pvc-0"], NODE, False)
    finally:
        b.close()
    return Seeded(data_dir, vols, snap.id, group.id, digests(data_dir))


def _garbage(db: Path) -> None:
    db.write_bytes(os.urandom(64 * 1024))


def _zero_pages(db: Path) -> None:
    raw = bytearray(db.read_bytes())
    raw[4096:] = bytes(len(raw) - 4096)  # keep the header page, wipe every table page
    db.write_bytes(bytes(raw))


def _torn(db: Path) -> None:
    with open(db, "r+b") as f:
        f.truncate(4096 + 512)


def _empty(db: Path) -> None:
    db.write_bytes(b"")


def _deleted(db: Path) -> None:
    db.unlink()


def _directory(db: Path) -> None:
    db.unlink()
    db.mkdir()


def _dropped_table(db: Path) -> None:
    con = sqlite3.connect(db)
    con.execute("DROP TABLE volumes")
    con.commit()
    con.close()


DAMAGE = [
    pytest.param(_garbage, "unreadable", id="random-bytes"),
    pytest.param(_zero_pages, "", id="table-pages-zeroed"),
    pytest.param(_torn, "", id="torn-file"),
    pytest.param(_empty, "missing or empty", id="empty-file"),
    pytest.param(_deleted, "missing or empty", id="deleted"),
    pytest.param(_directory, "unreadable", id="a-directory"),
    pytest.param(_dropped_table, "no volume table", id="volume-table-dropped"),
]


def damage(data_dir: Path, how: Callable[[Path], None]) -> None:
    db = data_dir / "state.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every committed row lives in state.db itself
    con.close()
    for side in ("state.db-wal", "state.db-shm"):
        (data_dir / side).unlink(missing_ok=True)
    how(db)


def start_refused(tmp_path: Path, data: Path) -> subprocess.CompletedProcess[str]:
    """Start the driver (controller) on `data`; it must refuse, with exit code 1."""
    done = subprocess.run(
        [str(DRIVER), "--endpoint", f"unix://{tmp_path}/csi.sock", "--data-dir", str(data),
         "--node-id", NODE, "--mode", "controller"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    return done


def recover(data: Path, failpoint: str = "", record: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`ballast-csi recover-state` on `data`, with `failpoint` armed (its kill noted in `record`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALLAST_FAILPOINTS")}
    if failpoint:
        env.update(BALLAST_FAILPOINTS=failpoint, BALLAST_FAILPOINTS_RECORD=str(record))
    return subprocess.run(
        [str(DRIVER), "recover-state", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def listed(d: Driver) -> set[str]:
    c = connect(d.endpoint)
    try:
        return {e.volume.volume_id for e in c.controller.ListVolumes(csi_pb2.ListVolumesRequest()).entries}
    finally:
        c.close()


@pytest.mark.parametrize(("how", "says"), DAMAGE)
def test_refuses_to_start_then_recover_state_restores_every_volume(
    tmp_path: Path, how: Callable[[Path], None], says: str
) -> None:
    data = tmp_path / "data"
    s = seed(data)
    damage(data, how)

    done = start_refused(tmp_path, data)
    assert f"ballast-csi recover-state --data-dir {data}" in done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert digests(data) == s.digests, "a refused start must leave every file as it was"
    assert not (tmp_path / "csi.sock").exists()

    rec = recover(data)
    assert rec.returncode == 0, rec.stderr
    assert "3 volume(s)" in rec.stdout and "3 snapshot(s)" in rec.stdout
    assert "completed an interrupted run" not in rec.stdout, "no run was interrupted"
    assert digests(data) == s.digests
    assert any(p.name.startswith("state.db.broken-") for p in data.iterdir()) or how is _deleted

    with running_driver(tmp_path, "--mode", "controller", data_dir=data) as d:
        c = connect(d.endpoint)
        listed = {e.volume.volume_id: e.volume.capacity_bytes for e in c.controller.ListVolumes(
            csi_pb2.ListVolumesRequest()).entries}  # fmt: skip
        assert set(listed) == set(s.volumes.values())
        for name, vid in s.volumes.items():
            assert listed[vid] == (8 + int(name[-1])) * MiB
        snaps = {e.snapshot.snapshot_id for e in c.controller.ListSnapshots(
            csi_pb2.ListSnapshotsRequest()).entries}  # fmt: skip
        assert s.snapshot in snaps and len(snaps) == 3
        restored = c.controller.CreateVolume(
            csi_pb2.CreateVolumeRequest(
                name="restored",
                capacity_range=csi_pb2.CapacityRange(required_bytes=8 * MiB),
                volume_capabilities=[csi_pb2.VolumeCapability(
                    mount=csi_pb2.VolumeCapability.MountVolume(),
                    access_mode=csi_pb2.VolumeCapability.AccessMode(
                        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))],
                volume_content_source=csi_pb2.VolumeContentSource(
                    snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=s.snapshot)),
            ), timeout=30,
        ).volume  # fmt: skip
        c.close()
    with open(data / "volumes" / f"{restored.volume_id}.img", "rb") as f:
        assert f.read(len(b"user data of pvc-0")) == b"user data of pvc-0"
    assert {k: v for k, v in digests(data).items() if restored.volume_id not in k} == s.digests


def test_a_delta_refuses_snapshots_whose_source_recover_state_could_not_give(tmp_path: Path) -> None:
    """With the old database unreadable no snapshot's source volume is known after the rebuild. Spec:
    target_snapshot_id names "a second snapshot in the same volume", so GetMetadataDelta cannot be
    answered for them (never with made-up ranges between two volumes); GetMetadataAllocated can."""
    data = tmp_path / "data"
    s = seed(data)
    damage(data, _garbage)
    rec = recover(data)
    assert rec.returncode == 0, rec.stderr
    assert "3 snapshot(s) whose source volume is unknown" in rec.stdout
    with running_driver(tmp_path, "--mode", "controller", data_dir=data) as d:
        c = connect(d.endpoint)
        try:
            listed = c.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest()).entries
            assert {e.snapshot.source_volume_id for e in listed} == {""}
            one, other = sorted({e.snapshot.snapshot_id for e in listed} - {s.snapshot})  # pvc-1, pvc-2
            metadata = csi_pb2_grpc.SnapshotMetadataStub(c.channel)
            for base, target in ((one, other), (other, one), (s.snapshot, one)):
                delta = csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=base, target_snapshot_id=target)
                with pytest.raises(grpc.RpcError) as refused:
                    list(metadata.GetMetadataDelta(delta, timeout=30))
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
                assert "recover-state" in (refused.value.details() or "")
            allocated = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=s.snapshot)
            assert list(metadata.GetMetadataAllocated(allocated, timeout=30))
        finally:
            c.close()


def test_recover_state_on_a_healthy_database_loses_nothing(tmp_path: Path) -> None:
    """Names, sizes, snapshot sources, the group and the attachment all survive a rebuild."""
    data = tmp_path / "data"
    s = seed(data)
    before = read_state(data)
    report = recover_state(str(data))
    counts = (report.volumes, report.named, report.snapshots, report.groups, report.attachments)
    assert counts == (3, 3, 3, 1, 1)
    assert read_state(data) == before
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        assert b.create_volume("pvc-1", DiskOptions(size_bytes=9 * MiB)).id == s.volumes["pvc-1"]
        assert [a.node_id for a in b.get_volume(s.volumes["pvc-0"]).attachments] == [NODE]
        assert b.get_snapshot(s.snapshot).source_volume_id == s.volumes["pvc-0"]
        assert {m.source_volume_id for m in b.get_group_snapshot(s.group).snapshots} == {
            s.volumes["pvc-1"],
            s.volumes["pvc-2"],
        }
        group = b.store.group(s.group)
        assert group is not None and group.parameters == {"consistency": "crash"}, "compared on a repeat"
    finally:
        b.close()


def test_recover_state_keeps_health_marks_and_expands_in_progress(tmp_path: Path) -> None:
    """A DATA_LOSS mark stays until an operator clears it, a rebuild included; an expand cut between its
    record and its file is still finished at the next start, not taken for a file that lost data."""
    data = tmp_path / "data"
    s = seed(data)
    marked, torn = s.volumes["pvc-1"], s.volumes["pvc-2"]
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        b.health.ledger.mark_short(marked, MiB, 8 * MiB)  # what an earlier start-up found
        size = b.get_volume(torn).size_bytes
        b.health.ledger.begin_growth(torn, size)  # an expand killed after its record, before its file
        b.store.set_size(torn, size + 4 * MiB)
    finally:
        b.close()
    report = recover_state(str(data))
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        marks = b.health.ledger.marks()
        assert [m.reason for m in marks.get(marked, [])] == ["BackingFileWasShort"]
        assert torn not in marks, "the torn expand lost nothing"
        assert os.path.getsize(b.volume_path(torn)) == size + 4 * MiB
    finally:
        b.close()
    assert report.marks == 1


def test_recover_state_refuses_while_a_driver_holds_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed(data)
    b = LocalBackend.open(str(data), node_id=NODE)
    before = sorted(os.listdir(data))
    try:
        with pytest.raises(FailedPreconditionError, match="in use by ballast-csi controller"):
            recover_state(str(data))
        assert sorted(os.listdir(data)) == before  # nothing moved aside
    finally:
        b.close()


def test_records_without_files_are_dropped_and_stray_files_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = seed(data)
    (data / "volumes" / f"{s.volumes['pvc-2']}.img").unlink()
    (data / "volumes" / "not-ours.img").write_bytes(b"keep me")
    report = recover_state(str(data))
    assert report.dropped == [f"volume {s.volumes['pvc-2']}"]
    assert report.ignored == [str(data / "volumes" / "not-ours.img")]
    assert (data / "volumes" / "not-ours.img").read_bytes() == b"keep me"
    assert set(read_state(data).volume_rows) == {s.volumes["pvc-0"], s.volumes["pvc-1"]}


def test_an_attached_volume_whose_file_is_gone_is_dropped_with_its_attachment(tmp_path: Path) -> None:
    """The attachment of a dropped volume goes with it: recover-state must not try to record it."""
    data = tmp_path / "data"
    s = seed(data)
    attached = s.volumes["pvc-0"]
    (data / "volumes" / f"{attached}.img").unlink()
    rec = recover(data)
    assert rec.returncode == 0, rec.stderr
    assert "2 volume(s)" in rec.stdout and "0 attachment(s)" in rec.stdout
    assert f"dropped volume {attached}: its file is gone" in rec.stdout
    assert set(read_state(data).volume_rows) == {s.volumes["pvc-1"], s.volumes["pvc-2"]}


def test_members_of_a_group_the_old_database_lost_are_kept_as_snapshots_of_their_own(tmp_path: Path) -> None:
    """The groups table unreadable, the snapshots table intact: each member snapshot (its file is
    there) is kept, no longer in a group, rather than lost without a word."""
    data = tmp_path / "data"
    s = seed(data)
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        members = {m.id: m.source_volume_id for m in b.get_group_snapshot(s.group).snapshots}
    finally:
        b.close()
    con = sqlite3.connect(data / "state.db")
    con.execute("DROP TABLE groups")
    con.commit()
    con.close()
    report = recover_state(str(data))
    assert (report.snapshots, report.groups, report.dropped) == (3, 0, [])
    assert any(p.startswith("table groups unreadable") for p in report.problems), report.problems
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        for sid, source in members.items():
            kept = b.get_snapshot(sid)
            assert (kept.source_volume_id, kept.group_id) == (source, "")
        with pytest.raises(NotFoundError):
            b.get_group_snapshot(s.group)
    finally:
        b.close()


def _seeded_then(how: Callable[[Path], None]) -> Callable[[Path], None]:
    def prepare(data_dir: Path) -> None:
        seed(data_dir)
        damage(data_dir, how)

    return prepare


@pytest.mark.parametrize(
    ("prepare", "refused"),
    [
        pytest.param(lambda d: None, False, id="fresh-data-dir"),
        pytest.param(lambda d: seed(d), False, id="healthy"),
        pytest.param(_seeded_then(_deleted), True, id="lost-with-files"),
        pytest.param(_seeded_then(_garbage), True, id="garbage"),
    ],
)
def test_check_state_only_refuses_what_cannot_be_trusted(
    tmp_path: Path, prepare: Callable[[Path], object], refused: bool
) -> None:
    data = tmp_path / "data"
    (data / "volumes").mkdir(parents=True)
    prepare(data)
    if refused:
        with pytest.raises(StateUnusable, match="recover-state"):
            check_state(Layout(str(data)))
    else:
        check_state(Layout(str(data)))


# (failpoint, whether state.db is still the old database after the kill)
INTERRUPTED = [
    pytest.param("recover.volume-recorded@2", True, id="between-commits-of-the-rebuild"),
    pytest.param("recover.built", True, id="built-not-yet-in-place"),
    pytest.param("recover.old-kept", False, id="old-kept-aside-new-not-yet-in-place"),
]


@pytest.mark.parametrize(("failpoint", "old_in_place"), INTERRUPTED)
def test_an_interrupted_recover_state_loses_nothing_and_a_second_run_completes_it(
    tmp_path: Path, failpoint: str, old_in_place: bool
) -> None:
    """Killed anywhere, recover-state leaves the old database (or none, which the driver refuses): a
    driver started then keeps every file, and running it again rebuilds every name."""
    data = tmp_path / "data"
    s = seed(data)
    before = read_state(data)
    record = tmp_path / "killed"
    cut = recover(data, failpoint, record)
    assert cut.returncode == -signal.SIGKILL, cut.stdout + cut.stderr
    assert record.read_text().split()[0] == failpoint.partition("@")[0]
    if old_in_place:
        assert read_state(data) == before
        with running_driver(tmp_path, "--mode", "controller", data_dir=data) as d:
            assert listed(d) == set(s.volumes.values())
    else:
        assert not (data / "state.db").exists()
        assert "missing or empty" in start_refused(tmp_path, data).stderr
    assert digests(data) == s.digests, "every file stays where it was"
    assert not (data / "orphans").exists()

    done = recover(data)
    assert done.returncode == 0, done.stderr
    assert "3 volume(s) (3 with their original names), 3 snapshot(s), 1 group snapshot(s)" in done.stdout
    completed = f"completed an interrupted run: the old rows were read from {data}/state.db.new"
    assert (completed in done.stdout) == (not old_in_place), done.stdout
    assert read_state(data) == before
    assert not (data / "state.db.building").exists() and not (data / "state.db.new").exists()


def test_recover_state_on_a_full_filesystem_fails_and_leaves_the_old_state(small_fs: Path) -> None:
    """Out of space part-way through the rebuild: an error, the old database untouched, and once space
    is freed the driver serves every volume."""
    data = small_fs / "data"
    s = seed(data)
    b = LocalBackend.open(str(data), node_id=NODE)
    try:  # enough records that the rebuild's writes outgrow what is left
        more = {b.create_volume(f"blank-{i}", DiskOptions(size_bytes=MiB)).id for i in range(100)}
    finally:
        b.close()
    before, files_before = read_state(data), digests(data)
    filler = fill(small_fs, leave=128 * 1024)
    rec = recover(data)
    assert rec.returncode == 1, rec.stdout
    assert "full" in rec.stderr and "Traceback" not in rec.stderr
    assert read_state(data) == before
    assert not (data / "state.db.building").exists()
    filler.unlink()
    with running_driver(small_fs.parent / "run", "--mode", "controller", data_dir=data) as d:
        assert listed(d) == set(s.volumes.values()) | more
    assert digests(data) == files_before


def test_two_recoveries_in_one_second_keep_both_old_databases(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed(data)
    second = lambda: 1_800_000_000.0  # noqa: E731 -- both runs in one second
    first = recover_state(str(data), now=second).kept_as
    assert first is not None
    kept = Path(first).read_bytes()
    again = recover_state(str(data), now=second).kept_as
    assert again is not None and again != first
    assert Path(first).read_bytes() == kept, "the first kept database was replaced"
    assert Path(again).exists()


def test_an_older_state_db_keeps_the_newer_volumes_in_the_quarantine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """state.db restored from a copy older than the files: start-up moves the newer files that hold data
    to orphans/ (logged), and moving them back and running recover-state serves them again."""
    data = tmp_path / "data"
    s = seed(data)
    older = tmp_path / "older.db"

    def save(db: Path) -> None:
        shutil.copy2(db, older)

    def restore(db: Path) -> None:
        shutil.copy2(older, db)

    damage(data, save)  # a copy of the database as it is now (checkpointed: one file)
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        newer = {
            b.create_volume(f"new-{i}", DiskOptions(size_bytes=MiB)).id: f"new-{i}".encode() for i in range(2)
        }
        blank = b.create_volume("new-blank", DiskOptions(size_bytes=MiB)).id
        for vid, payload in newer.items():
            with open(data / "volumes" / f"{vid}.img", "r+b") as f:
                f.write(payload)
        snap = b.create_snapshot("new-snap", next(iter(newer)), {}).id
    finally:
        b.close()
    damage(data, restore)

    with caplog.at_level(logging.WARNING, logger="ballast.local"):
        LocalBackend.open(str(data), node_id=NODE).close()
    orphans = data / "orphans"
    for vid, payload in newer.items():
        assert (orphans / "volumes" / f"{vid}.img").read_bytes()[: len(payload)] == payload
    assert (orphans / "snapshots" / f"{snap}.img").exists()
    assert not (data / "volumes" / f"{blank}.img").exists(), "a file that holds nothing is removed"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for vid in (*newer, blank):
        assert str(data / "volumes" / f"{vid}.img") in warned
    assert digests(data) == s.digests, "the older database's own files are untouched"

    for sub in ("volumes", "snapshots"):  # the way back, as docs/recovery.md says
        for p in (orphans / sub).iterdir():
            p.rename(data / sub / p.name)
    report = recover_state(str(data))
    assert set(read_state(data).volume_rows) == set(s.volumes.values()) | set(newer)
    assert {n.split()[2] for n in report.notes} == set(newer), "each moved back is marked: it may be torn"
    assert snap in read_state(data).snapshot_rows


def test_files_a_cut_delete_set_aside_keep_their_records_and_are_named_back(tmp_path: Path) -> None:
    """A DeleteVolume (refused, the volume is published) or DeleteSnapshot killed after it set the file
    aside as `.deleting`, before its transaction: the records are still there, so recover-state keeps
    them -- attachment included -- and the next start names the files back. A set-aside file whose
    record is gone was deleted: it is not brought back, and the start removes it."""
    data = tmp_path / "data"
    s = seed(data)
    attached = s.volumes["pvc-0"]
    for path in (data / "volumes" / f"{attached}.img", data / "snapshots" / f"{s.snapshot}.img"):
        path.rename(f"{path}.deleting")
    deleted = data / "volumes" / f"lv-{'0' * 32}.img.deleting"  # its record gone: acknowledged
    deleted.write_bytes(b"deleted data")

    rec = recover(data)
    assert rec.returncode == 0, rec.stderr
    assert "3 volume(s) (3 with their original names), 3 snapshot(s)" in rec.stdout
    assert "1 attachment(s)" in rec.stdout and "dropped" not in rec.stdout
    for kept in (f"volume {attached}", f"snapshot {s.snapshot}"):
        assert f"kept {kept}: a delete cut short set its file aside" in rec.stdout, rec.stdout
    with running_driver(tmp_path, "--mode", "controller", data_dir=data) as d:
        c = connect(d.endpoint)
        try:
            got = c.controller.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=attached))
            assert list(got.status.published_node_ids) == [NODE]
            snaps = c.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=s.snapshot))
            assert [e.snapshot.source_volume_id for e in snaps.entries] == [attached]
        finally:
            c.close()
        assert listed(d) == set(s.volumes.values())
    assert digests(data) == s.digests, "every set-aside file is back under its own name, intact"
    assert not deleted.exists()


@pytest.mark.parametrize(
    ("how", "marked"),
    [
        pytest.param(lambda db: None, True, id="intact-database-lacks-it"),
        pytest.param(_garbage, False, id="unreadable-database-says-nothing"),
        pytest.param(_deleted, False, id="no-database-says-nothing"),
    ],
)
def test_a_file_an_intact_database_has_no_record_of_is_recorded_and_marked(
    tmp_path: Path, how: Callable[[Path], None], marked: bool
) -> None:
    """A clone killed mid-copy leaves a torn file without a record, which a plain restart quarantines.
    recover-state records it (moving orphans back relies on that), but when the old database could say
    it had no such volume, the volume is reported DATA_LOSS until an operator clears it -- never served as
    a healthy `recovered-` volume. A database that is gone or unreadable knows nothing: no mark."""
    data = tmp_path / "data"
    s = seed(data)
    torn = f"lv-{'1' * 32}"
    source = data / "volumes" / f"{s.volumes['pvc-0']}.img"
    (data / "volumes" / f"{torn}.img").write_bytes(source.read_bytes()[: 2 * MiB])
    damage(data, how)

    rec = recover(data)
    assert rec.returncode == 0, rec.stderr
    assert "4 volume(s)" in rec.stdout
    assert (f"marked volume {torn} DATA_LOSS" in rec.stdout) == marked, rec.stdout
    b = LocalBackend.open(str(data), node_id=NODE)
    try:
        assert b.get_volume(torn).name == f"recovered-{torn}"
        issues = {vid: b.health.volume(vid) for vid in (torn, *s.volumes.values())}
    finally:
        b.close()
    unhealthy = {vid: [(i.status, i.reason) for i in found] for vid, found in issues.items() if found}
    assert unhealthy == ({torn: [(Status.DATA_LOSS, UNRECORDED)]} if marked else {})
    if marked:
        assert "clear-health" in issues[torn][0].message
        assert run_clear_health(str(data), [torn]) == 0
