"""LocalBackend on real files in a temporary data dir (no root: loop devices are faked)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from csi import failures, keys
from csi.backends import base
from csi.backends.base import ContentSource, Disk, DiskOptions, SourceKind
from csi.backends.local import LocalBackend, files, snapshots
from csi.backends.local.health import Ledger
from csi.backends.local.reaper import REAPER
from csi.backends.local.state import StateFull, Store
from csi.health import Status

GiB, MiB = base.GiB, base.MiB
DRIVER = "local.csi.ballast.dev"
ZONE_KEY = keys.topology_zone_key(DRIVER)
REGION_KEY = keys.topology_region_key(DRIVER)
UNLINKED = " (deleted)"  # what sysfs appends to the name of a backing file unlinked while bound


class FakeLoop:
    """csi.loop's API over a dict: device -> backing file, with sizes."""

    def __init__(self) -> None:
        self.devices: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.refreshed: list[str] = []
        self.lie = ""  # when set, backing_file reports this path

    def attach(self, backing_file: str) -> str:
        for dev, path in self.devices.items():
            if path == backing_file:
                return dev
        dev = f"/dev/loop{len(self.devices)}"
        self.devices[dev] = backing_file
        self.sizes[dev] = os.stat(backing_file).st_size
        return dev

    def bound(self, backing_file: str) -> str | None:
        return next((d for d, p in self.devices.items() if p == backing_file), None)

    def detach_file(self, backing_file: str, *, unlinked: bool = False, renamed: Sequence[str] = ()) -> None:
        names = _names(backing_file, renamed) if unlinked else {backing_file}
        for dev in [d for d, p in self.devices.items() if p in names]:
            del self.devices[dev]

    def detach(self, device: str, backing_file: str) -> bool:
        if not self.maps(device, backing_file):
            return False
        del self.devices[device]
        return True

    def backing_file(self, device: str) -> str | None:
        return self.lie or self.devices.get(device)

    def backed_by(self, path: str, *, unlinked: bool = False, renamed: Sequence[str] = ()) -> list[str]:
        names = _names(path, renamed) if unlinked else {path}
        return [d for d, p in self.devices.items() if p in names]

    def unheld(self, path: str) -> bool:
        return os.path.isfile(path) and path not in self.devices.values()

    def unopened(self, fd: int) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}") not in self.devices.values()

    def maps(self, device: str, backing_file: str) -> bool:
        return self.backing_file(device) == backing_file

    def refresh_capacity(self, device: str) -> None:
        self.refreshed.append(device)
        self.sizes[device] = os.stat(self.devices[device]).st_size

    def device_size(self, device: str) -> int:
        return self.sizes[device]


def _names(path: str, renamed: Sequence[str]) -> set[str]:
    """The names sysfs gives a file bound at `path`: as csi.loopfind.gone_names."""
    return {name + end for name in (path, *(path + s for s in renamed)) for end in ("", UNLINKED)}


def open_backend(data: Path, loop: Any = None, **kw: Any) -> LocalBackend:
    kw.setdefault("node_id", "node-1")
    kw.setdefault("zone", "z1")
    return LocalBackend.open(str(data), driver_name=DRIVER, loop=loop, **kw)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def be(data: Path) -> Iterator[LocalBackend]:
    b = open_backend(data)
    yield b
    b.close()


def volume_files(data: Path, kind: str = "volumes") -> list[str]:
    """The files in `data`/`kind` once the deletes' files are removed (in the background, reaper.py)."""
    REAPER.settle()
    return sorted(os.listdir(data / kind))


def write(path: str, offset: int, payload: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(payload)


def read(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def test_create_makes_a_sparse_file_and_a_durable_record(data: Path, be: LocalBackend) -> None:
    disk = be.create_volume("pvc-1", DiskOptions(size_bytes=GiB, context={"fsType": "xfs"}))
    st = os.stat(be.volume_path(disk.id))
    assert st.st_size == GiB and st.st_blocks == 0
    assert disk.topology == {ZONE_KEY: "z1"}
    be.close()
    reopened = open_backend(data)
    got = reopened.get_volume(disk.id)
    assert (got.name, got.size_bytes, dict(got.volume_context)) == ("pvc-1", GiB, {"fsType": "xfs"})
    reopened.close()


@pytest.mark.parametrize(
    ("second", "same"),
    [
        pytest.param(DiskOptions(size_bytes=GiB), True, id="same-args"),
        pytest.param(DiskOptions(size_bytes=2 * GiB), False, id="other-size"),
        pytest.param(DiskOptions(size_bytes=GiB, context={"fsType": "xfs"}), False, id="other-fstype"),
        pytest.param(
            DiskOptions(size_bytes=GiB, mutable_parameters={"iops": "5"}), False, id="other-mutable"
        ),
        pytest.param(DiskOptions(size_bytes=GiB, multi_node=True), False, id="other-access"),
        pytest.param(
            DiskOptions(size_bytes=GiB, requisite=[{ZONE_KEY: "z1"}]), True, id="requisite-own-zone"
        ),
        pytest.param(
            DiskOptions(
                size_bytes=GiB, requisite=[{keys.WELL_KNOWN_ZONE: "z2"}, {keys.WELL_KNOWN_ZONE: "z1"}]
            ),
            True,
            id="requisite-includes-own-zone",
        ),
        pytest.param(
            DiskOptions(size_bytes=GiB, preferred=[{ZONE_KEY: "z2"}]), True, id="preferred-other-zone-only"
        ),
        pytest.param(
            DiskOptions(size_bytes=GiB, requisite=[{keys.WELL_KNOWN_ZONE: "z2"}]),
            False,
            id="requisite-other-zone",
        ),
        pytest.param(
            DiskOptions(size_bytes=GiB, requisite=[{ZONE_KEY: "z2"}], preferred=[{ZONE_KEY: "z1"}]),
            False,
            id="requisite-other-zone-preferred-own",
        ),
    ],
)
def test_create_is_idempotent_by_name(data: Path, be: LocalBackend, second: DiskOptions, same: bool) -> None:
    first = be.create_volume("pvc-1", DiskOptions(size_bytes=GiB))
    if same:
        assert be.create_volume("pvc-1", second).id == first.id
    else:
        with pytest.raises(failures.AlreadyExistsError, match=f"'pvc-1' already exists \\({first.id}\\)"):
            be.create_volume("pvc-1", second)
    assert volume_files(data) == [f"{first.id}.img"]


def test_an_existing_volume_outside_the_requisite_says_where_it_is(be: LocalBackend) -> None:
    be.create_volume("pvc-1", DiskOptions(size_bytes=GiB))
    with pytest.raises(failures.AlreadyExistsError) as refused:
        be.create_volume("pvc-1", DiskOptions(size_bytes=GiB, requisite=[{ZONE_KEY: "z2"}]))
    assert f"{ZONE_KEY}': 'z1'" in str(refused.value)
    assert "accessibility_requirements exclude" in str(refused.value)


@pytest.mark.parametrize(
    ("second", "same"),
    [
        pytest.param(DiskOptions(size_bytes=GiB), True, id="same-args"),
        pytest.param(
            DiskOptions(size_bytes=GiB, requisite=[{ZONE_KEY: "z1"}]), True, id="requisite-own-zone"
        ),
        pytest.param(DiskOptions(size_bytes=2 * GiB), False, id="other-size"),
    ],
)
def test_a_create_that_loses_the_name_race_answers_with_the_winner(
    data: Path, be: LocalBackend, monkeypatch: pytest.MonkeyPatch, second: DiskOptions, same: bool
) -> None:
    """The name is taken between the lookup and the insert (NameTaken): the loser's file goes, and the
    winner is returned only when compatible."""
    winner = be.create_volume("pvc-1", DiskOptions(size_bytes=GiB))
    lookup, lookups = be.store.volume_by_name, []

    def late(name: str) -> Any:
        lookups.append(name)
        return None if len(lookups) == 1 else lookup(name)  # the first lookup ran before the winner's insert

    monkeypatch.setattr(be.store, "volume_by_name", late)
    if same:
        assert be.create_volume("pvc-1", second).id == winner.id
    else:
        with pytest.raises(
            failures.AlreadyExistsError, match=r"a capacity_range that a volume of .* bytes does not fit"
        ):
            be.create_volume("pvc-1", second)
    assert lookups == ["pvc-1", "pvc-1"], "the insert must have lost the race"
    assert volume_files(data) == [f"{winner.id}.img"]


BAD_IDS = ["../x", "lv-../../etc/passwd", "lv-" + "0" * 31 + "\0", "lv-" + "A" * 32, "", "ls-" + "0" * 32]


@pytest.mark.parametrize("bad", [pytest.param(b, id=repr(b)) for b in BAD_IDS])
def test_malformed_ids_are_not_found_without_file_operations(data: Path, be: LocalBackend, bad: str) -> None:
    calls: list[Any] = [
        lambda: be.get_volume(bad),
        lambda: be.delete_volume(bad),
        lambda: be.expand_volume(bad, 2 * GiB),
        lambda: be.attach(bad, "node-1", False),
        lambda: be.detach(bad, "node-1"),
        lambda: be.create_snapshot("s", bad, {}),
        lambda: be.create_volume(
            "v", DiskOptions(size_bytes=GiB, source=ContentSource(SourceKind.VOLUME, bad))
        ),
        lambda: be.create_group_snapshot("g", [bad], {}),
        lambda: be.resolve_device(bad, {}),
    ]
    for call in calls:
        with pytest.raises(failures.NotFoundError):
            call()
    assert volume_files(data) == []
    assert volume_files(data, "snapshots") == []


def test_snapshot_is_point_in_time_and_restores_keep_holes(be: LocalBackend) -> None:
    vol = be.create_volume("src", DiskOptions(size_bytes=64 * MiB))
    write(be.volume_path(vol.id), 8 * MiB, b"before")
    snap = be.create_snapshot("snap", vol.id, {})
    write(be.volume_path(vol.id), 8 * MiB, b"after!")
    restored = be.create_volume(
        "restored", DiskOptions(size_bytes=128 * MiB, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
    )
    path = be.volume_path(restored.id)
    assert read(path, 8 * MiB, 6) == b"before"
    st = os.stat(path)
    assert st.st_size == 128 * MiB and st.st_blocks * 512 < 4 * MiB
    assert restored.source == ContentSource(SourceKind.SNAPSHOT, snap.id)


def test_clone_copies_data_and_source_size_limits_it(be: LocalBackend) -> None:
    vol = be.create_volume("src", DiskOptions(size_bytes=32 * MiB))
    write(be.volume_path(vol.id), 0, b"cloned")
    clone = be.create_volume(
        "clone", DiskOptions(size_bytes=32 * MiB, source=ContentSource(SourceKind.VOLUME, vol.id))
    )
    assert read(be.volume_path(clone.id), 0, 6) == b"cloned"
    with pytest.raises(failures.OutOfRangeError):
        be.create_volume(
            "small", DiskOptions(size_bytes=MiB, source=ContentSource(SourceKind.VOLUME, vol.id))
        )
    with pytest.raises(failures.NotFoundError):
        be.create_volume(
            "x", DiskOptions(size_bytes=GiB, source=ContentSource(SourceKind.SNAPSHOT, "ls-" + "1" * 32))
        )


def test_a_clone_sizes_its_source_under_the_source_lock(data: Path, be: LocalBackend) -> None:
    """A source expanded while the clone waits for its lock (behind a snapshot copy, say) is sized
    again once the clone holds it: now larger than the request -> OUT_OF_RANGE, and no clone whose file
    is bigger than its record."""
    vol = be.create_volume("src", DiskOptions(size_bytes=16 * MiB))
    clone = DiskOptions(size_bytes=16 * MiB, source=ContentSource(SourceKind.VOLUME, vol.id))
    with futures.ThreadPoolExecutor(1) as pool:
        with be._locks.hold(vol.id):  # the source busy; an expand then grows it under its lock
            pending = pool.submit(be.create_volume, "clone", clone)
            deadline = time.monotonic() + 5
            while be._locks._entries[vol.id].users < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            be.store.set_size(vol.id, 64 * MiB)
            files.grow(be.volume_path(vol.id), 64 * MiB)
        with pytest.raises(failures.OutOfRangeError, match="larger than"):
            pending.result(10)
    assert be.store.volume_by_name("clone") is None
    assert volume_files(data) == [f"{vol.id}.img"]


@pytest.mark.parametrize("size", [None, 4 * MiB], ids=["no-size", "size-below-source"])
def test_copy_never_makes_a_file_longer_than_asked(tmp_path: Path, size: int | None) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"x" * (8 * MiB))
    if size is None:
        files.copy(str(src), str(dst))
        assert dst.stat().st_size == 8 * MiB
        return
    with pytest.raises(failures.OutOfRangeError, match="larger than"):
        files.copy(str(src), str(dst), size)
    assert not dst.exists()


@pytest.mark.parametrize(
    ("requisite", "answer"),
    [
        pytest.param([], "existing", id="no-requisite"),
        pytest.param([{ZONE_KEY: "z1"}], "existing", id="requisite-its-zone"),
        pytest.param([{ZONE_KEY: "z2"}], failures.AlreadyExistsError, id="requisite-elsewhere-incompatible"),
    ],
)
def test_a_repeated_snapshot_is_answered_before_topology_decides_placement(
    be: LocalBackend, requisite: list[dict[str, str]], answer: Any
) -> None:
    """Like a volume: an existing snapshot is the answer, or ALREADY_EXISTS when the request's
    requisite excludes where it is, never RESOURCE_EXHAUSTED for a snapshot that needs no room."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    snap = be.create_snapshot("s", vol.id, {})
    if answer == "existing":
        assert be.create_snapshot("s", vol.id, {}, requisite=requisite).id == snap.id
        return
    with pytest.raises(answer, match="snapshot 's' already exists"):
        be.create_snapshot("s", vol.id, {}, requisite=requisite)
    with pytest.raises(failures.OutOfCapacityError):
        be.create_snapshot("new", vol.id, {}, requisite=requisite)


def test_delete_refuses_published_volume_and_keeps_snapshots(data: Path, be: LocalBackend) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=GiB))
    snap = be.create_snapshot("s", vol.id, {})
    be.attach(vol.id, "node-1", False)
    with pytest.raises(failures.FailedPreconditionError, match="node-1"):
        be.delete_volume(vol.id)
    be.detach(vol.id, "node-1")
    be.delete_volume(vol.id)
    assert volume_files(data) == []
    with pytest.raises(failures.NotFoundError):
        be.delete_volume(vol.id)
    assert be.get_snapshot(snap.id).source_volume_id == vol.id


def test_attach_rules(be: LocalBackend) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=GiB))
    ctx = be.attach(vol.id, "node-1", False)
    assert ctx == {keys.PC_VOLUME_FILE: be.volume_path(vol.id)}
    assert be.attach(vol.id, "node-1", False) == ctx
    with pytest.raises(failures.AlreadyExistsError):
        be.attach(vol.id, "node-1", True)
    with pytest.raises(failures.NotFoundError, match="node-9"):
        be.attach(vol.id, "node-9", False)
    assert [a.node_id for a in be.get_volume(vol.id).attachments] == ["node-1"]
    be.detach(vol.id, "node-1")
    be.detach(vol.id, "node-1")
    assert be.get_volume(vol.id).attachments == ()


def test_attach_limit_per_node(data: Path) -> None:
    be = open_backend(data, max_volumes_per_node=2)
    ids = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)).id for i in range(3)]
    be.attach(ids[0], "node-1", False)
    be.attach(ids[1], "node-1", False)
    with pytest.raises(failures.LimitExceededError):
        be.attach(ids[2], "node-1", False)
    assert be.node_identity().max_volumes == 2
    be.close()


def test_expand_grows_the_file_and_refuses_to_shrink(be: LocalBackend) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=GiB))
    be.attach(vol.id, "node-1", False)
    assert be.expand_volume(vol.id, 2 * GiB) == 2 * GiB
    assert os.stat(be.volume_path(vol.id)).st_size == 2 * GiB
    assert be.expand_volume(vol.id, GiB) == 2 * GiB  # already big enough: idempotent
    assert be.get_volume(vol.id).size_bytes == 2 * GiB


def test_list_volumes_pages_with_tokens_that_survive_deletes(be: LocalBackend) -> None:
    ids = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)).id for i in range(5)]
    page = be.list_volumes(2)
    assert [d.id for d in page.items] == ids[:2]
    be.delete_volume(ids[1])
    rest = be.list_volumes(0, page.next_token)
    assert [d.id for d in rest.items] == ids[2:] and rest.next_token == ""
    for bad in ("garbage", "lvt-x", "lst-1"):
        with pytest.raises(failures.InvalidTokenError):
            be.list_volumes(1, bad)


def test_capacity_limit_and_topology(data: Path) -> None:
    be = open_backend(data, capacity_bytes=3 * GiB, region="r1")
    assert be.get_capacity({}, None) == 3 * GiB
    be.create_volume("a", DiskOptions(size_bytes=2 * GiB))
    assert be.get_capacity({}, {ZONE_KEY: "z1"}) == GiB
    assert be.get_capacity({}, {ZONE_KEY: "z2"}) == 0
    with pytest.raises(failures.OutOfCapacityError):
        be.create_volume("b", DiskOptions(size_bytes=2 * GiB))
    far = DiskOptions(size_bytes=MiB, requisite=[{ZONE_KEY: "z1", REGION_KEY: "r2"}])
    with pytest.raises(failures.OutOfCapacityError):
        be.create_volume("c", far)
    near = DiskOptions(size_bytes=MiB, requisite=[{ZONE_KEY: "z9"}, {ZONE_KEY: "z1", REGION_KEY: "r1"}])
    assert be.create_volume("d", near).topology == {ZONE_KEY: "z1", REGION_KEY: "r1"}
    be.close()


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        pytest.param({"iops": "3000", "throughput": "125", "tier": "performance"}, True, id="all-supported"),
        pytest.param({"iops": "0"}, False, id="iops-zero"),
        pytest.param({"tier": "gold"}, False, id="unknown-tier"),
        pytest.param({"iops": "10", "colour": "red"}, False, id="unknown-key"),
    ],
)
def test_mutable_parameters(be: LocalBackend, params: dict[str, str], ok: bool) -> None:
    if ok:
        assert be.validate_mutable_parameters(params) == params
    else:
        with pytest.raises(failures.InvalidParameterError):
            be.validate_mutable_parameters(params)


def test_modify_volume_merges_mutable_parameters(be: LocalBackend) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB, mutable_parameters={"iops": "10"}))
    disk = be.modify_volume(vol.id, {"tier": "standard"})
    assert dict(disk.parameters) == {"iops": "10", "tier": "standard"}


def test_unknown_parameters_are_rejected_by_name(be: LocalBackend) -> None:
    with pytest.raises(failures.InvalidParameterError, match="zone"):
        be.validate_parameters({"zone": "a"})


def test_snapshot_idempotency_and_listing(be: LocalBackend) -> None:
    a = be.create_volume("a", DiskOptions(size_bytes=MiB))
    b = be.create_volume("b", DiskOptions(size_bytes=MiB))
    s1 = be.create_snapshot("s1", a.id, {})
    assert be.create_snapshot("s1", a.id, {}).id == s1.id
    with pytest.raises(failures.AlreadyExistsError):
        be.create_snapshot("s1", b.id, {})
    s2 = be.create_snapshot("s2", b.id, {})
    assert [s.id for s in be.list_snapshots(source_volume_id=b.id).items] == [s2.id]
    assert [s.id for s in be.list_snapshots(snapshot_id=s1.id).items] == [s1.id]
    assert be.list_snapshots(snapshot_id="ls-" + "f" * 32).items == ()
    first = be.list_snapshots(max_entries=1)
    assert [s.id for s in be.list_snapshots(starting_token=first.next_token).items] == [s2.id]
    be.delete_snapshot(s1.id)
    with pytest.raises(failures.NotFoundError):
        be.get_snapshot(s1.id)


def test_group_snapshot_members_share_an_instant_and_delete_together(data: Path, be: LocalBackend) -> None:
    vols = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)) for i in range(3)]
    for i, v in enumerate(vols):
        write(be.volume_path(v.id), 0, f"vol{i}".encode())
    group = be.create_group_snapshot("g", [v.id for v in vols], {})
    assert len({s.created_at for s in group.snapshots}) == 1
    assert be.create_group_snapshot("g", [v.id for v in reversed(vols)], {}).id == group.id
    with pytest.raises(failures.AlreadyExistsError):
        be.create_group_snapshot("g", [vols[0].id], {})
    member = group.snapshots[1]
    restored = be.create_volume(
        "r", DiskOptions(size_bytes=MiB, source=ContentSource(SourceKind.SNAPSHOT, member.id))
    )
    assert read(be.volume_path(restored.id), 0, 4) == b"vol1"
    with pytest.raises(failures.InvalidParameterError, match="group"):
        be.delete_snapshot(member.id)
    be.delete_group_snapshot(group.id)
    assert volume_files(data, "snapshots") == []
    with pytest.raises(failures.NotFoundError):
        be.get_group_snapshot(group.id)
    with pytest.raises(failures.NotFoundError):
        be.create_group_snapshot("g2", [vols[0].id, "lv-" + "0" * 32], {})
    assert volume_files(data, "snapshots") == []


def _blank(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(MiB)  # what an interrupted blank create leaves: a sparse file, no data extent


@pytest.mark.parametrize(
    ("first", "again", "same"),
    [
        pytest.param({}, {}, True, id="default-twice"),
        pytest.param({}, {"consistency": "crash"}, True, id="default-is-crash"),
        pytest.param(
            {"consistency": "best-effort"}, {"consistency": "best-effort"}, True, id="best-effort-twice"
        ),
        pytest.param({"consistency": "best-effort"}, {}, False, id="best-effort-then-default"),
        pytest.param(
            {"consistency": "best-effort"}, {"consistency": "crash"}, False, id="best-effort-then-crash"
        ),
        pytest.param({}, {"consistency": "best-effort"}, False, id="crash-then-best-effort"),
    ],
)
def test_a_group_name_created_again_must_ask_for_the_same_parameters(
    be: LocalBackend, first: dict[str, str], again: dict[str, str], same: bool
) -> None:
    """CSI: a name taken with other `source_volume_ids` or `parameters` -> ALREADY_EXISTS: a caller
    asking for a crash-consistent group must not be handed a best-effort one."""
    ids = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)).id for i in range(2)]
    group = be.create_group_snapshot("g", ids, first)
    if same:
        assert be.create_group_snapshot("g", ids[::-1], again).id == group.id
    else:
        recorded = first.get("consistency", "crash")
        with pytest.raises(failures.AlreadyExistsError, match=f"with parameters consistency: {recorded}"):
            be.create_group_snapshot("g", ids, again)
    assert len(be.list_snapshots().items) == 2


def test_groups_of_a_database_made_before_group_parameters_are_kept_and_compared_by_volumes(
    data: Path,
) -> None:
    """Opening a database without the `parameters` column adds it (a driver upgrade); the groups already
    there did not record their parameters, so a repeated create is compared by its volumes alone."""
    be = open_backend(data)
    ids = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)).id for i in range(2)]
    old = be.create_group_snapshot("old", ids, {"consistency": "best-effort"})
    be.close()
    with sqlite3.connect(data / "state.db") as con:
        con.execute("ALTER TABLE groups DROP COLUMN parameters")  # the table as older drivers made it
    be = open_backend(data)
    try:
        row = be.store.group_by_name("old")
        assert row is not None and row.parameters is None
        assert be.create_group_snapshot("old", ids, {}).id == old.id
        with pytest.raises(failures.AlreadyExistsError, match="other volumes"):
            be.create_group_snapshot("old", ids[:1], {})
        new = be.create_group_snapshot("new", ids, {})
        with pytest.raises(failures.AlreadyExistsError, match="parameters"):
            be.create_group_snapshot("new", ids, {"consistency": "best-effort"})
        assert be.get_group_snapshot(new.id).snapshots
    finally:
        be.close()


def test_a_group_member_is_dated_after_a_snapshot_copied_before_it(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group snapshot waiting for a member's lock while a regular snapshot of it is copied is dated
    when its own copies are made: the regular snapshot is the base of a delta to the member, not the
    target."""
    v1, v2 = (be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)).id for i in range(2))
    copying, resume = threading.Event(), threading.Event()
    real_copy = files.copy

    def first_copy_waits(src: str, dst: str, size: int | None = None, **kw: Any) -> bool:
        if not copying.is_set():
            copying.set()
            assert resume.wait(5)
        return real_copy(src, dst, size, **kw)

    monkeypatch.setattr(files, "copy", first_copy_waits)
    with futures.ThreadPoolExecutor(2) as pool:
        regular = pool.submit(be.create_snapshot, "regular", v1, {})
        assert copying.wait(5)
        group = pool.submit(be.create_group_snapshot, "g", [v1, v2], {})
        deadline = time.monotonic() + 5
        while len(be._locks) < 2 and time.monotonic() < deadline:  # the group waits for v1's lock
            time.sleep(0.01)
        time.sleep(0.05)
        resume.set()
        snap, taken = regular.result(10), group.result(10)
    member = next(s for s in taken.snapshots if s.source_volume_id == v1)
    assert member.created_at >= snap.created_at
    be.blocks.delta(snap.id, member.id, 0, 64 * 1024)
    with pytest.raises(failures.InvalidParameterError, match="taken before"):
        be.blocks.delta(member.id, snap.id, 0, 64 * 1024)


def test_a_clock_stepping_back_never_dates_a_snapshot_before_an_earlier_one(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB)).id
    first = be.create_snapshot("first", vol, {})
    monkeypatch.setattr(snapshots, "time", SimpleNamespace(time=lambda: first.created_at - 3600))
    second = be.create_snapshot("second", vol, {})
    member = be.create_group_snapshot("g", [vol], {}).snapshots[0]
    assert first.created_at <= second.created_at <= member.created_at
    be.blocks.delta(first.id, second.id, 0, 64 * 1024)
    be.blocks.delta(second.id, member.id, 0, 64 * 1024)


def test_reconcile_removes_orphans_grows_torn_expands_and_flags_missing_files(data: Path) -> None:
    be = open_backend(data)
    kept = be.create_volume("kept", DiskOptions(size_bytes=2 * MiB))
    gone = be.create_volume("gone", DiskOptions(size_bytes=MiB))
    be.close()
    _blank(data / "volumes" / ("lv-" + "a" * 32 + ".img"))  # an interrupted blank create
    (data / "snapshots" / ("ls-" + "b" * 32 + ".img")).write_bytes(b"")
    store = Store(str(data / "state.db"))
    Ledger(store).begin_growth(kept.id, MiB)  # an expand from 1 MiB recorded, the file not yet grown
    store.close()
    os.truncate(data / "volumes" / f"{kept.id}.img", MiB)
    os.unlink(data / "volumes" / f"{gone.id}.img")
    be = open_backend(data)
    assert volume_files(data) == [f"{kept.id}.img"]
    assert volume_files(data, "snapshots") == []
    assert os.stat(be.volume_path(kept.id)).st_size == 2 * MiB
    assert be.volume_health(kept.id) == ()  # a torn expand lost nothing
    assert [(i.status, i.reason) for i in be.volume_health(gone.id)] == [
        (Status.INACCESSIBLE, "BackingFileMissing")
    ]
    be.close()


# (directory, file name, how the orphan is made, where it ends up: "removed", "orphans" or "in place")
ORPHANS = [
    pytest.param("volumes", "lv-" + "a" * 32 + ".img", _blank, "removed", id="blank-volume-file"),
    pytest.param("snapshots", "ls-" + "a" * 32 + ".img", _blank, "removed", id="blank-snapshot-file"),
    pytest.param(
        "volumes", "lv-" + "b" * 32 + ".img", lambda p: p.write_bytes(b"user data"), "orphans",
        id="volume-file-with-data",
    ),
    pytest.param(
        "snapshots", "ls-" + "b" * 32 + ".img", lambda p: p.write_bytes(b"user data"), "orphans",
        id="snapshot-file-with-data",
    ),
    pytest.param("volumes", "notes.txt", lambda p: p.write_bytes(b"not ours"), "orphans", id="stray-file"),
    pytest.param(
        "snapshots", ".reflink-probe-1-a", lambda p: p.write_bytes(bytes(4096)), "removed",
        id="reflink-probe-scratch",
    ),
    pytest.param("volumes", "lost+found", lambda p: p.mkdir(), "in place", id="a-directory"),
    pytest.param(
        "volumes", "lv-" + "c" * 32 + ".img", lambda p: p.symlink_to("/dev/null"), "in place", id="a-symlink"
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("sub", "recorded", "ends"),
    [
        pytest.param("volumes", False, "removed", id="volume-record-deleted"),
        pytest.param("volumes", True, "named back", id="volume-record-kept"),
        pytest.param("snapshots", False, "removed", id="snapshot-record-deleted"),
        pytest.param("snapshots", True, "named back", id="snapshot-record-kept"),
    ],
)
def test_reconcile_finishes_a_delete_cut_between_its_record_and_its_file(
    data: Path, sub: str, recorded: bool, ends: str
) -> None:
    """A delete sets its file aside as `<file>.deleting` before it deletes the record (files.doomed). A
    crash after the record went leaves data nobody may have back: removed, never quarantined; a crash
    before leaves a volume that still exists: its file gets its name back."""
    be = open_backend(data)
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    Path(be.volume_path(vol.id)).write_bytes(b"user data")
    snap = be.create_snapshot("s", vol.id, {})
    path = be.volume_path(vol.id) if sub == "volumes" else str(data / "snapshots" / f"{snap.id}.img")
    if not recorded:
        if sub == "volumes":
            be.delete_snapshot(snap.id)
            be.store.delete_volume(vol.id)
        else:
            be.store.delete_snapshot(snap.id)
    be.close()
    os.rename(path, path + ".deleting")
    open_backend(data).close()
    assert not os.path.exists(path + ".deleting")
    assert os.path.exists(path) == (ends == "named back")
    assert [p for p in (data / "orphans").rglob("*") if p.is_file()] == [], "nothing quarantined"
    if ends == "named back":
        assert Path(path).read_bytes().startswith(b"user data")


def test_a_refused_delete_keeps_its_file_under_its_name(be: LocalBackend) -> None:
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    be.attach(vol.id, "node-1", False)
    with pytest.raises(failures.FailedPreconditionError, match="published"):
        be.delete_volume(vol.id)
    assert os.listdir(os.path.dirname(be.volume_path(vol.id))) == [os.path.basename(be.volume_path(vol.id))]


@pytest.mark.parametrize(("sub", "name", "make", "ends"), ORPHANS)
def test_reconcile_removes_orphans_without_data_and_quarantines_the_others(
    data: Path,
    caplog: pytest.LogCaptureFixture,
    sub: str,
    name: str,
    make: Callable[[Path], object],
    ends: str,
) -> None:
    """A file without a record that holds data may be a volume the database forgot: start-up moves it
    to orphans/ and says so; only one that holds nothing is removed."""
    open_backend(data).close()
    orphan = data / sub / name
    make(orphan)
    before = orphan.read_bytes() if ends == "orphans" else b""
    with caplog.at_level(logging.WARNING, logger="ballast.local"):
        open_backend(data).close()
    quarantined = data / "orphans" / sub / name
    assert (os.path.lexists(orphan), quarantined.exists()) == {
        "removed": (False, False), "orphans": (False, True), "in place": (True, False)
    }[ends]  # fmt: skip
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and str(orphan) in r.getMessage()
    ]
    if ends == "orphans":
        assert quarantined.read_bytes() == before
        assert logged and f"moved {orphan} to {quarantined}" in logged[0] and "holds data" in logged[0]
    elif ends == "removed":
        assert logged and logged[0].startswith(f"removed {orphan}")
    else:
        assert not logged


def test_the_quarantine_never_replaces_a_file_and_finishes_a_cut_move(data: Path) -> None:
    name = "lv-" + "d" * 32 + ".img"
    open_backend(data).close()
    (data / "orphans" / "volumes").mkdir(parents=True)
    (data / "orphans" / "volumes" / name).write_bytes(b"quarantined earlier")
    (data / "volumes" / name).write_bytes(b"another file of that name")
    other = "lv-" + "e" * 32 + ".img"
    (data / "volumes" / other).write_bytes(b"moved, cut before its old name was removed")
    os.link(data / "volumes" / other, data / "orphans" / "volumes" / other)
    open_backend(data).close()
    assert volume_files(data) == []
    assert sorted(os.listdir(data / "orphans" / "volumes")) == sorted([other, name, f"{name}.1"])
    assert (data / "orphans" / "volumes" / name).read_bytes() == b"quarantined earlier"
    assert (data / "orphans" / "volumes" / f"{name}.1").read_bytes() == b"another file of that name"
    assert os.stat(data / "orphans" / "volumes" / other).st_nlink == 1


def test_node_process_does_not_reconcile(data: Path) -> None:
    open_backend(data).close()
    orphan = data / "volumes" / ("lv-" + "c" * 32 + ".img")
    orphan.write_bytes(b"being created by the controller")
    open_backend(data, reconcile=False).close()
    assert orphan.exists()


def test_only_one_process_reconciles_a_data_dir(be: LocalBackend, data: Path) -> None:
    with pytest.raises(
        failures.FailedPreconditionError, match=rf"in use by ballast-csi controller \(pid {os.getpid()}\)"
    ):
        open_backend(data)
    open_backend(data, reconcile=False).close()  # a node-only process shares the dir
    be.close()
    open_backend(data).close()  # closing released it


def test_resolve_device_attaches_refreshes_and_verifies(data: Path) -> None:
    loop = FakeLoop()
    be = open_backend(data, loop=loop)
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    ctx = be.attach(vol.id, "node-1", False)
    dev = be.resolve_device(vol.id, ctx)
    assert loop.devices[dev] == be.volume_path(vol.id)
    assert be.resolve_device(vol.id, ctx) == dev and loop.refreshed == []
    be.expand_volume(vol.id, 2 * MiB)
    assert be.resolve_device(vol.id, ctx) == dev and loop.refreshed == [dev]
    with pytest.raises(failures.FailedPreconditionError):
        be.resolve_device(vol.id, {keys.PC_VOLUME_FILE: "/elsewhere.img"})
    loop.lie = "/some/other/file"
    with pytest.raises(failures.FailedPreconditionError, match="not volume"):
        be.resolve_device(vol.id, ctx)
    be.release_device(vol.id)
    assert loop.devices == {}
    be.close()


def test_prepared_device_binds_nothing(data: Path) -> None:
    """Reads use prepared_device: None until a stage resolved the device, then that device (refreshed to
    a grown volume); an unknown volume is NotFound. It never binds a device itself."""
    loop = FakeLoop()
    be = open_backend(data, loop=loop)
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    assert be.prepared_device(vol.id) is None and loop.devices == {}
    dev = be.resolve_device(vol.id, {})
    be.expand_volume(vol.id, 2 * MiB)
    assert be.prepared_device(vol.id) == dev and loop.refreshed == [dev]
    for unknown in ("lv-" + "0" * 32, "not-an-id"):
        with pytest.raises(failures.NotFoundError):
            be.prepared_device(unknown)
    be.release_device(vol.id)
    assert be.prepared_device(vol.id) is None and loop.devices == {}
    be.close()


def _bound_volume(data: Path, bound: str, recorded: bool, device: str) -> tuple[LocalBackend, Disk, str]:
    """A backend over a fake loop module, a volume, and `device` bound to its file ("file"), to its file
    since unlinked ("unlinked"), to an earlier file unlinked from its path with its file there now
    ("replaced"), to another file ("other-file") or to nothing (""); its record deleted unless
    `recorded`."""
    loop = FakeLoop()
    be = open_backend(data, loop=loop)
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))
    path = be.volume_path(vol.id)
    gone = path + UNLINKED
    names = {"file": path, "unlinked": gone, "replaced": gone, "other-file": path + ".other"}
    if bound in names:
        loop.devices[device] = names[bound]
    if bound == "unlinked":
        os.unlink(path)
    if not recorded:
        be.store.delete_volume(vol.id)
    return be, vol, path


@pytest.mark.parametrize(
    ("bound", "recorded", "refused"),
    [
        pytest.param("", True, None, id="unbound-is-deleted"),
        pytest.param("file", True, failures.FailedPreconditionError, id="bound-over-its-file-is-refused"),
        pytest.param(
            "unlinked", True, failures.FailedPreconditionError, id="bound-over-its-unlinked-file-is-refused"
        ),
        pytest.param("replaced", True, None, id="a-device-over-an-earlier-file-does-not-hold-this-one"),
        pytest.param("other-file", True, None, id="another-files-device-does-not-count"),
        pytest.param("file", False, failures.NotFoundError, id="already-deleted-is-not-found"),
    ],
)
def test_delete_refuses_a_volume_whose_file_a_loop_device_holds(
    data: Path, bound: str, recorded: bool, refused: type[Exception] | None
) -> None:
    """A force-detached volume is still staged on the node: its loop device is the local attachment."""
    be, vol, path = _bound_volume(data, bound, recorded, "/dev/loop7")
    if refused is None:
        be.delete_volume(vol.id)
        assert not os.path.exists(path)
    else:
        with pytest.raises(refused, match=r"/dev/loop7.*unstage it" if recorded else "not found"):
            be.delete_volume(vol.id)
        assert bound == "unlinked" or os.path.exists(path), "the file of a volume in use stays"
        assert not recorded or be.get_volume(vol.id).id == vol.id, "and so does its record"
    be.close()


@pytest.mark.parametrize(
    ("bound", "recorded", "expected"),
    [
        pytest.param("", True, None, id="nothing-bound"),
        pytest.param("file", True, "/dev/loop3", id="known-volume"),
        pytest.param("file", False, "/dev/loop3", id="record-gone-file-kept"),
        pytest.param("unlinked", False, "/dev/loop3", id="record-gone-file-unlinked"),
        pytest.param("other-file", False, None, id="another-files-device-is-not-its"),
    ],
)
def test_leftover_device_is_found_by_the_volumes_file_path_without_its_record(
    data: Path, bound: str, recorded: bool, expected: str | None
) -> None:
    be, vol, _ = _bound_volume(data, bound, recorded, "/dev/loop3")
    assert be.leftover_device(vol.id) == expected
    with pytest.raises(failures.NotFoundError):
        be.leftover_device("not-an-id")
    be.close()


def test_node_identity_reports_topology(data: Path) -> None:
    be = open_backend(data, region="r1", node_id="n7")
    ident = be.node_identity()
    assert (ident.node_id, dict(ident.topology)) == ("n7", {ZONE_KEY: "z1", REGION_KEY: "r1"})
    assert ident.max_volumes > 0
    be.close()


def test_concurrent_creates_never_exceed_the_capacity_limit(data: Path) -> None:
    be = open_backend(data, capacity_bytes=10 * MiB)
    barrier = threading.Barrier(8)

    def one(i: int) -> bool:
        barrier.wait()
        try:
            be.create_volume(f"v{i}", DiskOptions(size_bytes=3 * MiB))
        except failures.OutOfCapacityError:
            return False
        return True

    with futures.ThreadPoolExecutor(8) as pool:
        made = sum(pool.map(one, range(8)))
    assert made == 3
    assert len(volume_files(data)) == 3, "a refused create must not leave its file behind"
    be.close()


@pytest.mark.parametrize(
    ("limit", "sizes", "target", "creates", "fitting"),
    [
        pytest.param(100 * MiB, [8 * MiB] * 10, 18 * MiB, 0, 2, id="ten-expands-room-for-two"),
        pytest.param(55 * MiB, [10 * MiB] * 4, 15 * MiB, 0, 3, id="four-expands-three-fill-it-exactly"),
        pytest.param(101 * MiB, [20 * MiB] * 5, 21 * MiB, 0, 1, id="five-expands-room-for-one"),
        pytest.param(100 * MiB, [8 * MiB] * 10, 18 * MiB, 5, 2, id="expands-and-creates-room-for-two"),
    ],
)
def test_concurrent_expands_never_exceed_the_capacity_limit(
    data: Path,
    monkeypatch: pytest.MonkeyPatch,
    limit: int,
    sizes: list[int],
    target: int,
    creates: int,
    fitting: int,
) -> None:
    """Every expand (and create) grows the volumes by target - size; only `fitting` of them fit. The
    expands all meet at begin_growth before any records its size, so a check made outside the
    transaction that writes the size lets every one of them through."""
    be = open_backend(data, capacity_bytes=limit)
    vols = [be.create_volume(f"v{i}", DiskOptions(size_bytes=size)).id for i, size in enumerate(sizes)]
    start, met = threading.Barrier(len(vols) + creates), threading.Barrier(len(vols))
    real_begin = be.health.ledger.begin_growth

    def begin_growth(volume_id: str, from_size: int) -> None:
        met.wait(10)
        real_begin(volume_id, from_size)

    monkeypatch.setattr(be.health.ledger, "begin_growth", begin_growth)

    def expand(volume_id: str) -> bool:
        start.wait(10)
        try:
            return be.expand_volume(volume_id, target) == target
        except failures.OutOfRangeError:
            return False

    def create(i: int) -> bool:
        start.wait(10)
        try:
            return bool(be.create_volume(f"new{i}", DiskOptions(size_bytes=target - sizes[0])))
        except failures.OutOfCapacityError:
            return False

    with futures.ThreadPoolExecutor(len(vols) + creates) as pool:
        done = [pool.submit(expand, v) for v in vols] + [pool.submit(create, i) for i in range(creates)]
        made = sum(f.result() for f in done)
    assert (made, be.store.provisioned_bytes()) == (fitting, sum(sizes) + fitting * (target - sizes[0]))
    assert be.store.provisioned_bytes() <= limit
    assert {d.id: d.size_bytes for d in be.list_volumes().items} == {
        name[: -len(".img")]: os.stat(data / "volumes" / name).st_size for name in volume_files(data)
    }, "every record matches its file"
    assert be.health.ledger.growth() == {}, "a refused expand leaves no growth intent behind"
    be.close()


def test_volume_locks_are_dropped_when_released(be: LocalBackend) -> None:
    vols = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)) for i in range(3)]
    be.create_group_snapshot("g", [v.id for v in vols], {})
    be.expand_volume(vols[0].id, 2 * MiB)
    be.delete_volume(vols[1].id)
    assert len(be._locks) == 0


def test_group_snapshot_holds_every_member_until_all_are_copied(
    be: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    vols = [be.create_volume(f"v{i}", DiskOptions(size_bytes=MiB)) for i in range(2)]
    copying, resume = threading.Event(), threading.Event()
    events: list[str] = []
    real_copy = files.copy

    def slow_copy(src: str, dst: str, size: int | None = None) -> bool:
        copying.set()
        resume.wait(5)
        events.append("copied")
        return real_copy(src, dst, size)

    monkeypatch.setattr(files, "copy", slow_copy)
    group = threading.Thread(target=be.create_group_snapshot, args=("g", [v.id for v in vols], {}))
    group.start()
    assert copying.wait(5)

    def expand_last_member() -> None:
        be.expand_volume(vols[1].id, 2 * MiB)
        events.append("expanded")

    expand = threading.Thread(target=expand_last_member)
    expand.start()
    expand.join(0.2)
    assert expand.is_alive(), "a member changed while its group snapshot was being taken"
    resume.set()
    group.join(5)
    expand.join(5)
    assert events == ["copied", "copied", "expanded"]
    row = be.store.group_by_name("g")
    assert row is not None
    assert [s.size_bytes for s in be.get_group_snapshot(row.id).snapshots] == [MiB, MiB]


@pytest.mark.parametrize(
    ("segment", "served"),
    [
        pytest.param({ZONE_KEY: "z1"}, True, id="own-zone-key"),
        pytest.param({ZONE_KEY: "z1", REGION_KEY: "r1"}, True, id="own-zone-and-region"),
        pytest.param({keys.WELL_KNOWN_ZONE: "z1"}, True, id="well-known-zone"),
        pytest.param({keys.LEGACY_ZONE: "z1", keys.LEGACY_REGION: "r1"}, True, id="legacy-labels"),
        pytest.param({keys.WELL_KNOWN_ZONE: "z2"}, False, id="other-zone"),
        pytest.param({"example.com/rack": "r7"}, False, id="unknown-key"),
    ],
)
def test_topology_keys_accepted_for_placement_and_capacity(
    data: Path, segment: dict[str, str], served: bool
) -> None:
    be = open_backend(data, region="r1")
    assert (be.get_capacity({}, segment) > 0) is served
    options = DiskOptions(size_bytes=MiB, requisite=[segment])
    if served:
        assert be.create_volume("v", options).topology == {ZONE_KEY: "z1", REGION_KEY: "r1"}
    else:
        with pytest.raises(failures.OutOfCapacityError):
            be.create_volume("v", options)
    be.close()


def test_region_labels_do_not_match_when_no_region_is_configured(be: LocalBackend) -> None:
    assert be.get_capacity({}, {keys.WELL_KNOWN_REGION: ""}) == 0


# ---- standing in for EBS (deployed as ebs.csi.aws.com: the target of in-tree aws-ebs migration)


@pytest.fixture
def ebs_standin(data: Path) -> Iterator[LocalBackend]:
    b = LocalBackend.open(str(data), driver_name="ebs.csi.aws.com", zone="us-east-1a", node_id="node-1")
    yield b
    b.close()


@pytest.mark.parametrize(
    ("parameters", "recorded"),
    [
        pytest.param(
            {"type": "gp2", "encrypted": "TRUE"}, {"type": "gp2", "encrypted": "true"}, id="gp2-encrypted"
        ),
        pytest.param(
            {"type": "io1", "iopsPerGB": "50"}, {"type": "io1", "iopsPerGB": "50"}, id="io1-iops-per-gb"
        ),
        pytest.param({"Type": "gp3", "IOPS": "4000"}, {"type": "gp3", "iops": "4000"}, id="keys-any-case"),
        pytest.param({}, {"type": "gp3"}, id="default-type"),
    ],
)
def test_ebs_standin_accepts_and_records_ebs_parameters(
    ebs_standin: LocalBackend, parameters: dict[str, str], recorded: dict[str, str]
) -> None:
    checked = ebs_standin.validate_parameters(parameters)
    assert checked == recorded
    disk = ebs_standin.create_volume("pvc-ebs", DiskOptions(size_bytes=4 * GiB, parameters=checked))
    assert disk.id.startswith("vol-")
    assert dict(ebs_standin.get_volume(disk.id).parameters) == recorded


@pytest.mark.parametrize(
    ("parameters", "size_gib", "message"),
    [
        pytest.param({"type": "gp9"}, 1, "unsupported EBS volume type", id="unknown-type"),
        pytest.param({"type": "io1"}, 4, "needs parameter iops", id="io1-without-iops"),
        pytest.param({"type": "gp2", "color": "blue"}, 1, "unknown parameter", id="unknown-key"),
        pytest.param({"type": "sc1"}, 1, "125..16384 GiB", id="sc1-too-small"),
        pytest.param({"type": "io1", "iopsPerGB": "10"}, 4, "below the io1 minimum", id="too-few-iops"),
    ],
)
def test_ebs_standin_refuses_what_ebs_refuses(
    ebs_standin: LocalBackend, data: Path, parameters: dict[str, str], size_gib: int, message: str
) -> None:
    with pytest.raises((failures.InvalidParameterError, failures.OutOfRangeError), match=message):
        checked = ebs_standin.validate_parameters(parameters)
        ebs_standin.create_volume("pvc-bad", DiskOptions(size_bytes=size_gib * GiB, parameters=checked))
    assert volume_files(data) == []


@pytest.mark.parametrize(
    ("given", "recorded"),
    [
        pytest.param({"IOPS": "4000"}, {"iops": "4000"}, id="settings"),
        pytest.param(
            {"tagSpecification_1": "a={{ .PVCName }}", "tagDeletion_1": "b"},
            {"tagSpecification_1": "a={{ .PVCName }}", "tagDeletion_1": "b"},
            id="tag-changes",
        ),
    ],
)
def test_ebs_standin_takes_ebs_attributes_classes(
    ebs_standin: LocalBackend, given: dict[str, str], recorded: dict[str, str]
) -> None:
    assert ebs_standin.validate_mutable_parameters(given) == recorded
    with pytest.raises(failures.InvalidParameterError, match="color"):
        ebs_standin.validate_mutable_parameters({**given, "color": "blue"})


def test_local_backend_under_its_own_name_still_takes_no_parameters(be: LocalBackend) -> None:
    with pytest.raises(failures.InvalidParameterError, match="unknown parameter"):
        be.validate_parameters({"type": "gp2"})


def test_never_written_vouches_only_for_a_file_without_any_data(be: LocalBackend) -> None:
    """Stage skips blkid on its word, so it must be False as soon as one byte anywhere was written."""
    blank = be.create_volume("untouched", DiskOptions(size_bytes=64 * MiB))
    written = be.create_volume("written", DiskOptions(size_bytes=64 * MiB))
    with open(be.volume_path(written.id), "r+b") as fh:
        fh.seek(40 * MiB)
        fh.write(b"\x01")  # far from the start, where no probe of the first blocks would look
    assert be.never_written(blank.id) is True
    assert be.never_written(written.id) is False
    clone = be.create_volume(
        "clone", DiskOptions(size_bytes=64 * MiB, source=ContentSource(SourceKind.VOLUME, written.id))
    )
    assert be.never_written(clone.id) is False


def test_a_snapshot_whose_record_cannot_be_written_leaves_no_file(
    be: LocalBackend, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy fitted, its record did not (a full disk): before, the copy stayed without a record until
    start-up quarantined it."""
    vol = be.create_volume("v", DiskOptions(size_bytes=MiB))

    def full(*_: Any, **__: Any) -> None:
        raise StateFull("the filesystem holding the data dir is full")

    monkeypatch.setattr(be.store, "insert_snapshots", full)
    with pytest.raises(StateFull):
        be.create_snapshot("s", vol.id, {})
    assert volume_files(data, "snapshots") == []
