"""The one shared in-memory Backend for unit tests.

FakeBackend honours every contract documented on csi.backends.base.Backend (idempotency by name,
not-found, attach rules, paging tokens, group snapshots) without touching the filesystem. Tests steer it
through plain attributes:

- `fail[method] = SomeBackendError("...")` makes the next call of `method` raise it (once);
- `nodes` is the set of known node ids (attach to anything else -> NotFoundError);
- `devices[volume_id]` is what resolve_device returns (default `/dev/fake-<volume_id>`);
- `calls` records (method, args) of every call, `released` the volume ids passed to release_device;
- `issues[volume_id]` are a volume's health issues (controller side), `storage_issues` the node's;
  `on_node[volume_id]` is the device prepared on this node (set by resolve_device, cleared by
  release_device), which prepared_device answers (absent: None);
- `block_ranges[snapshot_id]` / `block_deltas[(base, target)]` are the ranges the snapshot metadata
  operations serve (computed at `metadata_block_size`); `stream_failure` = (n, error) makes the next such
  stream raise `error` after n ranges.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from csi import failures, keys
from csi.backends import base
from csi.backends.base import (
    EMPTY,
    Attachment,
    BackendCapabilities,
    BlockMap,
    ContentSource,
    Disk,
    DiskOptions,
    GroupSnapshot,
    NodeIdentity,
    Page,
    Snapshot,
    SourceKind,
    seek_page,
)
from csi.config import Config
from csi.extents import Range, always
from csi.failures import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidParameterError,
    InvalidTokenError,
    LimitExceededError,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
)
from csi.health import Issue, StorageIssue, VolumeHealth

FAKE_ZONE_KEY = "topology.fake.csi.ballast.dev/zone"
FAKE_NODE = "node-1"
# Mutable parameters the fake accepts, with the values it allows (None: any positive integer).
FAKE_MUTABLE: dict[str, frozenset[str] | None] = {"iops": None, "tier": frozenset({"standard", "fast"})}


def all_capabilities(**overrides: Any) -> BackendCapabilities:
    """Every flag on (what the local backend advertises), with `overrides` applied."""
    caps = BackendCapabilities(
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
        metadata_block_size=4096,
        single_node_multi_writer=True,
        topology_keys=(FAKE_ZONE_KEY,),
        max_volumes_per_node=16,
    )
    return caps._replace(**overrides)


def _but_placement(options: DiskOptions) -> DiskOptions:
    """The options a repeated create must repeat: topology is compared as accessibility and the size as
    a fit (base.size_fits), not as equals."""
    return options._replace(requisite=(), preferred=(), size_bytes=0, size_range=None)


class FakeBackend(base.Backend):
    default_driver_name = "fake.csi.ballast.dev"

    def __init__(
        self,
        capabilities: BackendCapabilities | None = None,
        *,
        zone: str = "zone-a",
        node_id: str = FAKE_NODE,
        capacity: int = 1024 * base.GiB,
        backend_parameters: Sequence[str] = ("type",),
    ) -> None:
        self.capabilities = capabilities or all_capabilities()
        self.zone = zone
        self.node_id = node_id
        self.nodes = {node_id}
        self.capacity = capacity
        self.backend_parameters = frozenset(backend_parameters)
        self.fail: dict[str, failures.DriverError] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.devices: dict[str, str] = {}
        self.released: list[str] = []
        self.issues: dict[str, tuple[Issue, ...]] = {}
        self.storage_issues: list[StorageIssue] = []
        self.on_node: dict[str, str] = {}
        self.block_ranges: dict[str, list[Range]] = {}
        self.block_deltas: dict[tuple[str, str], list[Range]] = {}
        self.stream_failure: tuple[int, failures.DriverError] | None = None
        self.ready = True
        self.closed = False
        self.volumes: dict[str, Disk] = {}
        self.untouched: set[str] = set()  # volumes never_written() vouches for
        self.options: dict[str, DiskOptions] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.groups: dict[str, GroupSnapshot] = {}
        self._seq = itertools.count(1)
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, config: Config) -> FakeBackend:
        """An empty fake serving the configured node."""
        return cls(node_id=config.node.node_id or FAKE_NODE)

    # ---- helpers

    def _enter(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        err = self.fail.pop(method, None)
        if err is not None:
            raise err

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._seq):06d}"

    def _volume(self, volume_id: str) -> Disk:
        disk = self.volumes.get(volume_id)
        if disk is None:
            raise NotFoundError(f"volume {volume_id} not found")
        return disk

    @property
    def topology(self) -> dict[str, str]:
        return {FAKE_ZONE_KEY: self.zone} if self.capabilities.topology_keys else {}

    @staticmethod
    def _page(items: list[Any], max_entries: int, token: str, prefix: str) -> Page[Any]:
        start = 0
        if token:
            if not token.startswith(prefix) or not token[len(prefix) :].isdigit():
                raise InvalidTokenError(f"starting_token {token!r} was not issued by this driver")
            start = int(token[len(prefix) :])
            if start > len(items):
                raise InvalidTokenError(f"starting_token {token!r} is past the end of the list")
        end = start + max_entries if max_entries else len(items)
        nxt = f"{prefix}{end}" if end < len(items) else ""
        return Page(items=tuple(items[start:end]), next_token=nxt)

    # ---- lifecycle and parameters

    def probe(self) -> bool:
        self._enter("probe")
        return self.ready

    def close(self) -> None:
        self.closed = True

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        self._enter("validate_parameters", dict(parameters))
        for key in parameters:
            if key not in self.backend_parameters:
                raise InvalidParameterError(f"unknown parameter {key!r}")
        return dict(parameters)

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        self._enter("validate_mutable_parameters", dict(parameters))
        for key, value in parameters.items():
            if key not in FAKE_MUTABLE:
                raise InvalidParameterError(f"unknown mutable parameter {key!r}")
            allowed = FAKE_MUTABLE[key]
            ok = value in allowed if allowed is not None else value.isdigit() and int(value) > 0
            if not ok:
                raise InvalidParameterError(f"mutable parameter {key!r} has an invalid value {value!r}")
        return dict(parameters)

    # ---- volumes

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        self._enter("create_volume", name, options)
        with self._lock:
            served = not options.requisite or any(
                all(self.topology.get(k) == v for k, v in seg.items()) for seg in options.requisite
            )
            for vid, disk in self.volumes.items():
                if disk.name == name:
                    size = disk.size_bytes if options.size_range is not None else self.options[vid].size_bytes
                    if _but_placement(self.options[vid]) != _but_placement(options) or not base.size_fits(
                        size, options
                    ):
                        raise AlreadyExistsError(f"volume {name!r} exists with different arguments")
                    if not served:
                        raise AlreadyExistsError(f"volume {name!r} exists outside the requisite topology")
                    return disk
            if not served:
                raise OutOfCapacityError("no requisite topology segment is served by this backend")
            if options.source is not None:
                size = self._source_size(options.source)
                if size > options.size_bytes:
                    raise OutOfRangeError(f"source is {size} bytes, larger than {options.size_bytes}")
            used = sum(d.size_bytes for d in self.volumes.values())
            if used + options.size_bytes > self.capacity:
                raise OutOfCapacityError("not enough capacity")
            vid = self._id("fv")
            disk = Disk(
                id=vid,
                name=name,
                size_bytes=options.size_bytes,
                topology=self.topology,
                parameters={**options.parameters, **options.mutable_parameters},
                volume_context=dict(options.context),
                source=options.source,
                multi_node=options.multi_node,
            )
            self.volumes[vid] = disk
            self.options[vid] = options
            return disk

    def _source_size(self, source: ContentSource) -> int:
        if source.kind is SourceKind.SNAPSHOT:
            snap = self.snapshots.get(source.id)
            if snap is None:
                raise NotFoundError(f"snapshot {source.id} not found")
            return snap.size_bytes
        return self._volume(source.id).size_bytes

    def delete_volume(self, volume_id: str) -> None:
        self._enter("delete_volume", volume_id)
        with self._lock:
            disk = self._volume(volume_id)
            if disk.attachments:
                nodes = ", ".join(a.node_id for a in disk.attachments)
                raise FailedPreconditionError(f"volume {volume_id} is still published to {nodes}")
            del self.volumes[volume_id]
            del self.options[volume_id]

    def get_volume(self, volume_id: str) -> Disk:
        self._enter("get_volume", volume_id)
        return self._volume(volume_id)

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        self._enter("list_volumes", max_entries, starting_token)
        with self._lock:
            items = list(self.volumes.values())
        return self._page(items, max_entries, starting_token, "fvt-")

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        self._enter("expand_volume", volume_id, size_bytes)
        with self._lock:
            disk = self._volume(volume_id)
            if size_bytes <= disk.size_bytes:  # already that big: volumes never shrink
                return disk.size_bytes
            if disk.attachments and not self.capabilities.expand_online:
                raise FailedPreconditionError(f"volume {volume_id} is published; expand it offline")
            self.volumes[volume_id] = disk._replace(size_bytes=size_bytes)
            return size_bytes

    def modify_volume(
        self, volume_id: str, mutable_parameters: Mapping[str, str], metadata: Mapping[str, str] = EMPTY
    ) -> Disk:
        self._enter("modify_volume", volume_id, dict(mutable_parameters), dict(metadata))
        with self._lock:
            disk = self._volume(volume_id)
            disk = disk._replace(parameters={**disk.parameters, **mutable_parameters})
            self.volumes[volume_id] = disk
            return disk

    def get_capacity(self, parameters: Mapping[str, str], topology: Mapping[str, str] | None) -> int:
        self._enter("get_capacity", dict(parameters), topology)
        if topology and any(self.topology.get(k) != v for k, v in topology.items()):
            return 0
        return max(0, self.capacity - sum(d.size_bytes for d in self.volumes.values()))

    # ---- attachment

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        self._enter("attach", volume_id, node_id, readonly)
        with self._lock:
            disk = self._volume(volume_id)
            if node_id not in self.nodes:
                raise NotFoundError(f"node {node_id} not found")
            context = {keys.PC_DEVICE_PATH: f"/dev/fake-{volume_id}"}
            for att in disk.attachments:
                if att.node_id == node_id:
                    if att.readonly != readonly:
                        raise AlreadyExistsError(f"volume {volume_id} is published to {node_id} differently")
                    return dict(att.publish_context)
            if disk.attachments and not disk.multi_node:
                raise FailedPreconditionError(
                    f"volume {volume_id} is published to node {disk.attachments[0].node_id}"
                )
            limit = self.capabilities.max_volumes_per_node
            on_node = sum(1 for d in self.volumes.values() for a in d.attachments if a.node_id == node_id)
            if limit and on_node >= limit:
                raise LimitExceededError(f"node {node_id} already has {on_node} volumes attached")
            att = Attachment(node_id=node_id, readonly=readonly, publish_context=context)
            self.volumes[volume_id] = disk._replace(attachments=(*disk.attachments, att))
            return dict(context)

    def detach(self, volume_id: str, node_id: str) -> None:
        self._enter("detach", volume_id, node_id)
        with self._lock:
            disk = self._volume(volume_id)
            rest = tuple(a for a in disk.attachments if a.node_id != node_id)
            self.volumes[volume_id] = disk._replace(attachments=rest)

    # ---- snapshots

    def create_snapshot(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]] = (),
        metadata: Mapping[str, str] = EMPTY,
    ) -> Snapshot:
        self._enter(
            "create_snapshot", name, source_volume_id, dict(parameters), tuple(requisite), dict(metadata)
        )
        if requisite and not any(all(self.topology.get(k) == v for k, v in s.items()) for s in requisite):
            raise OutOfCapacityError("no requisite topology segment is served by this backend")
        with self._lock:
            for snap in self.snapshots.values():
                if snap.name == name:
                    if snap.source_volume_id != source_volume_id:
                        raise AlreadyExistsError(f"snapshot {name!r} exists for another volume")
                    return snap
            disk = self._volume(source_volume_id)
            snap = Snapshot(
                id=self._id("fs"),
                name=name,
                source_volume_id=source_volume_id,
                size_bytes=disk.size_bytes,
                created_at=time.time(),
                topology=(self.topology,) if self.capabilities.snapshot_topology else (),
            )
            self.snapshots[snap.id] = snap
            return snap

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._enter("delete_snapshot", snapshot_id)
        with self._lock:
            snap = self.snapshots.get(snapshot_id)
            if snap is None:
                raise NotFoundError(f"snapshot {snapshot_id} not found")
            if snap.group_id:
                raise InvalidParameterError(f"snapshot {snapshot_id} belongs to group {snap.group_id}")
            del self.snapshots[snapshot_id]

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        self._enter("get_snapshot", snapshot_id)
        snap = self.snapshots.get(snapshot_id)
        if snap is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        return snap

    def list_snapshots(
        self,
        *,
        snapshot_id: str = "",
        source_volume_id: str = "",
        max_entries: int = 0,
        starting_token: str = "",
    ) -> Page[Snapshot]:
        self._enter("list_snapshots", snapshot_id, source_volume_id, max_entries, starting_token)
        with self._lock:
            items = [
                s
                for s in self.snapshots.values()
                if (not snapshot_id or s.id == snapshot_id)
                and (not source_volume_id or s.source_volume_id == source_volume_id)
            ]
        return self._page(items, max_entries, starting_token, "fst-")

    def create_group_snapshot(
        self, name: str, volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> GroupSnapshot:
        self._enter("create_group_snapshot", name, tuple(volume_ids), dict(parameters))
        with self._lock:
            for group in self.groups.values():
                if group.name == name:
                    if sorted(s.source_volume_id for s in group.snapshots) != sorted(volume_ids):
                        raise AlreadyExistsError(f"group snapshot {name!r} exists with other volumes")
                    return group
            disks = [self._volume(v) for v in volume_ids]
            gid, now = self._id("fg"), time.time()
            members = tuple(
                Snapshot(
                    id=self._id("fs"),
                    name="",
                    source_volume_id=d.id,
                    size_bytes=d.size_bytes,
                    created_at=now,
                    group_id=gid,
                )
                for d in disks
            )
            for snap in members:
                self.snapshots[snap.id] = snap
            group = GroupSnapshot(id=gid, name=name, snapshots=members, created_at=now)
            self.groups[gid] = group
            return group

    def delete_group_snapshot(self, group_id: str) -> None:
        self._enter("delete_group_snapshot", group_id)
        with self._lock:
            group = self.groups.pop(group_id, None)
            if group is None:
                raise NotFoundError(f"group snapshot {group_id} not found")
            for snap in group.snapshots:
                self.snapshots.pop(snap.id, None)

    def get_group_snapshot(self, group_id: str) -> GroupSnapshot:
        self._enter("get_group_snapshot", group_id)
        group = self.groups.get(group_id)
        if group is None:
            raise NotFoundError(f"group snapshot {group_id} not found")
        return group

    # ---- node side

    def node_identity(self) -> NodeIdentity:
        self._enter("node_identity")
        return NodeIdentity(
            node_id=self.node_id,
            max_volumes=self.capabilities.max_volumes_per_node,
            topology=self.topology,
        )

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        self._enter("resolve_device", volume_id, dict(publish_context))
        self._volume(volume_id)
        device = self.devices.get(volume_id, f"/dev/fake-{volume_id}")
        with self._lock:
            self.on_node[volume_id] = device
        return device

    def prepared_device(self, volume_id: str) -> str | None:
        self._enter("prepared_device", volume_id)
        self._volume(volume_id)
        return self.on_node.get(volume_id)

    def never_written(self, volume_id: str) -> bool:
        self._enter("never_written", volume_id)
        return volume_id in self.untouched

    def release_device(self, volume_id: str) -> None:
        self._enter("release_device", volume_id)
        with self._lock:
            self.on_node.pop(volume_id, None)
        self.released.append(volume_id)

    # ---- reporting

    def volume_health(self, volume_id: str) -> tuple[Issue, ...]:
        self._enter("volume_health", volume_id)
        self._volume(volume_id)
        return self.issues.get(volume_id, ())

    def list_volume_health(self, max_entries: int = 0, starting_token: str = "") -> Page[VolumeHealth]:
        self._enter("list_volume_health", max_entries, starting_token)
        with self._lock:
            found = [VolumeHealth(v, self.issues[v]) for v in self.volumes if self.issues.get(v)]
        return seek_page(found, lambda h: h.volume_id, max_entries, starting_token)

    def storage_health(self) -> list[StorageIssue]:
        self._enter("storage_health")
        return list(self.storage_issues)

    def _blocks(self, snapshot_id: str, start: int, ranges: list[Range]) -> BlockMap:
        snap = self.snapshots.get(snapshot_id)
        if snap is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        if start > snap.size_bytes:
            raise OutOfRangeError(f"starting_offset {start} is past the end of snapshot {snapshot_id}")
        failure, self.stream_failure = self.stream_failure, None
        return BlockMap(snap.size_bytes, self._served([r for r in ranges if r.end > start], failure))

    @staticmethod
    def _served(ranges: list[Range], failure: tuple[int, failures.DriverError] | None) -> Iterator[Range]:
        for i, r in enumerate(ranges):
            if failure is not None and i == failure[0]:
                raise failure[1]
            yield r
        if failure is not None and failure[0] >= len(ranges):
            raise failure[1]

    def snapshot_allocated(
        self, snapshot_id: str, start: int, block: int, secrets: Mapping[str, str]
    ) -> BlockMap:
        self._enter("snapshot_allocated", snapshot_id, start, block, dict(secrets))
        return self._blocks(snapshot_id, start, self.block_ranges.get(snapshot_id, []))

    def snapshot_delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        secrets: Mapping[str, str],
        wanted: Callable[[], bool] = always,
    ) -> BlockMap:
        self._enter("snapshot_delta", base_id, target_id, start, block, dict(secrets))
        if base_id not in self.snapshots:
            raise NotFoundError(f"snapshot {base_id} not found")
        return self._blocks(target_id, start, self.block_deltas.get((base_id, target_id), []))
