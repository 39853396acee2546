"""The cloud-provider interface every backend implements, its capability flags, domain values and errors.

Backends take and return plain values and the immutable records (NamedTuples) below; they never import
grpc. Failures are raised as the errors of csi/failures.py; csi/errors.py maps each class to one gRPC code.
Every method documents its idempotency and not-found contract; implementations must honour both.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Self

# Page, seek_page and BlockMap belong to this interface; they live beside it and are re-exported here.
from csi.backends.paging import Page as Page
from csi.backends.paging import seek_page as seek_page
from csi.backends.reporting import BlockMap as BlockMap
from csi.backends.reporting import Reporting
from csi.failures import InvalidParameterError, NotFoundError, OutOfRangeError

if TYPE_CHECKING:
    from csi.config import Config

# The default of every mapping field: shared by all instances, so it must not be mutable.
EMPTY: Mapping[str, str] = MappingProxyType({})

GiB = 1024**3
MiB = 1024**2


# --------------------------------------------------------------------------- values


class SourceKind(enum.Enum):
    SNAPSHOT = "snapshot"
    VOLUME = "volume"


class ContentSource(NamedTuple):
    """What a new volume is populated from."""

    kind: SourceKind
    id: str


class Attachment(NamedTuple):
    """One node a volume is published to."""

    node_id: str
    readonly: bool = False
    publish_context: Mapping[str, str] = EMPTY


class DiskOptions(NamedTuple):
    """Everything create_volume needs besides the name.

    `parameters` are backend parameters already validated by `Backend.validate_parameters`.
    `requisite`/`preferred` are CSI topology segments; the backend places the disk in one that satisfies
    requisite (if any), trying preferred first. `multi_node` asks for a disk attachable to several nodes.
    `context` holds generic volume_context entries (fs type, mkfs options) that the backend stores and
    returns unchanged in Disk.volume_context; it takes part in the idempotency comparison.
    `metadata` holds the claim's identity as the external-provisioner passes it with
    --extra-create-metadata (keys.CLAIM_METADATA: PVC name and namespace, PV name; absent without the
    flag), for a backend that labels what it creates (aws: tags); it is no parameter.
    `size_range` is the request's (required_bytes, limit_bytes): a repeated create is answered by an
    existing volume whose size lies in it (size_fits); None: only by one of `size_bytes`.
    """

    size_bytes: int
    parameters: Mapping[str, str] = EMPTY
    context: Mapping[str, str] = EMPTY
    mutable_parameters: Mapping[str, str] = EMPTY
    requisite: Sequence[Mapping[str, str]] = ()
    preferred: Sequence[Mapping[str, str]] = ()
    source: ContentSource | None = None
    multi_node: bool = False
    block: bool = False
    metadata: Mapping[str, str] = EMPTY
    size_range: tuple[int, int] | None = None


def size_fits(size: int, options: DiskOptions) -> bool:
    """Whether an existing volume of `size` bytes answers a repeated create with `options`. Spec,
    CreateVolume: a volume of the name that "is compatible with the specified capacity_range" is the
    answer; a bound of 0 is no bound."""
    if options.size_range is None:
        return size == options.size_bytes
    required, limit = options.size_range
    return size >= required and (not limit or size <= limit)


def fit_source(options: DiskOptions, source_bytes: int, granularity: int) -> DiskOptions:
    """`options` for a volume that holds a content source of `source_bytes`. With the request's range
    (size_range) the size becomes the larger of size_bytes and the source's, rounded up to
    `granularity`, and only one past limit_bytes -> OutOfRangeError. Spec, CapacityRange:
    required_bytes "MUST be at least this big", limit_bytes "MUST not be bigger than this", and with
    neither the plugin MAY choose. Without a range size_bytes is exact: a larger source ->
    OutOfRangeError."""
    size = max(options.size_bytes, -(-source_bytes // granularity) * granularity)
    limit = options.size_range[1] if options.size_range is not None else options.size_bytes
    if limit and size > limit:
        raise OutOfRangeError(
            f"source {options.source.id if options.source else ''} is {source_bytes} bytes, larger than "
            f"the requested {limit}"
        )
    return options._replace(size_bytes=size)


class Disk(NamedTuple):
    """A volume as the backend reports it."""

    id: str
    name: str
    size_bytes: int
    topology: Mapping[str, str] = EMPTY
    parameters: Mapping[str, str] = EMPTY
    volume_context: Mapping[str, str] = EMPTY
    source: ContentSource | None = None
    attachments: Sequence[Attachment] = ()
    multi_node: bool = False


class Snapshot(NamedTuple):
    """A point-in-time copy of one volume."""

    id: str
    name: str
    source_volume_id: str
    size_bytes: int
    created_at: float  # seconds since the epoch
    ready: bool = True
    group_id: str = ""
    # Where volumes restored from it can be used (SNAPSHOT_ACCESSIBILITY_CONSTRAINTS); empty: anywhere.
    topology: Sequence[Mapping[str, str]] = ()


class GroupSnapshot(NamedTuple):
    """Snapshots of several volumes taken at one instant."""

    id: str
    name: str
    snapshots: Sequence[Snapshot]
    created_at: float
    ready: bool = True


class NodeIdentity(NamedTuple):
    """What NodeGetInfo reports for this host."""

    node_id: str
    max_volumes: int
    topology: Mapping[str, str] = EMPTY


class BackendCapabilities(NamedTuple):
    """What a backend can do. The advertised CSI capabilities are derived from this in one place
    (csi/capabilities.py) and enforced at RPC entry."""

    snapshots: bool = False
    clone: bool = False
    expand_online: bool = False
    expand_offline: bool = False
    attach_required: bool = True
    block_multi_attach: bool = False
    list_volumes: bool = True
    list_snapshots: bool = True
    get_capacity: bool = False
    modify_volume: bool = False
    # expand_volume and modify_volume of one volume arriving together are merged into one change (EBS:
    # one modification per volume, then hours of cool-down), so the controller lets them run together
    coalesces_modifications: bool = False
    group_snapshots: bool = False
    volume_health: bool = False  # controller: volume_health / list_volume_health
    node_volume_health: bool = False  # node: prepared_device
    storage_health: bool = False  # node: storage_health
    snapshot_topology: bool = False  # snapshots carry where they can be restored (Snapshot.topology)
    snapshot_metadata: bool = False  # snapshot_allocated / snapshot_delta
    metadata_block_size: int = 64 * 1024  # the changed-block granularity the backend works in (bytes)
    single_node_multi_writer: bool = False
    topology_keys: tuple[str, ...] = ()
    size_granularity: int = MiB
    min_size: int = MiB
    default_size: int = GiB
    max_volumes_per_node: int = 0  # 0: no limit known


# --------------------------------------------------------------------------- interface


class Backend(Reporting, abc.ABC):
    """A cloud block-storage provider. Controller methods run in the controller, node methods on the node.

    All ids are backend-generated strings; a malformed id raises NotFoundError (not a file/API operation).
    The optional read-only operations (health, devices on the host, snapshot block metadata) and their
    contracts are in csi/backends/reporting.py.
    """

    capabilities: BackendCapabilities
    # The CSI driver name the backend registers under when --driver-name is not given.
    default_driver_name: ClassVar[str]

    # ---- lifecycle

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Config) -> Self:
        """Build the backend the driver's configuration describes (config.backend, config.node; a
        process serving only the node has config.runs_controller False). Raise a csi.failures error
        with an actionable message when the configuration cannot work."""

    def probe(self) -> bool:
        """True when ready to serve, False while starting. Raises a csi.failures error when broken."""
        return True

    def close(self) -> None:
        """Release clients, files and threads. Idempotent."""

    def retries(self) -> Mapping[str, int]:
        """Calls to the storage API retried since start (throttling, server errors, timeouts), by
        operation; exported as the counter ballast_backend_retries_total. Default: none."""
        return {}

    def canonical_volume_id(self, volume_id: str) -> str:
        """The one spelling of the volume `volume_id` names, for keys that must be equal whenever two
        requests name the same volume (the controller's in-flight keys). Never raises: an id that names
        no volume comes back unchanged. Default: ids have one spelling."""
        return volume_id

    # ---- parameters

    @abc.abstractmethod
    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        """Normalise StorageClass parameters meant for this backend.

        Unknown keys or bad values raise InvalidParameterError naming the key. Generic keys (fs type,
        mkfs options, `csi.storage.k8s.io/` keys) are removed by the caller before this is called.
        """

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        """Normalise VolumeAttributesClass parameters; anything unsupported raises InvalidParameterError."""
        if parameters:
            raise InvalidParameterError(
                f"this backend supports no mutable parameters, got: {', '.join(sorted(parameters))}"
            )
        return {}

    # ---- volumes

    @abc.abstractmethod
    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        """Create a disk named `name`. Idempotent by name: same name and compatible options return the
        existing disk; incompatible options raise AlreadyExistsError. A missing source raises NotFoundError;
        a source larger than the request allows raises OutOfRangeError (fit_source: a range whose
        limit_bytes admits the source makes the volume as big as the source)."""

    @abc.abstractmethod
    def delete_volume(self, volume_id: str) -> None:
        """Delete a disk. Missing -> NotFoundError (callers treat it as done). Attached ->
        FailedPreconditionError. Snapshots of it survive (they are independent copies)."""

    @abc.abstractmethod
    def get_volume(self, volume_id: str) -> Disk:
        """Current state of one disk. Missing -> NotFoundError."""

    @abc.abstractmethod
    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        """Disks in a stable order; `max_entries` 0 means all. Foreign token -> InvalidTokenError."""

    @abc.abstractmethod
    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        """Grow a disk to at least `size_bytes`; returns the new size. Already that big (a smaller size
        included: disks never shrink) -> the current size, nothing changes. A size past what the backend
        allows -> OutOfRangeError. Missing -> NotFoundError."""

    def modify_volume(
        self, volume_id: str, mutable_parameters: Mapping[str, str], metadata: Mapping[str, str] = EMPTY
    ) -> Disk:
        """Apply validated mutable parameters all-or-nothing. Missing -> NotFoundError. `metadata`: the
        claim's names as the external-resizer passes them with --extra-modify-metadata
        (keys.CLAIM_METADATA), for a backend that labels its volumes (aws: tag templates)."""
        raise InvalidParameterError("this backend cannot modify volumes")

    def get_capacity(self, parameters: Mapping[str, str], topology: Mapping[str, str] | None) -> int:
        """Bytes available for new disks with these parameters in this topology segment (0 if none)."""
        raise InvalidParameterError("this backend does not report capacity")

    # ---- attachment

    @abc.abstractmethod
    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        """Publish a disk to a node and return the publish context the node needs to find it.

        Idempotent: attached to this node with the same readonly flag -> same context; with a different
        flag -> AlreadyExistsError. Attached to another node and not multi-node -> FailedPreconditionError
        naming the node. Missing volume or unknown node -> NotFoundError. Node full -> LimitExceededError."""

    @abc.abstractmethod
    def detach(self, volume_id: str, node_id: str) -> None:
        """Unpublish a disk from a node. Not attached there -> no-op. Missing volume -> NotFoundError."""

    # ---- snapshots

    def create_snapshot(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]] = (),
        metadata: Mapping[str, str] = EMPTY,
    ) -> Snapshot:
        """Idempotent by name: same name and source return the existing snapshot; another source ->
        AlreadyExistsError. Missing source -> NotFoundError. No space -> OutOfCapacityError.

        `metadata` holds the VolumeSnapshot's names as the external-snapshotter passes them with
        --extra-create-metadata (keys.SNAPSHOT_METADATA; absent without the flag), for a backend that
        labels what it creates (aws: tag templates); it is no parameter.

        `requisite` (passed, as a keyword, only to a backend with `snapshot_topology` and only when the
        request has accessibility requirements): the snapshot must be restorable in one of those
        segments (none it can serve -> OutOfCapacityError); Snapshot.topology says where it is."""
        raise InvalidParameterError("this backend does not support snapshots")

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Missing -> NotFoundError (callers treat it as done). Member of a group -> InvalidParameterError."""
        raise InvalidParameterError("this backend does not support snapshots")

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """Missing -> NotFoundError."""
        raise NotFoundError(f"snapshot {snapshot_id} not found")

    def list_snapshots(
        self,
        *,
        snapshot_id: str = "",
        source_volume_id: str = "",
        max_entries: int = 0,
        starting_token: str = "",
    ) -> Page[Snapshot]:
        """Snapshots in a stable order, optionally filtered. Unknown id or source -> empty page."""
        return Page(items=())

    def create_group_snapshot(
        self, name: str, volume_ids: Sequence[str], parameters: Mapping[str, str]
    ) -> GroupSnapshot:
        """All member snapshots taken at one instant. Idempotent by name (same members); different
        members -> AlreadyExistsError. A missing volume -> NotFoundError."""
        raise InvalidParameterError("this backend does not support group snapshots")

    def delete_group_snapshot(self, group_id: str) -> None:
        """Deletes the group and its member snapshots. Missing -> NotFoundError."""
        raise InvalidParameterError("this backend does not support group snapshots")

    def get_group_snapshot(self, group_id: str) -> GroupSnapshot:
        """Missing -> NotFoundError."""
        raise NotFoundError(f"group snapshot {group_id} not found")

    # ---- node side

    @abc.abstractmethod
    def node_identity(self) -> NodeIdentity:
        """This host's node id, volume limit and topology segment."""

    @abc.abstractmethod
    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """Path of the block device holding `volume_id` on this host, verified to be that volume.

        Idempotent (an already prepared device is reused). Missing volume -> NotFoundError. A device that
        cannot be proven to be the volume -> FailedPreconditionError; never a guess."""

    def prepared_device(self, volume_id: str) -> str | None:
        """The device resolve_device already prepared for `volume_id` on this host, verified as there,
        or None when there is none. Never prepares one: reads and refusals (stats, node expand) use it so
        that they change nothing. Missing volume -> NotFoundError where the node can tell (a backend
        whose nodes cannot look volumes up answers None); a device that cannot be proven to be the volume
        -> FailedPreconditionError. The default suits backends whose resolve_device changes nothing on
        the host; a backend that attaches in resolve_device overrides it."""
        try:
            return self.resolve_device(volume_id, {})
        except NotFoundError:
            return None

    def leftover_device(self, volume_id: str) -> str | None:
        """The device this host still holds for `volume_id` when prepared_device names none: the backend
        no longer knows the volume (deleted while staged, its record lost) or its storage went from
        under the stage. NodeUnstageVolume undoes such a stage with it, so it must be provably this
        volume's device (a guess would unmount another volume); never prepares one. None when there is
        none or the backend cannot tell (the default)."""
        return None

    def never_written(self, volume_id: str) -> bool:
        """True only when the backend can prove that no byte of the volume was ever written, so that no
        filesystem or partition table can be on it and a stage may format it without probing the
        device. False when it cannot tell (the default): the node then probes with blkid. Never True
        for a volume that holds data; checked after resolve_device proved which device it is."""
        return False

    def release_device(self, volume_id: str) -> None:
        """Undo node-side preparation done by resolve_device (e.g. detach a loop device). Idempotent."""
