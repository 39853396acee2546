"""The embedded default backend: volumes are sparse files in the data dir, attached through loop devices.

Layout: `<data-dir>/state.db` (SQLite, see local_state), `<data-dir>/volumes/lv-<32 hex>.img`,
`<data-dir>/snapshots/ls-<32 hex>.img`. Snapshots, clones and restores are block-sharing copies
(local_files.copy). Ids are generated here in a fixed format and checked on every call: anything else is
NotFoundError before any file is touched.

Durability: a backing file is written before its record is committed, and a record is deleted before its
file, so start-up reconciliation (`reconcile`) can remove files without a record (an interrupted create or
delete) and grow files shorter than their record (an interrupted expand). A record whose file vanished is
reported as an abnormal condition.

Mutable parameters (CreateVolume.mutable_parameters, ControllerModifyVolume) are recorded as metadata:
`iops` (1..1000000), `throughput` (MiB/s, 1..100000) and `tier` (standard | performance).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from csi import keys
from csi.backends import aws_params as ebs_params
from csi.backends import local_files as files
from csi.backends.base import (
    AlreadyExistsError,
    Attachment,
    Backend,
    BackendCapabilities,
    Condition,
    ContentSource,
    Disk,
    DiskOptions,
    FailedPreconditionError,
    GroupSnapshot,
    InvalidParameterError,
    InvalidTokenError,
    NodeIdentity,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
    Page,
    Snapshot,
    SourceKind,
)
from csi.backends.local_state import AttachmentRow, GroupRow, NameTaken, SnapshotRow, Store, VolumeRow
from csi.recovery import check_state, lock_data_dir

if TYPE_CHECKING:
    from csi.config import Config

VOLUME_ID = re.compile(r"(?:lv|vol)-[0-9a-f]{32}")  # vol-: EBS spelling, see `volume_prefix`
SNAPSHOT_ID = re.compile(r"ls-[0-9a-f]{32}")
GROUP_ID = re.compile(r"lg-[0-9a-f]{32}")
VOLUME_TOKEN = re.compile(r"lvt-([0-9]{1,18})")
SNAPSHOT_TOKEN = re.compile(r"lst-([0-9]{1,18})")


def _token() -> str:
    """32 random hex digits for a new id, the format VOLUME_ID, SNAPSHOT_ID and GROUP_ID check."""
    return os.urandom(16).hex()


DEFAULT_MAX_VOLUMES = 128  # loop devices are cheap; kernels allow far more


def _bounded_int(low: int, high: int) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not value.isdigit() or not low <= int(value) <= high:
            raise ValueError(f"a whole number from {low} to {high}")
        return str(int(value))

    return parse


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"one of {', '.join(allowed)}")
        return value

    return parse


# Mutable parameter -> parser returning the normalised value or raising ValueError("expected ...").
MUTABLE_PARAMETERS: dict[str, Callable[[str], str]] = {
    "iops": _bounded_int(1, 1_000_000),
    "throughput": _bounded_int(1, 100_000),
    "tier": _choice("standard", "performance"),
}


class _VolumeLock:
    """A per-volume lock and how many threads hold or wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class LocalBackend(Backend):
    def __init__(
        self,
        data_dir: str,
        *,
        driver_name: str = "local.csi.ballast.dev",
        zone: str = "local",
        region: str = "",
        capacity_bytes: int = 0,
        node_id: str = "",
        max_volumes_per_node: int = 0,
        reconcile: bool = True,
        loop: ModuleType | Any = None,
    ) -> None:
        self.data_dir = data_dir
        self.volumes_dir = os.path.join(data_dir, "volumes")
        self.snapshots_dir = os.path.join(data_dir, "snapshots")
        for d in (data_dir, self.volumes_dir, self.snapshots_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        self.capacity_limit = capacity_bytes
        self.node_id = node_id
        self.max_volumes = max_volumes_per_node or DEFAULT_MAX_VOLUMES
        # Standing in for EBS (deployed as ebs.csi.aws.com, the driver in-tree aws-ebs migration hands
        # volumes to), the backend takes EBS's StorageClass and VolumeAttributesClass parameters, checks
        # them as EBS does, records them, and hands out EBS-like ids so `aws://<zone>/vol-...` handles
        # translate.
        self.ebs_standin = driver_name == ebs_params.DRIVER_NAME
        self.volume_prefix = "vol-" if self.ebs_standin else "lv-"
        self.topology = {keys.topology_zone_key(driver_name): zone}
        if region:
            self.topology[keys.topology_region_key(driver_name)] = region
        # What each accepted topology key means here: our own keys plus the well-known and legacy
        # labels that in-tree translation and operators use.
        self._segment = {
            **dict.fromkeys((keys.WELL_KNOWN_ZONE, keys.LEGACY_ZONE), zone),
            **dict.fromkeys((keys.WELL_KNOWN_REGION, keys.LEGACY_REGION), region),
            **self.topology,
        }
        self.capabilities = BackendCapabilities(
            snapshots=True,
            clone=True,
            expand_online=True,
            expand_offline=True,
            attach_required=True,
            block_multi_attach=True,
            get_capacity=True,
            modify_volume=True,
            group_snapshots=True,
            volume_condition=True,
            single_node_multi_writer=True,
            topology_keys=tuple(self.topology),
            max_volumes_per_node=self.max_volumes,
        )
        self._loop = loop
        self._locks: dict[str, _VolumeLock] = {}
        self._locks_guard = threading.Lock()
        # Only one process may reconcile: a second could remove a file the first is creating.
        self._owner = lock_data_dir(data_dir, "controller") if reconcile else None
        try:
            check_state(data_dir)  # unreadable, or lost while files exist: refuse rather than reconcile
            self.store = Store(os.path.join(data_dir, "state.db"))
            if reconcile:
                self.reconcile()
        except BaseException:
            self._release_owner()
            raise

    @classmethod
    def from_config(cls, config: Config) -> LocalBackend:
        """Reconciles files against the database only in a process serving the controller: a node-only
        process sharing the data dir must not remove a file the controller is creating."""
        b, n = config.backend, config.node
        return cls(
            b.data_dir,
            driver_name=b.driver_name,
            zone=b.zone,
            region=b.region,
            capacity_bytes=b.capacity_bytes,
            node_id=n.node_id,
            max_volumes_per_node=n.max_volumes_per_node,
            reconcile=config.runs_controller,
        )

    # ---- paths, ids, locks

    def volume_path(self, volume_id: str) -> str:
        """Backing file of a volume id; a malformed id -> NotFoundError (never a path outside the dir)."""
        if not VOLUME_ID.fullmatch(volume_id):
            raise NotFoundError(f"volume {volume_id!r} not found (not an id issued by this driver)")
        return os.path.join(self.volumes_dir, f"{volume_id}.img")

    def snapshot_path(self, snapshot_id: str) -> str:
        if not SNAPSHOT_ID.fullmatch(snapshot_id):
            raise NotFoundError(f"snapshot {snapshot_id!r} not found (not an id issued by this driver)")
        return os.path.join(self.snapshots_dir, f"{snapshot_id}.img")

    @contextmanager
    def _locked(self, *ids: str) -> Iterator[None]:
        """Serialise file changes per volume; several ids are taken in sorted order (no deadlock).
        A lock lives only while someone holds or waits for it, so the table does not grow."""
        keys_ = sorted(set(ids))
        with self._locks_guard:
            entries = [self._locks.setdefault(k, _VolumeLock()) for k in keys_]
            for entry in entries:
                entry.users += 1
        try:
            with ExitStack() as stack:
                for entry in entries:
                    stack.enter_context(entry.lock)
                yield
        finally:
            with self._locks_guard:
                for k, entry in zip(keys_, entries, strict=True):
                    entry.users -= 1
                    if not entry.users:
                        del self._locks[k]

    def _row(self, volume_id: str) -> VolumeRow:
        self.volume_path(volume_id)
        row = self.store.volume(volume_id)
        if row is None:
            raise NotFoundError(f"volume {volume_id} not found")
        return row

    # ---- lifecycle

    def reconcile(self) -> None:
        """Remove backing files without a committed record; grow files shorter than their record."""
        for directory, known, pattern in (
            (self.volumes_dir, self.store.volume_ids(), VOLUME_ID),
            (self.snapshots_dir, self.store.snapshot_ids(), SNAPSHOT_ID),
        ):
            for entry in os.listdir(directory):
                stem = entry.removesuffix(".img")
                if not (entry.endswith(".img") and pattern.fullmatch(stem) and stem in known):
                    files.remove(os.path.join(directory, entry))
        for row in self.store.volumes():
            size = files.size_of(self.volume_path(row.id))
            if size is not None and size < row.size:
                try:
                    files.grow(self.volume_path(row.id), row.size)
                except OutOfRangeError:  # an expand past the largest file, torn before its undo
                    self.store.set_size(row.id, size)

    def probe(self) -> bool:
        if not os.access(self.volumes_dir, os.W_OK):
            raise FailedPreconditionError(f"data dir {self.volumes_dir} is not writable")
        return True

    def close(self) -> None:
        self.store.close()
        self._release_owner()

    def _release_owner(self) -> None:
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        """The local backend takes no StorageClass parameters of its own; standing in for EBS it takes
        (and refuses) exactly what EBS does."""
        if self.ebs_standin:
            return ebs_params.validate(parameters)
        if parameters:
            raise InvalidParameterError(
                f"unknown parameter(s) for the local backend: {', '.join(sorted(parameters))}"
            )
        return {}

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        if self.ebs_standin:
            return ebs_params.validate_mutable(parameters)
        out: dict[str, str] = {}
        for key, value in sorted(parameters.items()):
            parser = MUTABLE_PARAMETERS.get(key)
            if parser is None:
                raise InvalidParameterError(
                    f"unknown mutable parameter {key!r}; supported: {', '.join(sorted(MUTABLE_PARAMETERS))}"
                )
            try:
                out[key] = parser(value)
            except ValueError as exc:
                raise InvalidParameterError(f"mutable parameter {key}={value!r}: expected {exc}") from exc
        return out

    # ---- volumes

    @staticmethod
    def _spec(options: DiskOptions) -> dict[str, Any]:
        src = options.source
        return {
            "size": options.size_bytes,
            "parameters": dict(options.parameters),
            "context": dict(options.context),
            "mutable": dict(options.mutable_parameters),
            "source": [src.kind.value, src.id] if src else None,
            "multi_node": options.multi_node,
        }

    def _existing(self, row: VolumeRow, spec: dict[str, Any]) -> Disk:
        if row.spec != spec:
            differs = sorted(k for k in spec if row.spec.get(k) != spec[k])
            raise AlreadyExistsError(
                f"volume {row.name!r} already exists ({row.id}) with a different {', '.join(differs)}"
            )
        return self._disk(row)

    def _serves(self, segment: Mapping[str, str]) -> bool:
        """True when every key of a topology segment names this data dir's zone/region."""
        return all(v and self._segment.get(k) == v for k, v in segment.items())

    def _place(self, options: DiskOptions) -> None:
        if options.requisite and not any(self._serves(s) for s in options.requisite):
            raise OutOfCapacityError(
                f"no requisite topology segment is served by this data dir (it serves {self.topology})"
            )

    def _source_file(self, source: ContentSource, size: int) -> tuple[str, str]:
        """(path, volume id to lock) of a content source; missing -> NotFound, bigger -> OutOfRange."""
        if source.kind is SourceKind.SNAPSHOT:
            path = self.snapshot_path(source.id)
            snap = self.store.snapshot(source.id)
            if snap is None:
                raise NotFoundError(f"source snapshot {source.id} not found")
            src_size, lock = snap.size, ""
        else:
            row = self._row(source.id)
            path, src_size, lock = self.volume_path(source.id), row.size, source.id
        if src_size > size:
            raise OutOfRangeError(
                f"source {source.kind.value} {source.id} is {src_size} bytes, "
                f"larger than the requested {size}"
            )
        return path, lock

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        spec = self._spec(options)
        row = self.store.volume_by_name(name)
        if row is not None:
            return self._existing(row, spec)
        self._place(options)
        if self.ebs_standin:  # what EBS would refuse for this size: out-of-range size, too few IOPS
            ebs_params.create_arguments(options.parameters, ebs_params.gib(options.size_bytes))
        if self.capacity_limit:
            used = self.store.provisioned_bytes()
            if used + options.size_bytes > self.capacity_limit:
                raise OutOfCapacityError(
                    f"{options.size_bytes} bytes requested, {max(0, self.capacity_limit - used)} of the "
                    f"--capacity limit {self.capacity_limit} left"
                )
        volume_id = self.volume_prefix + _token()
        path = self.volume_path(volume_id)
        if options.source is None:
            files.create_sparse(path, options.size_bytes)
        else:
            src, lock = self._source_file(options.source, options.size_bytes)
            with self._locked(*([lock] if lock else [])):
                try:
                    files.copy(src, path, options.size_bytes)
                except FileNotFoundError as exc:
                    raise FailedPreconditionError(
                        f"the backing file of source {options.source.id} is missing"
                    ) from exc
        try:
            row = self.store.insert_volume(
                volume_id,
                name,
                options.size_bytes,
                spec,
                dict(options.mutable_parameters),
                time.time(),
                capacity_limit=self.capacity_limit,
            )
        except OutOfCapacityError:
            files.remove(path)
            raise
        except NameTaken:
            files.remove(path)
            winner = self.store.volume_by_name(name)
            if winner is None:  # the winner was deleted meanwhile; the caller may retry
                raise AlreadyExistsError(
                    f"volume {name!r} is being created and deleted concurrently"
                ) from None
            return self._existing(winner, spec)
        return self._disk(row)

    def delete_volume(self, volume_id: str) -> None:
        path = self.volume_path(volume_id)
        with self._locked(volume_id):
            self.store.delete_volume(volume_id)
            files.remove(path)

    def _condition(self, row: VolumeRow) -> Condition:
        size = files.size_of(self.volume_path(row.id))
        if size is None:
            return Condition(abnormal=True, message=f"backing file of {row.id} is missing")
        if size < row.size:
            return Condition(abnormal=True, message=f"backing file is {size} bytes, expected {row.size}")
        return Condition()

    def _disk(self, row: VolumeRow, attachments: Sequence[AttachmentRow] | None = None) -> Disk:
        if attachments is None:
            attachments = self.store.attachments([row.id]).get(row.id, [])
        src = row.spec.get("source")
        path = self.volume_path(row.id)
        return Disk(
            id=row.id,
            name=row.name,
            size_bytes=row.size,
            topology=dict(self.topology),
            parameters={**row.spec.get("parameters", {}), **row.mutable},
            volume_context=dict(row.spec.get("context", {})),
            source=ContentSource(SourceKind(src[0]), src[1]) if src else None,
            attachments=tuple(
                Attachment(a.node_id, a.readonly, {keys.PC_VOLUME_FILE: path}) for a in attachments
            ),
            condition=self._condition(row),
            multi_node=bool(row.spec.get("multi_node")),
        )

    def get_volume(self, volume_id: str) -> Disk:
        return self._disk(self._row(volume_id))

    @staticmethod
    def _after(token: str, pattern: re.Pattern[str]) -> int:
        if not token:
            return 0
        m = pattern.fullmatch(token)
        if m is None:
            raise InvalidTokenError(f"starting_token {token!r} was not issued by this driver")
        return int(m.group(1))

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        after = self._after(starting_token, VOLUME_TOKEN)
        rows = self.store.volumes(after, max_entries + 1 if max_entries else -1)
        more = bool(max_entries) and len(rows) > max_entries
        rows = rows[:max_entries] if max_entries else rows
        atts = self.store.attachments([r.id for r in rows]) if rows else {}
        disks = tuple(self._disk(r, atts.get(r.id, [])) for r in rows)
        return Page(items=disks, next_token=f"lvt-{rows[-1].seq}" if more else "")

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        path = self.volume_path(volume_id)
        with self._locked(volume_id):
            row = self._row(volume_id)
            if size_bytes <= row.size:
                return row.size
            if self.capacity_limit:
                used = self.store.provisioned_bytes()
                if used - row.size + size_bytes > self.capacity_limit:
                    raise OutOfRangeError(f"growing to {size_bytes} bytes would exceed the --capacity limit")
            self.store.set_size(volume_id, size_bytes)  # record first: reconcile finishes a torn expand
            try:
                files.grow(path, size_bytes)
            except FileNotFoundError as exc:
                raise FailedPreconditionError(f"the backing file of {volume_id} is missing") from exc
            except OutOfRangeError:
                self.store.set_size(volume_id, row.size)  # the file cannot grow that far: undo the record
                raise
            return size_bytes

    def modify_volume(self, volume_id: str, mutable_parameters: Mapping[str, str]) -> Disk:
        with self._locked(volume_id):
            row = self._row(volume_id)
            self.store.set_mutable(volume_id, {**row.mutable, **mutable_parameters})
            return self.get_volume(volume_id)

    def get_capacity(self, parameters: Mapping[str, str], topology: Mapping[str, str] | None) -> int:
        if topology and not self._serves(topology):
            return 0
        free = files.free_bytes(self.volumes_dir)
        if self.capacity_limit:
            free = min(free, self.capacity_limit - self.store.provisioned_bytes())
        return max(0, free)

    # ---- attachment

    def _check_node(self, node_id: str) -> None:
        if node_id != self.node_id:
            raise NotFoundError(f"node {node_id!r} not found (this data dir serves node {self.node_id!r})")

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        path = self.volume_path(volume_id)
        row = self._row(volume_id)
        self._check_node(node_id)
        try:
            self.store.attach(
                volume_id,
                node_id,
                readonly,
                multi_node=bool(row.spec.get("multi_node")),
                limit=self.max_volumes,
            )
        except ValueError:
            raise AlreadyExistsError(
                f"volume {volume_id} is already published to {node_id} with readonly={not readonly}"
            ) from None
        return {keys.PC_VOLUME_FILE: path}

    def detach(self, volume_id: str, node_id: str) -> None:
        self._row(volume_id)
        self.store.detach(volume_id, node_id)

    # ---- snapshots

    def _snapshot(self, row: SnapshotRow) -> Snapshot:
        return Snapshot(
            id=row.id,
            name=row.name,
            source_volume_id=row.source_volume_id,
            size_bytes=row.size,
            created_at=row.created,
            group_id=row.group_id,
        )

    def create_snapshot(self, name: str, source_volume_id: str, parameters: Mapping[str, str]) -> Snapshot:
        if parameters:
            raise InvalidParameterError(
                f"unknown snapshot parameter(s) for the local backend: {', '.join(sorted(parameters))}"
            )
        existing = self.store.snapshot_by_name(name)
        if existing is not None:
            if existing.source_volume_id != source_volume_id:
                raise AlreadyExistsError(
                    f"snapshot {name!r} already exists for volume {existing.source_volume_id}"
                )
            return self._snapshot(existing)
        src = self.volume_path(source_volume_id)
        snapshot_id = "ls-" + _token()
        dst = self.snapshot_path(snapshot_id)
        with self._locked(source_volume_id):
            row = self._row(source_volume_id)
            try:
                files.copy(src, dst)
            except FileNotFoundError as exc:
                raise FailedPreconditionError(f"the backing file of {source_volume_id} is missing") from exc
            snap = SnapshotRow(0, snapshot_id, name, source_volume_id, row.size, time.time(), "")
        try:
            self.store.insert_snapshots([snap])
        except NameTaken:
            files.remove(dst)
            return self.create_snapshot(name, source_volume_id, parameters)
        return self._snapshot(snap)

    def delete_snapshot(self, snapshot_id: str) -> None:
        path = self.snapshot_path(snapshot_id)
        row = self.store.snapshot(snapshot_id)
        if row is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        if row.group_id:
            raise InvalidParameterError(
                f"snapshot {snapshot_id} belongs to group snapshot {row.group_id}; delete the group instead"
            )
        self.store.delete_snapshot(snapshot_id)
        files.remove(path)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        self.snapshot_path(snapshot_id)
        row = self.store.snapshot(snapshot_id)
        if row is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        return self._snapshot(row)

    def list_snapshots(
        self,
        *,
        snapshot_id: str = "",
        source_volume_id: str = "",
        max_entries: int = 0,
        starting_token: str = "",
    ) -> Page[Snapshot]:
        after = self._after(starting_token, SNAPSHOT_TOKEN)
        if (snapshot_id and not SNAPSHOT_ID.fullmatch(snapshot_id)) or (
            source_volume_id and not VOLUME_ID.fullmatch(source_volume_id)
        ):
            return Page(items=())
        rows = self.store.snapshots(
            after_seq=after,
            limit=max_entries + 1 if max_entries else -1,
            snapshot_id=snapshot_id,
            source_volume_id=source_volume_id,
        )
        more = bool(max_entries) and len(rows) > max_entries
        rows = rows[:max_entries] if max_entries else rows
        return Page(
            items=tuple(self._snapshot(r) for r in rows), next_token=f"lst-{rows[-1].seq}" if more else ""
        )

    # ---- group snapshots

    def _group(self, group: GroupRow) -> GroupSnapshot:
        members = tuple(self._snapshot(r) for r in self.store.group_members(group.id))
        return GroupSnapshot(id=group.id, name=group.name, snapshots=members, created_at=group.created)

    def create_group_snapshot(
        self, name: str, volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> GroupSnapshot:
        """Every member is copied inside one critical section that holds all members' locks, so no
        expand, delete or other snapshot of a member interleaves. The copies are one instant where the
        data dir supports reflink; otherwise writes arriving through a member's loop device during the
        copy are not held back (docs/install.md says so)."""
        if parameters:
            raise InvalidParameterError(
                f"unknown group snapshot parameter(s) for the local backend: {', '.join(sorted(parameters))}"
            )
        existing = self.store.group_by_name(name)
        if existing is not None:
            if sorted(existing.volume_ids) != sorted(volume_ids):
                raise AlreadyExistsError(f"group snapshot {name!r} already exists with other volumes")
            return self._group(existing)
        if len(set(volume_ids)) != len(volume_ids):
            raise InvalidParameterError("source_volume_ids contains duplicates")
        paths = {v: self.volume_path(v) for v in volume_ids}
        group_id, now = "lg-" + _token(), time.time()
        members: list[SnapshotRow] = []
        with self._locked(*volume_ids):
            rows = [self._row(v) for v in volume_ids]
            try:
                for row in rows:
                    snap_id = "ls-" + _token()
                    files.copy(paths[row.id], self.snapshot_path(snap_id))
                    members.append(SnapshotRow(0, snap_id, "", row.id, row.size, now, group_id))
            except BaseException as exc:
                for m in members:
                    files.remove(self.snapshot_path(m.id))
                if isinstance(exc, FileNotFoundError):
                    raise FailedPreconditionError("the backing file of a member volume is missing") from exc
                raise
        group = GroupRow(group_id, name, tuple(volume_ids), now)
        try:
            self.store.insert_snapshots(members, group)
        except NameTaken:
            for m in members:
                files.remove(self.snapshot_path(m.id))
            return self.create_group_snapshot(name, volume_ids, parameters)
        return self._group(group)

    def delete_group_snapshot(self, group_id: str) -> None:
        if not GROUP_ID.fullmatch(group_id) or self.store.group(group_id) is None:
            raise NotFoundError(f"group snapshot {group_id!r} not found")
        for snap_id in self.store.delete_group(group_id):
            files.remove(self.snapshot_path(snap_id))

    def get_group_snapshot(self, group_id: str) -> GroupSnapshot:
        group = self.store.group(group_id) if GROUP_ID.fullmatch(group_id) else None
        if group is None:
            raise NotFoundError(f"group snapshot {group_id!r} not found")
        return self._group(group)

    # ---- node side

    def node_identity(self) -> NodeIdentity:
        return NodeIdentity(node_id=self.node_id, max_volumes=self.max_volumes, topology=dict(self.topology))

    def _loop_module(self) -> Any:
        if self._loop is None:
            from csi import loop

            self._loop = loop
        return self._loop

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """Attach (or reuse) a loop device over the volume's file, refresh its size if the file grew,
        and prove the device maps that file before returning it."""
        path = self.volume_path(volume_id)
        row = self._row(volume_id)
        expected = publish_context.get(keys.PC_VOLUME_FILE)
        if expected and os.path.realpath(expected) != os.path.realpath(path):
            raise FailedPreconditionError(
                f"publish context names {expected!r}, but volume {volume_id} lives in {path}"
            )
        if files.size_of(path) is None:
            raise FailedPreconditionError(f"the backing file of {volume_id} is missing")
        loop = self._loop_module()
        device: str = loop.attach(path)
        if loop.device_size(device) < row.size:
            loop.refresh_capacity(device)
        backing = loop.backing_file(device)
        if backing is None or os.path.realpath(backing) != os.path.realpath(path):
            raise FailedPreconditionError(f"loop device {device} maps {backing!r}, not volume {volume_id}")
        return device

    def release_device(self, volume_id: str) -> None:
        self._loop_module().detach_file(self.volume_path(volume_id))
