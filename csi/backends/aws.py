"""AWS EBS backend: EC2 volumes, snapshots and attachments through an injected boto3 client.

Idempotency: a volume is found again by its `CSIVolumeName` tag, and CreateVolume carries a client token
derived from the name, so neither a retry nor a concurrent duplicate creates a second volume. Snapshots
are found by their `CSIVolumeSnapshotName` tag. Handles are EC2 ids; the in-tree forms
`aws://zone/vol-...` and `aws:///vol-...` are accepted everywhere and normalised to `vol-...`.
Every EC2 request goes through aws_errors.Ec2 (throttling retried, error codes mapped once).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from csi import keys
from csi.backends import aws_params as P
from csi.backends.aws_coalesce import Coalescer, Modification
from csi.backends.aws_devices import DeviceFinder, DeviceNames
from csi.backends.aws_errors import Backoff, Ec2, UnsupportedActionError
from csi.backends.aws_metadata import (
    ZONE_ENV,
    Imds,
    Placement,
    attach_limit,
    free_attach_slots,
    resolve_placement,
)
from csi.backends.base import (
    AlreadyExistsError,
    Attachment,
    Backend,
    BackendCapabilities,
    BackendError,
    Condition,
    ContentSource,
    Disk,
    DiskOptions,
    FailedPreconditionError,
    GiB,
    InvalidParameterError,
    InvalidTokenError,
    LimitExceededError,
    NodeIdentity,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
    Page,
    Snapshot,
    SourceKind,
    TransientError,
)

if TYPE_CHECKING:
    from csi.config import Config

log = logging.getLogger("ballast.aws")
T = TypeVar("T")

DEFAULT_DRIVER_NAME = "ebs.csi.aws.com"
TAG_SOURCE_VOLUME = "CSISourceVolumeId"  # set on clones: CreateVolume idempotency compares it
TAG_READONLY_PREFIX = "ballast.dev/published-readonly/"  # + instance id: published read-only there
TAG_CONTEXT_PREFIX = "ballast.dev/volume-context/"  # one tag per generic volume_context entry (fsType, ...)
LIVE_VOLUME_STATES = ["creating", "available", "in-use", "error"]
ATTACHED_STATES = ("attaching", "attached")
TOKEN_PREFIX = "after:"
# Volumes ListVolumes reports: made by this driver or by the in-tree plugin (its PV tag).
LISTED_TAG_KEYS = [P.TAG_VOLUME_NAME, P.TAG_CREATED_FOR + "pv/name"]


def client_token(name: str, attempt: int = 0) -> str:
    """CreateVolume ClientToken for a volume name (64 hex chars, EC2's limit). `attempt` > 0 derives a
    fresh token when EC2 answers an old one with a volume that has since been deleted."""
    seed = name if attempt == 0 else f"{name}\x00{attempt}"
    return hashlib.sha256(seed.encode()).hexdigest()


def _tags(item: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in item.get("Tags", [])}


def _tag_spec(resource: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": resource, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


class _KeyedLocks:
    """One lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class AwsBackend(Backend):
    """EBS through boto3. The client is injected; `from_config` builds the production one."""

    def __init__(
        self,
        client: Any,
        *,
        driver_name: str = DEFAULT_DRIVER_NAME,
        zone: str = "",
        node_id: str = "",
        max_volumes: int = 0,
        imds: Imds | None = None,
        controller: bool = True,
        device_finder: DeviceFinder | None = None,
        modify_window: float = 2.0,
        backoff: Backoff | None = None,
        wait_timeout: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ec2 = Ec2(client, backoff, sleep)
        self.zone_key = keys.topology_zone_key(driver_name)
        self._zone = "" if zone == "local" else zone
        self._node_id = node_id
        self._max_volumes = max_volumes
        self._imds = imds
        self._controller = controller
        self._devices = device_finder or DeviceFinder()
        self._names = DeviceNames()
        self._locks = _KeyedLocks()
        self._modifier: Coalescer[Disk] = Coalescer(self._apply_modification, modify_window, sleep)
        self._wait_timeout = wait_timeout
        self._sleep = sleep
        self._placement: Placement | None = None
        self._default_zone = ""
        self._known_zones: list[str] = []
        self._copy_volumes = True  # False once the endpoint answered that it lacks CopyVolumes
        self.capabilities = BackendCapabilities(
            snapshots=True,
            clone=True,
            expand_online=True,
            expand_offline=True,
            attach_required=True,
            block_multi_attach=True,
            list_volumes=True,
            list_snapshots=True,
            modify_volume=True,
            volume_condition=True,
            topology_keys=(self.zone_key, keys.WELL_KNOWN_ZONE),
            size_granularity=GiB,
            min_size=GiB,
            default_size=100 * GiB,
            max_volumes_per_node=max_volumes,
        )

    @classmethod
    def from_config(cls, config: Config) -> AwsBackend:
        """Client for `--aws-region` / `--aws-endpoint-url` with the standard credential chain; retries
        are ours (aws_errors.Ec2), so botocore's own are off."""
        import boto3
        from botocore.config import Config as BotoConfig

        imds = None if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true" else Imds()
        session = boto3.session.Session()
        region = config.backend.aws_region or session.region_name or ""
        if not region and imds is not None:
            with contextlib.suppress(BackendError):
                region = imds.get("placement/region")
        if not region:
            if config.runs_controller:
                raise FailedPreconditionError(
                    "aws backend: no region; give --aws-region (or AWS_REGION), or run where instance "
                    "metadata answers"
                )
            region = "us-east-1"  # a node-only process never calls EC2; the client just needs a region
        client = session.client(
            "ec2",
            region_name=region or None,
            endpoint_url=config.backend.aws_endpoint_url or None,
            config=BotoConfig(
                retries={"total_max_attempts": 1},
                connect_timeout=5,
                read_timeout=30,
                user_agent_extra="ballast-csi",
            ),
        )
        return cls(
            client,
            driver_name=config.backend.driver_name,
            zone=config.backend.zone,
            node_id=config.node.node_id,
            max_volumes=config.node.max_volumes_per_node,
            imds=imds,
            controller=config.runs_controller,
        )

    # ------------------------------------------------------------------ lifecycle

    def probe(self) -> bool:
        """Controller: one cheap EC2 call proves endpoint and credentials (FailedPreconditionError if
        not). Node only: always ready (nodes need no EC2 access)."""
        if self._controller:
            self._zones()
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ec2.client.close()

    # ------------------------------------------------------------------ helpers

    def _poll(self, what: str, check: Callable[[], T | None], timeout: float | None = None) -> T:
        """Call `check` with growing pauses until it returns non-None; TransientError on timeout."""
        deadline = time.monotonic() + (self._wait_timeout if timeout is None else timeout)
        delay = 0.05
        while True:
            result = check()
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise TransientError(f"timed out waiting for {what}; the operation continues in EC2, retry")
            self._sleep(delay)
            delay = min(delay * 2, 2.0)

    def _zones(self) -> list[str]:
        response = self.ec2.call(
            "describe_availability_zones", Filters=[{"Name": "state", "Values": ["available"]}]
        )
        return sorted(z["ZoneName"] for z in response.get("AvailabilityZones", []))

    def _describe_volume(self, vid: str) -> dict[str, Any]:
        volumes = self.ec2.call("describe_volumes", VolumeIds=[vid]).get("Volumes", [])
        if not volumes or volumes[0].get("State") in ("deleting", "deleted"):
            raise NotFoundError(f"volume {vid} not found")
        volume: dict[str, Any] = volumes[0]
        return volume

    def _describe_all(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a listing, following EC2's NextToken."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            response = self.ec2.call(operation, **params, **({"NextToken": token} if token else {}))
            items.extend(response.get(key, []))
            token = response.get("NextToken", "")
            if not token:
                return items

    def _disk(self, volume: Mapping[str, Any]) -> Disk:
        tags = _tags(volume)
        zone = volume["AvailabilityZone"]
        params = {P.TYPE: volume.get("VolumeType", "")}
        if volume.get("Iops"):
            params[P.IOPS] = str(volume["Iops"])
        if volume.get("Throughput"):
            params[P.THROUGHPUT] = str(volume["Throughput"])
        if volume.get("Encrypted"):
            params[P.ENCRYPTED] = "true"
        source = None
        if tags.get(TAG_SOURCE_VOLUME):
            source = ContentSource(SourceKind.VOLUME, tags[TAG_SOURCE_VOLUME])
        elif volume.get("SnapshotId"):
            source = ContentSource(SourceKind.SNAPSHOT, volume["SnapshotId"])
        state = volume.get("State", "")
        context = {
            k[len(TAG_CONTEXT_PREFIX) :]: v for k, v in tags.items() if k.startswith(TAG_CONTEXT_PREFIX)
        }
        return Disk(
            id=volume["VolumeId"],
            name=tags.get(P.TAG_VOLUME_NAME, volume["VolumeId"]),
            size_bytes=int(volume["Size"]) * GiB,
            topology={self.zone_key: zone, keys.WELL_KNOWN_ZONE: zone},
            parameters=params,
            volume_context=context,
            source=source,
            attachments=tuple(
                Attachment(
                    node_id=a["InstanceId"],
                    readonly=TAG_READONLY_PREFIX + a["InstanceId"] in tags,
                    publish_context={keys.PC_DEVICE_PATH: a.get("Device", "")},
                )
                for a in volume.get("Attachments", [])
                if a.get("State") in ATTACHED_STATES
            ),
            condition=Condition(abnormal=True, message=f"EBS reports volume state {state!r}")
            if state == "error"
            else Condition(),
            multi_node=bool(volume.get("MultiAttachEnabled")),
        )

    def _snapshot(self, snap: Mapping[str, Any]) -> Snapshot:
        started = snap.get("StartTime")
        return Snapshot(
            id=snap["SnapshotId"],
            name=_tags(snap).get(P.TAG_SNAPSHOT_NAME, snap["SnapshotId"]),
            source_volume_id=snap.get("VolumeId", ""),
            size_bytes=int(snap.get("VolumeSize", 0)) * GiB,
            created_at=started.timestamp() if started is not None else 0.0,
            ready=snap.get("State") == "completed",
        )

    @staticmethod
    def _page(items: Sequence[T], ident: Callable[[T], str], max_entries: int, token: str) -> Page[T]:
        """Seek paging over items sorted by id: the token is the last id returned, so deleting or adding
        items between pages never yields duplicates. A foreign token -> InvalidTokenError."""
        ordered = sorted(items, key=ident)
        if token:
            last = token[len(TOKEN_PREFIX) :]
            if not token.startswith(TOKEN_PREFIX) or not last:
                raise InvalidTokenError(f"starting token {token!r} was not issued by this driver")
            ordered = [i for i in ordered if ident(i) > last]
        if max_entries and len(ordered) > max_entries:
            ordered = ordered[:max_entries]
            return Page(items=ordered, next_token=TOKEN_PREFIX + ident(ordered[-1]))
        return Page(items=ordered)

    # ------------------------------------------------------------------ parameters

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return P.validate(parameters)

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return P.validate_mutable(parameters)

    # ------------------------------------------------------------------ volumes

    def _find_by_name(self, name: str) -> dict[str, Any] | None:
        volumes = self._describe_all(
            "describe_volumes",
            "Volumes",
            Filters=[
                {"Name": f"tag:{P.TAG_VOLUME_NAME}", "Values": [name]},
                {"Name": "status", "Values": LIVE_VOLUME_STATES},
            ],
        )
        if not volumes:
            return None
        return min(volumes, key=lambda v: (v.get("CreateTime") or 0, v["VolumeId"]))

    def _pick_zone(self, options: DiskOptions) -> str:
        """A zone of this region: the first preferred one that satisfies requisite, else the first
        requisite one, else the default. None of the requisite zones exists -> OutOfCapacityError."""
        zone = self._choose_zone(options)
        if not self._known_zones:
            self._known_zones = self._zones()
        if zone not in self._known_zones:
            raise OutOfCapacityError(
                f"zone {zone!r} is not an available zone of this region ({', '.join(self._known_zones)})"
            )
        return zone

    def _choose_zone(self, options: DiskOptions) -> str:
        def zone_of(segment: Mapping[str, str]) -> str:
            for key in (self.zone_key, keys.WELL_KNOWN_ZONE, keys.LEGACY_ZONE):
                if segment.get(key):
                    return segment[key]
            return ""

        required = [zone_of(s) for s in options.requisite]
        allowed = None if not required or "" in required else required
        for segment in options.preferred:
            zone = zone_of(segment)
            if zone and (allowed is None or zone in allowed):
                return zone
        if allowed:
            return allowed[0]
        if not self._default_zone:
            zones = self._zones()
            self._default_zone = self._zone or os.environ.get(ZONE_ENV, "") or (zones[0] if zones else "")
        if not self._default_zone:
            raise OutOfCapacityError("no availability zone is available in this region")
        return self._default_zone

    def _allowed_zones(self, options: DiskOptions) -> set[str] | None:
        zones: set[str] = set()
        for segment in options.requisite:
            zone = (
                segment.get(self.zone_key)
                or segment.get(keys.WELL_KNOWN_ZONE)
                or segment.get(keys.LEGACY_ZONE)
            )
            if not zone:
                return None
            zones.add(zone)
        return zones or None

    def _check_compatible(
        self, volume: Mapping[str, Any], name: str, options: DiskOptions, params: Mapping[str, str]
    ) -> None:
        disk = self._disk(volume)
        problems = []
        if disk.size_bytes != P.gib(options.size_bytes) * GiB:
            problems.append(f"size {disk.size_bytes} bytes")
        if volume.get("VolumeType") != params.get(P.TYPE, P.DEFAULT_TYPE):
            problems.append(f"type {volume.get('VolumeType')}")
        wanted = options.source
        if wanted is not None and wanted.kind is SourceKind.VOLUME:
            wanted = ContentSource(SourceKind.VOLUME, P.volume_id(wanted.id))
        if wanted != disk.source:
            problems.append(f"source {disk.source.id if disk.source else 'none'}")
        allowed = self._allowed_zones(options)
        if allowed is not None and volume["AvailabilityZone"] not in allowed:
            problems.append(f"zone {volume['AvailabilityZone']}")
        if dict(options.context) != dict(disk.volume_context):
            problems.append(f"volume context {dict(disk.volume_context)}")
        if problems:
            raise AlreadyExistsError(
                f"volume {name!r} already exists as {volume['VolumeId']} with different {', '.join(problems)}"
            )

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        """Idempotent by name (tag lookup under a per-name lock, then a name-derived client token)."""
        params = dict(options.parameters)
        if P.IOPS in options.mutable_parameters:
            params.pop(P.IOPS_PER_GB, None)
        params.update(options.mutable_parameters)
        params.setdefault(P.TYPE, P.DEFAULT_TYPE)
        with self._locks.hold(name):
            existing = self._find_by_name(name)
            if existing is not None:
                self._check_compatible(existing, name, options, params)
                return self._disk(self._wait_available(existing["VolumeId"]))
            return self._create(name, options, params)

    def _create(self, name: str, options: DiskOptions, params: dict[str, str]) -> Disk:
        size_gib = P.gib(options.size_bytes)
        args = P.create_arguments(params, size_gib)
        if options.multi_node:
            if params[P.TYPE] not in P.MULTI_ATTACH_TYPES:
                raise InvalidParameterError(
                    f"multi-node access needs EBS Multi-Attach: type io2 (or io1), not {params[P.TYPE]}"
                )
            args["MultiAttachEnabled"] = True
        tags = {
            P.TAG_VOLUME_NAME: name,
            P.TAG_DRIVER: "true",
            **P.user_tags(params),
            **{TAG_CONTEXT_PREFIX + k: v for k, v in options.context.items()},
        }
        source = options.source
        if source is not None and source.kind is SourceKind.VOLUME:
            return self._clone(name, P.volume_id(source.id), options, args, tags)
        if source is not None:
            snap = self.get_snapshot(source.id)
            if snap.size_bytes > size_gib * GiB:
                raise OutOfRangeError(
                    f"snapshot {snap.id} holds {snap.size_bytes} bytes, "
                    f"more than the requested {size_gib} GiB"
                )
            args["SnapshotId"] = snap.id
        zone = self._pick_zone(options)
        for attempt in range(3):
            created = self.ec2.call(
                "create_volume",
                AvailabilityZone=zone,
                ClientToken=client_token(name, attempt),
                TagSpecifications=_tag_spec("volume", tags),
                **args,
            )
            if created.get("State") not in ("deleting", "deleted"):
                with contextlib.suppress(NotFoundError):  # gone at once: the token was burned
                    return self._disk(self._wait_available(created["VolumeId"]))
            log.info(
                "client token of %r answered with deleted volume %s; new token", name, created["VolumeId"]
            )
        raise TransientError(f"EC2 keeps returning deleted volumes for {name!r}; retry later")

    def _clone(
        self, name: str, source_id: str, options: DiskOptions, args: dict[str, object], tags: dict[str, str]
    ) -> Disk:
        """Clones stay in the source's zone: CopyVolumes, else snapshot + restore."""
        source = self._describe_volume(source_id)
        allowed = self._allowed_zones(options)
        if allowed is not None and source["AvailabilityZone"] not in allowed:
            raise OutOfCapacityError(
                f"a clone of {source_id} must be in its zone {source['AvailabilityZone']}, "
                f"which the requested topology excludes"
            )
        if int(source["Size"]) > int(str(args["Size"])):
            raise OutOfRangeError(
                f"volume {source_id} is {source['Size']} GiB, larger than the requested {args['Size']} GiB"
            )
        tags = {**tags, TAG_SOURCE_VOLUME: source_id}
        vid = ""
        if self._copy_volumes:
            try:
                copied = self.ec2.call(
                    "copy_volumes",
                    SourceVolumeId=source_id,
                    ClientToken=client_token(name),
                    TagSpecifications=_tag_spec("volume", tags),
                    **args,
                )
                vid = copied["Volumes"][0]["VolumeId"]
            except UnsupportedActionError as exc:
                log.warning("CopyVolumes unavailable at this endpoint (%s); cloning via snapshots", exc)
                self._copy_volumes = False
        if not vid:
            vid = self._clone_via_snapshot(name, source, args, tags)
        return self._disk(self._wait_available(vid))

    def _clone_via_snapshot(
        self, name: str, source: Mapping[str, Any], args: dict[str, object], tags: dict[str, str]
    ) -> str:
        snap = self.ec2.call(
            "create_snapshot",
            VolumeId=source["VolumeId"],
            Description=f"clone of {source['VolumeId']} for {name}",
            TagSpecifications=_tag_spec("snapshot", {P.TAG_DRIVER: "true"}),
        )
        sid = snap["SnapshotId"]
        try:
            self._poll(f"snapshot {sid}", lambda: True if self.get_snapshot(sid).ready else None)
            created = self.ec2.call(
                "create_volume",
                AvailabilityZone=source["AvailabilityZone"],
                SnapshotId=sid,
                ClientToken=client_token(name),
                TagSpecifications=_tag_spec("volume", tags),
                **args,
            )
        finally:
            with contextlib.suppress(BackendError):
                self.ec2.call("delete_snapshot", SnapshotId=sid)
        return str(created["VolumeId"])

    def _wait_available(self, vid: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            volume = self._describe_volume(vid)
            if volume["State"] == "error":
                with contextlib.suppress(BackendError):
                    self.ec2.call("delete_volume", VolumeId=vid)
                raise BackendError(f"EBS could not create volume {vid} (state error); it was deleted, retry")
            return volume if volume["State"] in ("available", "in-use") else None

        return self._poll(f"volume {vid} to become available", check)

    def delete_volume(self, volume_id: str) -> None:
        """Missing -> NotFoundError; attached -> FailedPreconditionError."""
        vid = P.volume_id(volume_id)
        self.ec2.call("delete_volume", VolumeId=vid)

    def get_volume(self, volume_id: str) -> Disk:
        return self._disk(self._describe_volume(P.volume_id(volume_id)))

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        """Volumes made by this driver or the in-tree plugin, with the nodes they are attached to."""
        volumes: dict[str, dict[str, Any]] = {}
        for tag_key in LISTED_TAG_KEYS:  # one query per key: some endpoints do not OR tag-key values
            for volume in self._describe_all(
                "describe_volumes",
                "Volumes",
                Filters=[
                    {"Name": "tag-key", "Values": [tag_key]},
                    {"Name": "status", "Values": LIVE_VOLUME_STATES},
                ],
            ):
                volumes[volume["VolumeId"]] = volume
        page = self._page(list(volumes.values()), lambda v: str(v["VolumeId"]), max_entries, starting_token)
        return Page(items=[self._disk(v) for v in page.items], next_token=page.next_token)

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        """Grow to whole GiB, coalesced with a concurrent modify into one ModifyVolume. Already that big
        -> current size, no modification. Missing -> NotFoundError."""
        return self._modifier.submit(P.volume_id(volume_id), size_bytes=size_bytes).size_bytes

    def modify_volume(self, volume_id: str, mutable_parameters: Mapping[str, str]) -> Disk:
        """Change type/iops/throughput, coalesced with a concurrent resize into one ModifyVolume."""
        return self._modifier.submit(P.volume_id(volume_id), parameters=mutable_parameters)

    def _apply_modification(self, vid: str, change: Modification) -> Disk:
        volume = self._describe_volume(vid)
        current = int(volume["Size"])
        args: dict[str, Any] = {}
        if change.size_bytes is not None:
            target = P.gib(change.size_bytes)
            if target > current:  # not bigger: already satisfied (EBS volumes never shrink)
                args["Size"] = target
        kind = change.parameters.get(P.TYPE, volume.get("VolumeType", P.DEFAULT_TYPE))
        if kind != volume.get("VolumeType"):
            args["VolumeType"] = kind
        for key, field in ((P.IOPS, "Iops"), (P.THROUGHPUT, "Throughput")):
            if key in change.parameters and int(change.parameters[key]) != volume.get(field):
                args[field] = int(change.parameters[key])
        if not args:
            return self._disk(volume)
        P.check_size(kind, int(args.get("Size", current)))
        limits = P.VOLUME_TYPES[kind]
        if "Iops" in args and not limits.max_iops:
            raise InvalidParameterError(f"volume type {kind} has no provisioned IOPS")
        if "Throughput" in args and limits.throughput is None:
            raise InvalidParameterError(f"volume type {kind} takes no throughput")
        self.ec2.call("modify_volume", VolumeId=vid, **args)

        def settled() -> dict[str, Any] | None:
            mods = self.ec2.call("describe_volumes_modifications", VolumeIds=[vid]).get(
                "VolumesModifications", []
            )
            state = mods[-1].get("ModificationState", "completed") if mods else "completed"
            if state == "failed":
                raise BackendError(f"EBS failed to modify volume {vid}: {mods[-1].get('StatusMessage', '')}")
            return self._describe_volume(vid) if state in ("optimizing", "completed") else None

        updated = self._poll(f"modification of {vid}", settled)
        disk = self._disk(updated)
        if "Size" in args and disk.size_bytes < args["Size"] * GiB:
            disk = disk._replace(size_bytes=args["Size"] * GiB)
        return disk

    # ------------------------------------------------------------------ attachment

    def _instance(self, node_id: str) -> dict[str, Any]:
        if not node_id.startswith("i-"):
            raise NotFoundError(f"node {node_id!r} not found: not an EC2 instance id")
        reservations = self.ec2.call("describe_instances", InstanceIds=[node_id]).get("Reservations", [])
        for reservation in reservations:
            for instance in reservation.get("Instances", []):
                if instance.get("State", {}).get("Name") not in ("terminated", "shutting-down"):
                    found: dict[str, Any] = instance
                    return found
        raise NotFoundError(f"node {node_id} not found (no running EC2 instance)")

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        """Attach under a free device name and wait until EC2 reports it attached.

        EBS has no read-only attachments: the node's mount enforces `readonly`; the flag is remembered in
        a volume tag so a republish with the other flag is refused (AlreadyExistsError)."""
        vid = P.volume_id(volume_id)
        with self._locks.hold(vid):
            volume = self._describe_volume(vid)
            instance = self._instance(node_id)
            for a in volume.get("Attachments", []):
                if a.get("State") not in ATTACHED_STATES:
                    continue
                if a["InstanceId"] == node_id:
                    if (TAG_READONLY_PREFIX + node_id in _tags(volume)) != readonly:
                        raise AlreadyExistsError(
                            f"volume {vid} is already published to {node_id} with readonly={not readonly}"
                        )
                    self._wait_attached(vid, node_id)
                    return {keys.PC_DEVICE_PATH: a["Device"]}
                if not volume.get("MultiAttachEnabled"):
                    raise FailedPreconditionError(f"volume {vid} is attached to node {a['InstanceId']}")
            zone = instance.get("Placement", {}).get("AvailabilityZone", "")
            if zone and zone != volume["AvailabilityZone"]:
                raise FailedPreconditionError(
                    f"volume {vid} is in zone {volume['AvailabilityZone']} but node {node_id} is in {zone}"
                )
            used = [m["DeviceName"] for m in instance.get("BlockDeviceMappings", [])]
            root = instance.get("RootDeviceName", "")
            # The node's attach slots: --max-volumes-per-node, or what its instance type allows; every
            # volume attached besides the root (by this driver or not) takes one.
            limit = self._max_volumes or attach_limit(instance.get("InstanceType", ""))
            attached = len([u for u in used if u != root])
            if attached >= limit:
                source = (
                    "--max-volumes-per-node"
                    if self._max_volumes
                    else f"instance type {instance.get('InstanceType')}"
                )
                raise LimitExceededError(
                    f"node {node_id} has no free attach slot: {attached} volumes attached, "
                    f"limit {limit} ({source})"
                )
            used.append(root)
            if readonly or TAG_READONLY_PREFIX + node_id in _tags(volume):  # set, or clear a stale one
                self._mark_readonly(vid, node_id, readonly)
            for _ in range(3):
                device = self._names.reserve(node_id, used)
                try:
                    try:
                        self.ec2.call("attach_volume", VolumeId=vid, InstanceId=node_id, Device=device)
                    except InvalidParameterError as exc:
                        if "in use" not in str(exc):
                            raise
                        used.append(device)  # taken by someone else since DescribeInstances: next name
                        continue
                    self._wait_attached(vid, node_id)
                    return {keys.PC_DEVICE_PATH: device}
                finally:
                    self._names.release(node_id, device)
            raise TransientError(f"device names on {node_id} keep being taken concurrently; retry")

    def _mark_readonly(self, vid: str, node_id: str, readonly: bool) -> None:
        key = TAG_READONLY_PREFIX + node_id
        if readonly:
            self.ec2.call("create_tags", Resources=[vid], Tags=[{"Key": key, "Value": "true"}])
        else:
            self.ec2.call("delete_tags", Resources=[vid], Tags=[{"Key": key}])

    def _wait_attached(self, vid: str, node_id: str) -> None:
        def check() -> bool | None:
            for a in self._describe_volume(vid).get("Attachments", []):
                if a["InstanceId"] == node_id and a.get("State") == "attached":
                    return True
            return None

        self._poll(f"volume {vid} to attach to {node_id}", check)

    def detach(self, volume_id: str, node_id: str) -> None:
        """Not attached there (or the node is gone) -> no-op; waits until EC2 reports it detached."""
        vid = P.volume_id(volume_id)
        with self._locks.hold(vid):
            volume = self._describe_volume(vid)
            if not any(a["InstanceId"] == node_id for a in volume.get("Attachments", [])):
                return
            with contextlib.suppress(NotFoundError, FailedPreconditionError):
                self.ec2.call("detach_volume", VolumeId=vid, InstanceId=node_id)

            def check() -> bool | None:
                attachments = self._describe_volume(vid).get("Attachments", [])
                return (
                    None
                    if any(a["InstanceId"] == node_id and a.get("State") != "detached" for a in attachments)
                    else True
                )

            self._poll(f"volume {vid} to detach from {node_id}", check)
            if TAG_READONLY_PREFIX + node_id in _tags(volume):
                self._mark_readonly(vid, node_id, False)

    # ------------------------------------------------------------------ snapshots

    def create_snapshot(self, name: str, source_volume_id: str, parameters: Mapping[str, str]) -> Snapshot:
        """Idempotent by the CSIVolumeSnapshotName tag; another source -> AlreadyExistsError."""
        vid = P.volume_id(source_volume_id)
        tags = {P.TAG_SNAPSHOT_NAME: name, P.TAG_DRIVER: "true"}
        for key, value in parameters.items():
            if key.lower().startswith(P.TAG_PREFIX.lower()):
                tags.update(P.user_tags({P.TAG_PREFIX + key[len(P.TAG_PREFIX) :]: value}))
            elif not key.startswith(keys.PREFIX_K8S):
                raise InvalidParameterError(f"unknown snapshot parameter {key!r} for the EBS backend")
        with self._locks.hold("snapshot:" + name):
            found = self._describe_all(
                "describe_snapshots",
                "Snapshots",
                Filters=[{"Name": f"tag:{P.TAG_SNAPSHOT_NAME}", "Values": [name]}],
                OwnerIds=["self"],
            )
            if found:
                snap = self._snapshot(min(found, key=lambda s: s["SnapshotId"]))
                if snap.source_volume_id != vid:
                    raise AlreadyExistsError(
                        f"snapshot {name!r} already exists as {snap.id} of volume {snap.source_volume_id}"
                    )
                return snap
            created = self.ec2.call(
                "create_snapshot",
                VolumeId=vid,
                Description=f"Created by {DEFAULT_DRIVER_NAME}-compatible Ballast for {name}",
                TagSpecifications=_tag_spec("snapshot", tags),
            )
            return self._snapshot(created)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.ec2.call("delete_snapshot", SnapshotId=P.snapshot_id(snapshot_id))

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        sid = P.snapshot_id(snapshot_id)
        snaps = self.ec2.call("describe_snapshots", SnapshotIds=[sid]).get("Snapshots", [])
        if not snaps:
            raise NotFoundError(f"snapshot {sid} not found")
        return self._snapshot(snaps[0])

    def list_snapshots(
        self,
        *,
        snapshot_id: str = "",
        source_volume_id: str = "",
        max_entries: int = 0,
        starting_token: str = "",
    ) -> Page[Snapshot]:
        """By id, by source volume, or all snapshots this driver made. Unknown id/source -> empty."""
        try:
            if snapshot_id:
                snaps = [self.get_snapshot(snapshot_id)]
                if source_volume_id and snaps[0].source_volume_id != P.volume_id(source_volume_id):
                    snaps = []
            else:
                filters = [{"Name": "tag-key", "Values": [P.TAG_SNAPSHOT_NAME]}]
                if source_volume_id:
                    filters = [{"Name": "volume-id", "Values": [P.volume_id(source_volume_id)]}]
                raw = self._describe_all(
                    "describe_snapshots", "Snapshots", Filters=filters, OwnerIds=["self"]
                )
                snaps = [self._snapshot(s) for s in raw]
        except NotFoundError:
            snaps = []
        return self._page(snaps, lambda s: s.id, max_entries, starting_token)

    # ------------------------------------------------------------------ node side

    def _where(self) -> Placement:
        if self._placement is None:
            self._placement = resolve_placement(self._imds, self._node_id, self._zone, self._max_volumes)
        return self._placement

    def node_identity(self) -> NodeIdentity:
        """Instance id, zone (both zone keys) and attach limit; overrides first, then IMDSv2. Without an
        override the limit is recomputed on every call (free_attach_slots): NodeGetInfo reports the
        slots free now, and kubelet re-reads it (CSIDriver nodeAllocatableUpdatePeriodSeconds)."""
        where = self._where()
        max_volumes = where.max_volumes
        if where.instance_type and self._imds is not None:
            try:
                max_volumes = free_attach_slots(self._imds, where.instance_type)
            except FailedPreconditionError as exc:
                log.warning("attach limit not recomputed, keeping %d: %s", max_volumes, exc)
        return NodeIdentity(
            node_id=where.node_id,
            max_volumes=max_volumes,
            topology={self.zone_key: where.zone, keys.WELL_KNOWN_ZONE: where.zone},
        )

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """The attached device whose NVMe serial names the volume (or the named Xen device)."""
        return self._devices.find(P.volume_id(volume_id), publish_context)
