"""The embedded default backend: volumes are sparse files in the data dir, attached through loop devices.

Layout and id formats: layout.py. Snapshots, clones and restores are block-sharing copies (files.copy).
Ids are generated in a fixed format and checked on every call: anything else is NotFoundError before
any file is touched.

Durability: a backing file is written before its record is committed, and set aside (files.doomed)
before its record is deleted, so start-up reconciliation (startup.reconcile) can clear away files
without a record (an interrupted create: removed when blank, else quarantined), finish a cut delete,
and grow files shorter than their record (an interrupted expand, or lost data, which health.py then
reports). A record whose file vanished is reported INACCESSIBLE.

Parameters: params.py. Snapshots and group snapshots: snapshots.py. Loop devices (the node side):
devices.py. What happens before a data dir is served: startup.py. Health and changed blocks:
reporting.py (health.py, cbt.py).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Self

from csi import keys
from csi.backends.base import EMPTY, Backend, BackendCapabilities, Disk, DiskOptions, NodeIdentity, Page
from csi.backends.local import contents, files, params, reaper, records, startup
from csi.backends.local.cbt import BLOCK_SIZE, LocalBlocks
from csi.backends.local.devices import LoopDevices
from csi.backends.local.freeze_service import FreezeServer, RemoteQuiescer
from csi.backends.local.health import LocalHealth
from csi.backends.local.layout import (
    VOLUME_TOKEN,
    VOLUME_TOKEN_PREFIX,
    Layout,
    new_id,
    page_start,
    volume_prefix,
)
from csi.backends.local.quiesce import LocalQuiescer, Quiescer
from csi.backends.local.reporting import LocalReporting
from csi.backends.local.reserve import Reserve
from csi.backends.local.room import Room
from csi.backends.local.rows import AttachmentRow, VolumeRow
from csi.backends.local.snapshots import LocalSnapshots, SnapshotOperations
from csi.backends.local.state import NameTaken, Store, still_published
from csi.backends.local.topology import Segment
from csi.failures import (
    AlreadyExistsError,
    FailedPreconditionError,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
)
from csi.keylocks import KeyedLocks
from shim import failpoints

if TYPE_CHECKING:
    from csi.config import Config

DEFAULT_DRIVER_NAME = "local.csi.ballast.dev"
DEFAULT_MAX_VOLUMES = 128  # loop devices are cheap; kernels allow far more


def capabilities(topology_keys: tuple[str, ...], max_volumes: int) -> BackendCapabilities:
    """Everything a data dir of files and loop devices can do."""
    return BackendCapabilities(
        snapshots=True,
        clone=True,
        expand_online=True,
        expand_offline=True,
        attach_required=True,
        block_multi_attach=True,
        get_capacity=True,
        modify_volume=True,
        group_snapshots=True,
        volume_health=True,
        node_volume_health=True,
        storage_health=True,
        snapshot_topology=True,
        snapshot_metadata=True,
        metadata_block_size=BLOCK_SIZE,
        single_node_multi_writer=True,
        topology_keys=topology_keys,
        max_volumes_per_node=max_volumes,
    )


class LocalBackend(LocalReporting, SnapshotOperations, Backend):
    """Volumes of one data dir. Build it with `open` (or `from_config`); the constructor has no side
    effects and takes the already opened state."""

    default_driver_name = DEFAULT_DRIVER_NAME

    def __init__(
        self,
        layout: Layout,
        store: Store,
        *,
        owner: int | None = None,
        driver_name: str = DEFAULT_DRIVER_NAME,
        zone: str = "local",
        region: str = "",
        capacity_bytes: int = 0,
        node_id: str = "",
        max_volumes_per_node: int = 0,
        loop: ModuleType | Any = None,
        quiescer: Quiescer | None = None,
    ) -> None:
        self.layout = layout
        self.store = store
        self._owner = owner  # the owner-lock fd of a reconciling process, closed by close()
        self.node_id = node_id
        self.max_volumes = max_volumes_per_node or DEFAULT_MAX_VOLUMES
        self.volume_prefix = volume_prefix(driver_name)
        self._params = params.Parameters(driver_name)
        self._segment = Segment(driver_name, zone, region)
        self.topology = self._segment.labels
        self.capabilities = capabilities(tuple(self.topology), self.max_volumes)
        self.room = Room(layout.volumes_dir, store, capacity_bytes, self.capabilities.size_granularity)
        self._devices = LoopDevices(loop)
        self._locks = KeyedLocks()
        # Group snapshots freeze their members here, or ask the node plugin (freeze_service.py).
        self._snapshots = LocalSnapshots(
            layout, store, self._locks, self._segment, quiescer or LocalQuiescer(loop=loop)
        )
        self._freeze_server: FreezeServer | None = None
        self.health = LocalHealth(layout, store)
        self.blocks = LocalBlocks(layout, store)

    @classmethod
    def open(cls, data_dir: str, *, reconcile: bool = True, **options: Any) -> Self:
        """Create the data dir if needed, check and open its state, and (`reconcile`) take the owner lock
        and reconcile the files with the state, then keep the space reserve (reserve.py; any process
        releases it first on a full disk). Only one process may reconcile: a second could remove a
        file the first is creating. `options` are the constructor's keywords."""
        layout = Layout(data_dir)
        layout.create()
        owner = startup.lock_data_dir(layout, "controller") if reconcile else None
        reserve, store = Reserve(layout.reserve_file), None
        try:
            reserve.make_room()  # on a full disk SQLite needs room to open the database at all
            startup.check_state(layout)  # unreadable, or lost while files exist: refuse rather than reconcile
            store = Store(layout.state_db, reserve if reconcile else None)  # kept by the data dir's owner
            if reconcile:
                startup.reconcile(layout, store)
                reserve.keep()
        except BaseException:
            if store is not None:
                store.close()
            if owner is not None:
                os.close(owner)
            raise
        return cls(layout, store, owner=owner, **options)

    @classmethod
    def from_config(cls, config: Config) -> Self:
        """Reconciles files against the database only in a process serving the controller: a node-only
        process sharing the data dir must not remove a file the controller is creating. A process that
        stages volumes thaws what a killed one left frozen; a controller without the node (the chart's
        split layout) freezes group snapshot members through the node plugin's freeze service."""
        b, n = config.backend, config.node
        split = config.runs_controller != config.runs_node
        backend = cls.open(
            b.data_dir,
            reconcile=config.runs_controller,
            driver_name=b.driver_name,
            zone=b.zone,
            region=b.region,
            capacity_bytes=b.capacity_bytes,
            node_id=n.node_id,
            max_volumes_per_node=n.max_volumes_per_node,
            quiescer=RemoteQuiescer(Layout(b.data_dir)) if split and config.runs_controller else None,
        )
        if config.runs_node:
            try:
                backend._freeze_server = startup.prepare_node(backend.layout, serve_freezes=split)
            except BaseException:
                backend.close()
                raise
        return backend

    # ---- lifecycle

    def volume_path(self, volume_id: str) -> str:
        """Backing file of a volume id; a malformed id -> NotFoundError."""
        return self.layout.volume_file(volume_id)

    def _row(self, volume_id: str) -> VolumeRow:
        self.layout.volume_file(volume_id)
        return self.store.existing_volume(volume_id)

    def probe(self) -> bool:
        if not os.access(self.layout.volumes_dir, os.W_OK):
            raise FailedPreconditionError(f"data dir {self.layout.volumes_dir} is not writable")
        return True

    def close(self) -> None:
        """Stop serving; the deleted files still being removed are removed first (reaper.py)."""
        reaper.REAPER.settle()
        if self._freeze_server is not None:
            self._freeze_server.close()
            self._freeze_server = None
        self.store.close()
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return self._params.validate(parameters)

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return self._params.validate_mutable(parameters)

    # ---- volumes

    def _existing(self, row: VolumeRow, wanted: dict[str, Any], options: DiskOptions) -> Disk:
        """The volume a repeated create names, if compatible: the same recorded arguments, and accessible
        from the request's requisite topology (AlreadyExistsError otherwise)."""
        records.check_same(row, wanted, options)
        self._segment.check_existing(row.name, row.id, options.requisite)
        return self._disk(row)

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        options = contents.fitted(self.store, options, self.capabilities.size_granularity)
        spec = records.spec(options)
        row = self.store.volume_by_name(name)
        if row is not None:
            return self._existing(row, spec, options)
        self._segment.check_requisite(options.requisite)
        self.room.check_limit(options.size_bytes)
        self._params.check_size(options.parameters, options.size_bytes)
        self.room.check_space(options.size_bytes, options.size_bytes, OutOfCapacityError)
        volume_id = new_id(self.volume_prefix)
        path = self.volume_path(volume_id)
        written, recorded = contents.CREATE_FAILPOINTS[options.source.kind if options.source else None]
        # the file first: reconcile clears it away if no record follows
        first = contents.file_first(self.layout, path, options, lambda: failpoints.hit(written))
        if first is None:  # a copy: written (and synced) here, outside the shared batch
            hold = functools.partial(self._snapshots.clone_hold, name)
            contents.write_volume_file(self.layout, self.store, self._locks, path, options, hold)
            failpoints.hit(written)
        try:
            row = self.store.insert_volume(
                volume_id,
                name,
                options.size_bytes,
                spec,
                dict(options.mutable_parameters),
                time.time(),
                capacity_limit=self.room.limit,
                first=first,
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
            return self._existing(winner, spec, options)
        failpoints.hit(recorded)
        return self._disk(row, attachments=())  # new: attached nowhere yet

    def delete_volume(self, volume_id: str) -> None:
        """Already deleted -> NotFoundError (DeleteVolume answers OK). Still published, or its file still
        bound to a loop device -> FailedPreconditionError: the loop device is this backend's attachment
        on its host, which a force-detach (ControllerUnpublishVolume without NodeUnstageVolume) leaves in
        place, and unlinking the file under it would leave a filesystem mounted over a deleted file (EBS
        refuses to delete an attached volume alike: VolumeInUse). An attach binding a loop device over
        the file right now -> BusyError (devices.unused); a refused delete leaves the file in place."""
        path = self.volume_path(volume_id)
        with self._locks.hold(volume_id):  # which attach() takes: no publish between check and rename
            self._row(volume_id)  # a volume already deleted is not in use: NotFoundError
            nodes = [a.node_id for a in self.store.attachments([volume_id]).get(volume_id, [])]
            if nodes:  # refused before the file is touched: CSI "not altered in any way"
                raise still_published(volume_id, nodes)
            with self._devices.unused(volume_id, path), files.doomed([path]):
                self.store.delete_volume(volume_id)
                failpoints.hit("local.delete.recorded")
            failpoints.hit("local.delete.removed")

    def _disk(self, row: VolumeRow, attachments: Sequence[AttachmentRow] | None = None) -> Disk:
        if attachments is None:
            attachments = self.store.attachments([row.id]).get(row.id, [])
        return records.to_disk(row, attachments, self.volume_path(row.id), self.topology)

    def get_volume(self, volume_id: str) -> Disk:
        return self._disk(self._row(volume_id))

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        after = page_start(starting_token, VOLUME_TOKEN, lambda: self.store.issued("volumes"))
        rows = self.store.volumes(after, max_entries + 1 if max_entries else -1)
        more = bool(max_entries) and len(rows) > max_entries
        rows = rows[:max_entries] if max_entries else rows
        atts = self.store.attachments([r.id for r in rows]) if rows else {}
        disks = tuple(self._disk(r, atts.get(r.id, [])) for r in rows)
        return Page(items=disks, next_token=f"{VOLUME_TOKEN_PREFIX}{rows[-1].seq}" if more else "")

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        path = self.volume_path(volume_id)
        with self._locks.hold(volume_id):
            row = self._row(volume_id)
            if size_bytes <= row.size:
                return row.size
            self.room.check_space(size_bytes, size_bytes - row.size, OutOfRangeError)
            self.health.ledger.begin_growth(volume_id, row.size)  # start-up: a torn expand lost nothing
            try:  # record first (reconcile finishes a torn expand), checked against --capacity as it is
                self.store.set_size(volume_id, size_bytes, capacity_limit=self.room.limit)
            except BaseException:
                self.health.ledger.end_growth(volume_id)  # refused or rolled back: no expand in progress
                raise
            failpoints.hit("local.expand.recorded")
            try:
                files.grow(path, size_bytes)
            except FileNotFoundError as exc:
                raise FailedPreconditionError(f"the backing file of {volume_id} is missing") from exc
            except OutOfRangeError:
                self.store.set_size(volume_id, row.size)  # the file cannot grow that far: undo the record
                raise
            finally:
                self.health.ledger.end_growth(volume_id)
            failpoints.hit("local.expand.grown")
            return size_bytes

    def modify_volume(
        self, volume_id: str, mutable_parameters: Mapping[str, str], metadata: Mapping[str, str] = EMPTY
    ) -> Disk:
        """The claim's `metadata` labels nothing: a volume file carries no tags."""
        with self._locks.hold(volume_id):
            row = self._row(volume_id)
            self.store.set_mutable(volume_id, {**row.mutable, **mutable_parameters})
            return self.get_volume(volume_id)

    def get_capacity(self, parameters: Mapping[str, str], topology: Mapping[str, str] | None) -> int:
        """Room.largest, for a topology this data dir serves (0 for any other)."""
        if topology and not self._segment.serves(topology):
            return 0
        return self.room.largest()

    # ---- attachment

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        path = self.volume_path(volume_id)
        row = self._row(volume_id)
        if node_id != self.node_id:
            raise NotFoundError(f"node {node_id!r} not found (this data dir serves node {self.node_id!r})")
        multi_node = bool(row.spec.get("multi_node"))
        try:
            with self._locks.hold(volume_id):  # delete_volume checks for attachments under it
                self.store.attach(volume_id, node_id, readonly, multi_node=multi_node, limit=self.max_volumes)
        except ValueError:
            raise AlreadyExistsError(
                f"volume {volume_id} is already published to {node_id} with readonly={not readonly}"
            ) from None
        failpoints.hit("local.attach.recorded")
        return {keys.PC_VOLUME_FILE: path}

    def detach(self, volume_id: str, node_id: str) -> None:
        self._row(volume_id)
        self.store.detach(volume_id, node_id)
        failpoints.hit("local.detach.recorded")

    # ---- node side

    def node_identity(self) -> NodeIdentity:
        return NodeIdentity(node_id=self.node_id, max_volumes=self.max_volumes, topology=dict(self.topology))

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """Attach (or reuse) a loop device over the volume's file and prove it maps that file."""
        path = self.volume_path(volume_id)
        return self._devices.resolve(volume_id, path, self._row(volume_id).size, publish_context)

    def prepared_device(self, volume_id: str) -> str | None:
        """The loop device already bound over the volume's file, or None; binds nothing."""
        path = self.volume_path(volume_id)
        return self._devices.prepared(volume_id, path, self._row(volume_id).size)

    def never_written(self, volume_id: str) -> bool:
        """The backing file has no data extent at all (SEEK_DATA finds none): every byte reads zero."""
        return files.has_no_data(self.volume_path(volume_id))

    def leftover_device(self, volume_id: str) -> str | None:
        """The loop device still bound over the volume's file path, or over a file since unlinked from
        it, whatever the record says (it may be gone); binds nothing."""
        users = self._devices.leftovers(self.volume_path(volume_id))
        return users[0] if users else None

    def release_device(self, volume_id: str) -> None:
        self._devices.release(self.volume_path(volume_id))
