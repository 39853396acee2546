"""Local backend health and snapshot topology on real files (no root): what a data dir says about its
volumes, the DATA_LOSS mark start-up leaves and `ballast-csi clear-health` removes, and where snapshots
can be restored."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from csi import failures
from csi.backends.base import ContentSource, DiskOptions, SourceKind
from csi.backends.local.health import Ledger
from csi.backends.local.state import Store
from csi.cli import main
from csi.health import Status
from tests.unit.test_local import REGION_KEY, ZONE_KEY, MiB, open_backend

WELL_KNOWN_ZONE = "topology.kubernetes.io/zone"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _reasons(issues: tuple[object, ...]) -> list[tuple[Status, str]]:
    return [(i.status, i.reason) for i in issues]  # type: ignore[attr-defined]


def test_a_healthy_volume_has_no_issues_and_is_not_listed(data: Path) -> None:
    be = open_backend(data)
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    assert be.volume_health(vol.id) == ()
    assert list(be.list_volume_health().items) == []
    be.close()


def test_a_missing_and_a_short_backing_file_while_running(data: Path) -> None:
    be = open_backend(data)
    gone = be.create_volume("gone", DiskOptions(size_bytes=MiB))
    short = be.create_volume("short", DiskOptions(size_bytes=2 * MiB))
    os.unlink(be.volume_path(gone.id))
    os.truncate(be.volume_path(short.id), MiB)
    assert _reasons(be.volume_health(gone.id)) == [(Status.INACCESSIBLE, "BackingFileMissing")]
    issues = be.volume_health(short.id)
    assert _reasons(issues) == [(Status.DATA_LOSS, "BackingFileShort")]
    assert f"holds {MiB} of the volume's {2 * MiB} bytes" in issues[0].message
    listed = be.list_volume_health()
    assert sorted(h.volume_id for h in listed.items) == sorted([gone.id, short.id])
    be.close()


@pytest.mark.usefixtures("restore_root_logging")
def test_a_file_found_short_at_start_up_is_grown_and_stays_data_loss_until_cleared(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    be = open_backend(data)
    vol = be.create_volume("v", DiskOptions(size_bytes=4 * MiB))
    be.close()
    os.truncate(data / "volumes" / f"{vol.id}.img", MiB)  # lost data: no expand was in progress
    be = open_backend(data)
    assert os.stat(be.volume_path(vol.id)).st_size == 4 * MiB  # repaired by growing
    issues = be.volume_health(vol.id)
    assert _reasons(issues) == [(Status.DATA_LOSS, "BackingFileWasShort")]
    assert f"bytes {MiB}..{4 * MiB} are lost" in issues[0].message
    assert f"ballast-csi clear-health {vol.id}" in issues[0].message
    be.close()
    be = open_backend(data)  # still reported after another restart
    assert _reasons(be.volume_health(vol.id)) == [(Status.DATA_LOSS, "BackingFileWasShort")]
    # the operator clears it while the driver runs
    assert main(["--data-dir", str(data), "clear-health", vol.id]) == 0
    assert "cleared 1 health mark(s)" in capsys.readouterr().out
    assert be.volume_health(vol.id) == ()
    assert main(["clear-health", "--data-dir", str(data), vol.id]) == 0
    assert "no health mark" in capsys.readouterr().out
    be.close()


@pytest.mark.usefixtures("restore_root_logging")
def test_clear_health_names_an_unknown_volume(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    open_backend(data).close()
    assert main(["clear-health", "--data-dir", str(data), "lv-" + "0" * 32]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["clear-health", "--data-dir", str(data / "nowhere"), "lv-" + "0" * 32]) == 1


def test_an_expand_leaves_no_growth_intent_and_a_deleted_volume_no_mark(data: Path) -> None:
    be = open_backend(data)
    kept = be.create_volume("kept", DiskOptions(size_bytes=MiB))
    gone = be.create_volume("gone", DiskOptions(size_bytes=2 * MiB))
    be.expand_volume(kept.id, 3 * MiB)
    assert be.health.ledger.growth() == {}
    be.close()
    os.truncate(data / "volumes" / f"{gone.id}.img", MiB)
    be = open_backend(data)
    assert list(be.health.ledger.marks()) == [gone.id]
    be.delete_volume(gone.id)
    be.close()
    store = Store(str(data / "state.db"))
    assert list(Ledger(store).marks()) == [gone.id]  # deleted between starts: purged by the next
    store.close()
    open_backend(data).close()
    store = Store(str(data / "state.db"))
    assert Ledger(store).marks() == {}
    store.close()


def test_a_start_with_nothing_to_settle_writes_nothing(data: Path) -> None:
    """A start on a full filesystem must not need room for a transaction that changes nothing."""
    be = open_backend(data)
    gone = be.create_volume("gone", DiskOptions(size_bytes=MiB))
    be.delete_volume(gone.id)
    be.close()
    watcher = sqlite3.connect(data / "state.db")
    try:
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        open_backend(data).close()
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version, "the start wrote"
    finally:
        watcher.close()


def test_list_volume_health_pages_by_volume_id(data: Path) -> None:
    be = open_backend(data)
    vols = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)) for i in range(5)]
    for v in vols:
        os.unlink(be.volume_path(v.id))
    first = be.list_volume_health(max_entries=3)
    rest = be.list_volume_health(max_entries=3, starting_token=first.next_token)
    assert len(first.items) == 3 and first.next_token and not rest.next_token
    assert [h.volume_id for h in (*first.items, *rest.items)] == sorted(v.id for v in vols)
    with pytest.raises(failures.InvalidTokenError):
        be.list_volume_health(starting_token="lvt-1")
    be.close()


def test_storage_health_of_a_data_dir_with_room(data: Path) -> None:
    be = open_backend(data)
    st = os.statvfs(data)
    if (st.f_blocks - st.f_bavail) * 100 >= 95 * st.f_blocks:
        pytest.skip("the filesystem holding the test's temp dir is nearly full itself")
    assert be.storage_health() == []
    be.close()


# ---------------------------------------------------------------- snapshot topology


def test_snapshots_are_accessible_from_the_data_dirs_segment_only(data: Path) -> None:
    be = open_backend(data, region="r1")
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    here = {ZONE_KEY: "z1", REGION_KEY: "r1"}
    snap = be.create_snapshot("s", vol.id, {}, requisite=[{WELL_KNOWN_ZONE: "z1"}])
    assert [dict(t) for t in snap.topology] == [here]
    assert [dict(t) for t in be.get_snapshot(snap.id).topology] == [here]
    assert [dict(t) for t in be.list_snapshots(snapshot_id=snap.id).items[0].topology] == [here]
    with pytest.raises(failures.OutOfCapacityError, match="requisite"):
        be.create_snapshot("elsewhere", vol.id, {}, requisite=[{ZONE_KEY: "z2"}])
    assert be.list_snapshots(source_volume_id=vol.id).items[0].id == snap.id  # nothing else was made
    restore = DiskOptions(size_bytes=MiB, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
    with pytest.raises(failures.OutOfCapacityError):
        be.create_volume("restored-elsewhere", restore._replace(requisite=[{ZONE_KEY: "z2"}]))
    assert (
        be.create_volume("restored", restore._replace(requisite=[{ZONE_KEY: "z1"}])).source == restore.source
    )
    be.close()
