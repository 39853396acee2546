"""A damaged state database: the driver refuses to start with a message naming the recovery command and
touches no volume file; `ballast-csi recover-state` rebuilds the state from the files, after which the
driver serves every volume and snapshot again with its data intact."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from csi._proto import csi_pb2
from csi.backends.base import DiskOptions
from csi.backends.local import LocalBackend
from csi.backends.local.layout import Layout
from csi.backends.local.recovery import recover_state
from csi.backends.local.startup import StateUnusable, check_state
from csi.failures import FailedPreconditionError
from tests.conformance.driver import DRIVER, running_driver
from tests.csiclient import connect
from tests.reliability.conftest import MiB, read_state

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


@pytest.mark.parametrize(("how", "says"), DAMAGE)
def test_refuses_to_start_then_recover_state_restores_every_volume(
    tmp_path: Path, how: Callable[[Path], None], says: str
) -> None:
    data = tmp_path / "data"
    s = seed(data)
    damage(data, how)

    done = subprocess.run(
        [str(DRIVER), "--endpoint", f"unix://{tmp_path}/csi.sock", "--data-dir", str(data),
         "--node-id", NODE, "--mode", "controller"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"ballast-csi recover-state --data-dir {data}" in done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert digests(data) == s.digests, "a refused start must leave every file as it was"
    assert not (tmp_path / "csi.sock").exists()

    rec = subprocess.run(
        [str(DRIVER), "recover-state", "--data-dir", str(data)], capture_output=True, text=True, timeout=60
    )
    assert rec.returncode == 0, rec.stderr
    assert "3 volume(s)" in rec.stdout and "3 snapshot(s)" in rec.stdout
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
    finally:
        b.close()


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
