"""Snapshots and group snapshots of the local backend: block-sharing copies of volume files
(files.copy), recorded in the state database. The contracts are those of csi.backends.base.Backend.

Every snapshot is one point in time of its volume, as if the power had gone then (crash-consistent);
so is a clone, whose copy of its source volume is held alike (clone_hold).
A reflink copy is atomic by itself; a copy made piece by piece (a data dir without reflink) is made
with the volume's staged filesystems frozen (quiesce.py); group snapshot members are all copied inside
one freeze. Writes that no freeze holds (a raw block publish) -> FailedPreconditionError, unless the
parameter `consistency: best-effort` accepts a snapshot that is not crash-consistent.

A snapshot is copied, stamped and recorded under its volume's lock, so the order of a volume's
snapshots by (created, seq) is the order of their images: `created` never goes back for one volume
(a clock stepping back is clamped) and `seq` is assigned in that order (cbt.py relies on it).

A snapshot file is written before its record is committed, and on a lost name race it is removed again,
so start-up reconciliation never meets a snapshot record without its file. Snapshots live in the data
dir of their volume, so they are restorable in its topology segment only (Snapshot.topology); a
CreateSnapshot whose requisite topology names another segment -> OutOfCapacityError.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence

from csi.backends.base import EMPTY, GroupSnapshot, Page, Snapshot
from csi.backends.local import files, params
from csi.backends.local.layout import (
    GROUP_ID,
    GROUP_PREFIX,
    SNAPSHOT_ID,
    SNAPSHOT_PREFIX,
    SNAPSHOT_TOKEN,
    SNAPSHOT_TOKEN_PREFIX,
    VOLUME_ID,
    Layout,
    new_id,
    page_start,
)
from csi.backends.local.quiesce import Quiescer
from csi.backends.local.rows import GroupRow, SnapshotRow, VolumeRow
from csi.backends.local.state import NameTaken, Store
from csi.backends.local.topology import Segment
from csi.backends.snapshotting import SnapshotDelegation
from csi.failures import AlreadyExistsError, FailedPreconditionError, InvalidParameterError, NotFoundError
from csi.keylocks import KeyedLocks
from shim import failpoints

log = logging.getLogger("ballast.local")
CONSISTENCY, CRASH, BEST_EFFORT = "consistency", "crash", "best-effort"
SNAPSHOT, GROUP, CLONE = "snapshot", "group snapshot", "clone"
CLASS = {SNAPSHOT: "VolumeSnapshotClass", GROUP: "VolumeGroupSnapshotClass"}  # where best-effort is set
REFLINK = "put the data dir on a filesystem with reflink (xfs, btrfs: an atomic copy)"
REMEDY = {  # what makes a copy crash-consistent that is not
    SNAPSHOT: f"Stop the writers, {REFLINK}",
    GROUP: "Stop the writers",
    CLONE: f"Stop the writers or {REFLINK}",
}


def _consistency(what: str, parameters: Mapping[str, str]) -> dict[str, str]:
    """The one parameter of snapshots and group snapshots, normalised: `consistency` is `crash` (the
    default: refuse a snapshot that would not be crash-consistent) or `best-effort` (take it anyway).
    Any other key or value -> InvalidParameterError."""
    rest = dict(parameters)
    value = rest.pop(CONSISTENCY, CRASH)
    params.unknown(f"{what} ", rest)
    if value not in (CRASH, BEST_EFFORT):
        raise InvalidParameterError(f"{what} parameter {CONSISTENCY} must be {CRASH} or {BEST_EFFORT}")
    return {CONSISTENCY: value}


def _not_consistent(
    what: str, name: str, unfrozen: Mapping[str, str], consistency: Mapping[str, str]
) -> None:
    why = "; ".join(unfrozen[v] for v in sorted(unfrozen))
    if consistency[CONSISTENCY] == CRASH:
        anyway = (
            f", or set the {CLASS[what]} parameter {CONSISTENCY}: {BEST_EFFORT} to take it anyway"
            if what in CLASS
            else ""
        )
        raise FailedPreconditionError(
            f"{what} {name!r} would not be crash-consistent: {why}. {REMEDY[what]}{anyway}"
        )
    log.warning("%s %r is not crash-consistent (%s=%s): %s", what, name, CONSISTENCY, BEST_EFFORT, why)


def _same_group(existing: GroupRow, volume_ids: Sequence[str], parameters: Mapping[str, str]) -> None:
    """CSI: ALREADY_EXISTS "indicates that a group snapshot corresponding to the specified group
    snapshot `name` already exists but is incompatible with the specified `source_volume_ids` or
    `parameters`". A group recorded before its parameters were (None) is compared by volumes alone."""
    if sorted(existing.volume_ids) != sorted(volume_ids):
        raise AlreadyExistsError(f"group snapshot {existing.name!r} already exists with other volumes")
    if existing.parameters is not None and existing.parameters != dict(parameters):
        theirs = ", ".join(f"{k}: {v}" for k, v in sorted(existing.parameters.items()))
        raise AlreadyExistsError(f"group snapshot {existing.name!r} already exists with parameters {theirs}")


class LocalSnapshots:
    """Snapshot operations over one data dir; `locks` are the backend's per-volume locks, `quiescer`
    holds the writes to group snapshot members."""

    def __init__(
        self, layout: Layout, store: Store, locks: KeyedLocks, segment: Segment, quiescer: Quiescer
    ) -> None:
        self._layout = layout
        self._store = store
        self._locks = locks
        self._segment = segment
        self._quiescer = quiescer

    def _record(self, row: SnapshotRow) -> Snapshot:
        return Snapshot(
            id=row.id,
            name=row.name,
            source_volume_id=row.source_volume_id,
            size_bytes=row.size,
            created_at=row.created,
            group_id=row.group_id,
            topology=(dict(self._segment.labels),),
        )

    def create(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]] = (),
        metadata: Mapping[str, str] = EMPTY,
    ) -> Snapshot:
        """A name taken for the same volume returns that snapshot, whatever its `consistency` was (CSI
        compares the source volume alone: "ALREADY_EXISTS ... incompatible with the specified
        `source_volume_id`"). A copy made piece by piece is made frozen (module docstring). The
        VolumeSnapshot's `metadata` labels nothing: a snapshot file carries no tags."""
        consistency = _consistency(SNAPSHOT, parameters)
        existing = self._store.snapshot_by_name(name)
        if existing is not None:
            if existing.source_volume_id != source_volume_id:
                raise AlreadyExistsError(
                    f"snapshot {name!r} already exists for volume {existing.source_volume_id}"
                )
            self._segment.check_existing(name, existing.id, requisite, "snapshot")
            return self._record(existing)
        self._segment.check_requisite(requisite)
        try:
            snap = self._take(name, source_volume_id, consistency)
        except NameTaken:
            return self.create(name, source_volume_id, parameters, requisite, metadata)
        failpoints.hit("local.snapshot.recorded")
        return self._record(snap)

    def _take(self, name: str, volume_id: str, consistency: Mapping[str, str]) -> SnapshotRow:
        """Copy, stamp and record one snapshot under the volume's lock. Lost name race -> NameTaken."""
        src = self._layout.volume_file(volume_id)
        snapshot_id = new_id(SNAPSHOT_PREFIX)
        dst = self._layout.snapshot_file(snapshot_id)
        with self._locks.hold(volume_id):
            row = self._store.existing_volume(volume_id)
            created = self._instant([volume_id])
            try:
                files.copy(src, dst, held=lambda: self._held(SNAPSHOT, name, {volume_id: src}, consistency))
            except FileNotFoundError as exc:
                raise FailedPreconditionError(f"the backing file of {volume_id} is missing") from exc
            snap = SnapshotRow(0, snapshot_id, name, volume_id, row.size, created, "")
            failpoints.hit("local.snapshot.file-written")
            self._insert([snap])
        return snap

    def _instant(self, volume_ids: Sequence[str]) -> float:
        """The creation time of a snapshot of `volume_ids` taken now (their locks held): never before
        one of theirs already taken, even when the clock has stepped back."""
        return max(time.time(), self._store.latest_snapshot_time(volume_ids))

    @contextlib.contextmanager
    def _held(
        self, what: str, name: str, volumes: Mapping[str, str], consistency: Mapping[str, str]
    ) -> Iterator[None]:
        """The writes to `volumes` (id -> file) held for the block: their staged filesystems frozen
        (quiesce.py). One whose writes cannot be held -> _not_consistent decides."""
        with self._quiescer.hold(volumes) as held:
            if held.unfrozen:
                _not_consistent(what, name, held.unfrozen, consistency)
            yield

    def clone_hold(self, name: str, volume_id: str, path: str) -> contextlib.AbstractContextManager[None]:
        """The hold on the writes to the source volume of clone `name` (file `path`) for a copy made
        piece by piece: as a snapshot's, and a clone has no parameter that accepts less."""
        return self._held(CLONE, name, {volume_id: path}, {CONSISTENCY: CRASH})

    def _insert(self, rows: Sequence[SnapshotRow], group: GroupRow | None = None) -> None:
        """Record the copies; when that fails (a lost name race: NameTaken; a full disk) remove their
        files, so a refused snapshot leaves nothing for start-up to quarantine."""
        try:
            self._store.insert_snapshots(rows, group)
        except BaseException:
            self._remove(rows)
            raise

    def delete(self, snapshot_id: str) -> None:
        """Under the snapshot's lock, which a restore from it holds while it reads the record and opens
        the file (contents.py): a restore sees the snapshot whole, or not at all (NotFoundError), never
        its file set aside."""
        path = self._layout.snapshot_file(snapshot_id)
        with self._locks.hold(snapshot_id):
            row = self._store.snapshot(snapshot_id)
            if row is None:
                raise NotFoundError(f"snapshot {snapshot_id} not found")
            if row.group_id:
                group = row.group_id
                raise InvalidParameterError(
                    f"snapshot {snapshot_id} belongs to group snapshot {group}; delete the group instead"
                )
            with files.doomed([path]):
                self._store.delete_snapshot(snapshot_id)

    def get(self, snapshot_id: str) -> Snapshot:
        self._layout.snapshot_file(snapshot_id)
        row = self._store.snapshot(snapshot_id)
        if row is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        return self._record(row)

    def page(
        self, snapshot_id: str, source_volume_id: str, max_entries: int, starting_token: str
    ) -> Page[Snapshot]:
        after = page_start(starting_token, SNAPSHOT_TOKEN, lambda: self._store.issued("snapshots"))
        if (snapshot_id and not SNAPSHOT_ID.fullmatch(snapshot_id)) or (
            source_volume_id and not VOLUME_ID.fullmatch(source_volume_id)
        ):
            return Page(items=())
        rows = self._store.snapshots(
            after_seq=after,
            limit=max_entries + 1 if max_entries else -1,
            snapshot_id=snapshot_id,
            source_volume_id=source_volume_id,
        )
        more = bool(max_entries) and len(rows) > max_entries
        rows = rows[:max_entries] if max_entries else rows
        token = f"{SNAPSHOT_TOKEN_PREFIX}{rows[-1].seq}" if more else ""
        return Page(items=tuple(self._record(r) for r in rows), next_token=token)

    # ---- group snapshots

    def _group(self, group: GroupRow) -> GroupSnapshot:
        members = tuple(self._record(r) for r in self._store.group_members(group.id))
        return GroupSnapshot(id=group.id, name=group.name, snapshots=members, created_at=group.created)

    def create_group(
        self, name: str, volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> GroupSnapshot:
        """Every member is copied inside one critical section that holds all members' locks, so no
        expand, delete or other snapshot of a member interleaves, and with every member's staged
        filesystem frozen, so the copies are one crash-consistent instant (quiesce.py). A member whose
        writes cannot be held (published as a raw block device; in the split layout, no node plugin
        answering) -> FailedPreconditionError, unless the `consistency: best-effort` parameter accepts
        a snapshot that is not crash-consistent. The normalised parameters are recorded with the group
        and compared when its name is created again (_same_group)."""
        consistency = _consistency(GROUP, parameters)
        existing = self._store.group_by_name(name)
        if existing is not None:
            _same_group(existing, volume_ids, consistency)
            return self._group(existing)
        if len(set(volume_ids)) != len(volume_ids):
            raise InvalidParameterError("source_volume_ids contains duplicates")
        for v in volume_ids:
            self._layout.volume_file(v)
        try:
            group = self._take_group(name, tuple(volume_ids), consistency)
        except NameTaken:
            return self.create_group(name, volume_ids, parameters)
        failpoints.hit("local.group-snapshot.recorded")
        return self._group(group)

    def _take_group(self, name: str, volume_ids: tuple[str, ...], consistency: dict[str, str]) -> GroupRow:
        """One snapshot file per member volume, all under the members' locks and with their filesystems
        frozen for the copies alone, stamped with the instant of the freeze, and recorded before the
        locks go; none left on failure. Lost name race -> NameTaken."""
        with self._locks.hold(*volume_ids):
            rows = [self._store.existing_volume(v) for v in volume_ids]
            sources = {r.id: self._layout.volume_file(r.id) for r in rows}
            files.check_room(list(sources.values()), self._layout.snapshots_dir)
            with self._held(GROUP, name, sources, consistency):
                failpoints.hit("local.group-snapshot.frozen")
                group = GroupRow(
                    new_id(GROUP_PREFIX), name, volume_ids, self._instant(volume_ids), consistency
                )
                members = self._copy_all(group, rows)
            self._insert(members, group)
        return group

    def _copy_all(self, group: GroupRow, rows: Sequence[VolumeRow]) -> list[SnapshotRow]:
        members: list[SnapshotRow] = []
        try:
            for row in rows:
                snap_id = new_id(SNAPSHOT_PREFIX)
                files.copy(self._layout.volume_file(row.id), self._layout.snapshot_file(snap_id))
                members.append(SnapshotRow(0, snap_id, "", row.id, row.size, group.created, group.id))
                failpoints.hit("local.group-snapshot.member-copied")
        except BaseException as exc:
            self._remove(members)
            if isinstance(exc, FileNotFoundError):
                raise FailedPreconditionError("the backing file of a member volume is missing") from exc
            raise
        return members

    def _remove(self, members: Sequence[SnapshotRow]) -> None:
        for m in members:
            files.remove(self._layout.snapshot_file(m.id))

    def delete_group(self, group_id: str) -> None:
        if not GROUP_ID.fullmatch(group_id) or self._store.group(group_id) is None:
            raise NotFoundError(f"group snapshot {group_id!r} not found")
        ids = [m.id for m in self._store.group_members(group_id)]
        with self._locks.hold(*ids), files.doomed([self._layout.snapshot_file(i) for i in ids]):
            self._store.delete_group(group_id)  # under the members' locks, as delete

    def get_group(self, group_id: str) -> GroupSnapshot:
        group = self._store.group(group_id) if GROUP_ID.fullmatch(group_id) else None
        if group is None:
            raise NotFoundError(f"group snapshot {group_id!r} not found")
        return self._group(group)


class SnapshotOperations(SnapshotDelegation):
    """The snapshot and group snapshot operations of the Backend interface, answered by LocalSnapshots."""

    _snapshots: LocalSnapshots

    def create_group_snapshot(
        self, name: str, volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> GroupSnapshot:
        return self._snapshots.create_group(name, volume_ids, parameters)

    def delete_group_snapshot(self, group_id: str) -> None:
        self._snapshots.delete_group(group_id)

    def get_group_snapshot(self, group_id: str) -> GroupSnapshot:
        return self._snapshots.get_group(group_id)
