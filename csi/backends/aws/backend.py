"""AWS EBS backend: EC2 volumes, snapshots and attachments through an injected boto3 client.

The work is split by resource: volumes.py (create, clone; idempotent by the `CSIVolumeName` tag and a
name-derived client token), attachments.py, snapshots.py, zones.py (placement), records.py (EC2 records
as Disk/Snapshot), mutable.py (VolumeAttributesClass parameters), modifications.py (ModifyVolume and
its waits), health.py (DescribeVolumeStatus), cbt.py (changed blocks, EBS direct APIs). Handles are
EC2 ids; the in-tree forms `aws://zone/vol-...` and `aws:///vol-...` are accepted everywhere and
normalised to `vol-...` (params.volume_id). Every EC2 request goes through ec2.Ec2 (throttling
retried, error codes mapped once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from csi import extents, keys
from csi.backends.aws import mutable, records
from csi.backends.aws import params as P
from csi.backends.aws.attachments import Attacher
from csi.backends.aws.cbt import EBS_BLOCK, EbsBlocks
from csi.backends.aws.clones import ScratchSnapshots
from csi.backends.aws.coalesce import Coalescer
from csi.backends.aws.devices import DeviceFinder
from csi.backends.aws.ec2 import PAGE_SIZE, Backoff, Ec2
from csi.backends.aws.health import EbsHealth
from csi.backends.aws.listing import Listings
from csi.backends.aws.metadata import Imds, Placement, free_attach_slots, launched_volumes, resolve_placement
from csi.backends.aws.modifications import Modifications
from csi.backends.aws.ownertags import OwnerTags
from csi.backends.aws.snapshots import EbsSnapshots
from csi.backends.aws.volumes import LIVE_VOLUME_STATES, VolumeCreator
from csi.backends.aws.zones import Zones
from csi.backends.base import (
    EMPTY,
    Backend,
    BackendCapabilities,
    BlockMap,
    Disk,
    DiskOptions,
    GiB,
    NodeIdentity,
    Page,
    SourceKind,
)
from csi.backends.snapshotting import SnapshotDelegation
from csi.failures import DriverError, FailedPreconditionError, NotFoundError
from csi.health import Issue, VolumeHealth
from shim import failpoints

if TYPE_CHECKING:
    from csi.config import Config

DEFAULT_DRIVER_NAME = "ebs.csi.aws.com"

# Volumes ListVolumes reports: made by this driver or by the in-tree plugin (its PV tag).
LISTED_TAG_KEYS = [P.TAG_VOLUME_NAME, P.TAG_CREATED_FOR + "pv/name"]

log = logging.getLogger("ballast.aws")


def capabilities(zone_key: str, max_volumes: int, changed_blocks: bool) -> BackendCapabilities:
    """What EBS offers, in whole GiB. `changed_blocks`: an EBS direct API client is at hand."""
    return BackendCapabilities(
        snapshots=True,
        clone=True,
        expand_online=True,
        expand_offline=True,
        attach_required=True,
        block_multi_attach=True,
        list_volumes=True,
        list_snapshots=True,
        modify_volume=True,
        coalesces_modifications=True,
        volume_health=True,
        node_volume_health=True,
        snapshot_topology=True,
        snapshot_metadata=changed_blocks,
        metadata_block_size=EBS_BLOCK,
        topology_keys=(zone_key, keys.WELL_KNOWN_ZONE),
        size_granularity=GiB,
        min_size=GiB,
        default_size=100 * GiB,
        max_volumes_per_node=max_volumes,
    )


class AwsBackend(SnapshotDelegation, Backend):
    """EBS through boto3. The clients are injected (`ebs_client`, for the EBS direct APIs, is optional:
    without it no changed-block metadata is served); `from_config` builds the production ones."""

    default_driver_name = DEFAULT_DRIVER_NAME

    def __init__(
        self,
        client: Any,
        *,
        ebs_client: Any = None,
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
        page_size: int = PAGE_SIZE,
        describe_batch_window: float = 0.0,
        owner_tags: OwnerTags | None = None,
        warn_on_invalid_tag: bool = False,
    ) -> None:
        self.ec2 = Ec2(client, backoff, sleep, wait_timeout, page_size, describe_batch_window)
        self.zone_key = keys.topology_zone_key(driver_name)
        self._zone = "" if zone == "local" else zone
        self._node_id = node_id
        self._max_volumes = max_volumes
        self._imds = imds
        self._controller = controller
        self._devices = device_finder or DeviceFinder()
        zones = Zones(self.ec2, self.zone_key, zone)
        owner = (owner_tags or OwnerTags()).check()
        self._lenient_tags = warn_on_invalid_tag  # a class's tag that cannot be made is left off, not refused
        self._creator = VolumeCreator(self.ec2, zones, self.zone_key, owner, warn_on_invalid_tag)
        self._attacher = Attacher(self.ec2, max_volumes)
        self._scratch = ScratchSnapshots(self.ec2, owner)
        self._snapshots = EbsSnapshots(self.ec2, zones, self.zone_key, owner, warn_on_invalid_tag)
        self._health = EbsHealth(self.ec2)
        self.ebs = Ec2(ebs_client, backoff, sleep, wait_timeout) if ebs_client is not None else None
        self._blocks = EbsBlocks(self.ec2, self.ebs) if self.ebs is not None else None
        self._modifications = Modifications(self.ec2, self.zone_key)
        self._modifier: Coalescer[Disk] = Coalescer(self._modifications.apply, modify_window, sleep)
        self._placement: Placement | None = None
        self._listings = Listings(self._listed)
        self.capabilities = capabilities(self.zone_key, max_volumes, self._blocks is not None)

    @classmethod
    def from_config(cls, config: Config) -> Self:
        """Client for `--aws-region` / `--aws-endpoint-url` with the standard credential chain; retries
        are ours (ec2.Ec2), so botocore's own are off."""
        import boto3
        from botocore.config import Config as BotoConfig

        imds = None if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true" else Imds()
        session = boto3.session.Session()
        region = config.backend.aws_region or session.region_name or ""
        if not region and imds is not None:
            with contextlib.suppress(DriverError):
                region = imds.get("placement/region")
        if not region:
            if config.runs_controller:
                raise FailedPreconditionError(
                    "aws backend: no region; give --aws-region (or AWS_REGION), or run where instance "
                    "metadata answers"
                )
            region = "us-east-1"  # a node-only process never calls EC2; the client just needs a region
        boto_config = BotoConfig(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
            user_agent_extra="ballast-csi",
        )
        client = session.client(
            "ec2",
            region_name=region or None,
            endpoint_url=config.backend.aws_endpoint_url or None,
            config=boto_config,
        )
        # EBS direct APIs (changed blocks), controller only; boto3 honours AWS_ENDPOINT_URL_EBS
        ebs = (
            session.client("ebs", region_name=region, config=boto_config) if config.runs_controller else None
        )
        return cls(
            client,
            ebs_client=ebs,
            driver_name=config.backend.driver_name,
            zone=config.backend.zone,
            node_id=config.node.node_id,
            max_volumes=config.node.max_volumes_per_node,
            imds=imds,
            controller=config.runs_controller,
            describe_batch_window=config.backend.aws_describe_batch_window,
            owner_tags=OwnerTags(config.backend.aws_extra_tags, config.backend.aws_k8s_tag_cluster_id),
            warn_on_invalid_tag=config.backend.aws_warn_on_invalid_tag,
        )

    # ------------------------------------------------------------------ lifecycle

    def probe(self) -> bool:
        """Controller: one cheap EC2 call proves endpoint and credentials (FailedPreconditionError if
        not). Node only: always ready (nodes need no EC2 access)."""
        if self._controller:
            self.ec2.zones()
        return True

    def close(self) -> None:
        for api in (self.ec2, self.ebs):
            with contextlib.suppress(Exception):
                if api is not None:
                    api.client.close()

    def retries(self) -> dict[str, int]:
        """EC2 calls retried after throttling, server errors or an unreachable endpoint, by operation."""
        return self.ec2.retry_counts()

    def _disk(self, volume: Mapping[str, Any]) -> Disk:
        return records.to_disk(volume, self.zone_key)

    def canonical_volume_id(self, volume_id: str) -> str:
        """`vol-...` for every accepted handle (`aws://zone/vol-...`, `aws:///vol-...`)."""
        try:
            return P.volume_id(volume_id)
        except NotFoundError:
            return volume_id

    # ------------------------------------------------------------------ parameters

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return P.validate(parameters, self._lenient_tags)

    def validate_mutable_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        return mutable.validate(parameters, self._lenient_tags)

    # ------------------------------------------------------------------ volumes

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        """Idempotent by name (tag lookup under a per-name lock, then a name-derived client token). A
        clone's create, found or made, ends with its scratch snapshots deleted (clones.py)."""
        disk = self._creator.create(name, options)
        if options.source is not None and options.source.kind is SourceKind.VOLUME:
            self._scratch.clear(name)
        return disk

    def delete_volume(self, volume_id: str) -> None:
        """Missing -> NotFoundError; attached -> FailedPreconditionError."""
        self.ec2.call("delete_volume", VolumeId=P.volume_id(volume_id))
        failpoints.hit("aws.delete.requested")

    def get_volume(self, volume_id: str) -> Disk:
        """At its original size while a resize is still `modifying` (modifications.py)."""
        vid = P.volume_id(volume_id)
        return self._modifications.usable(vid, self._disk(self.ec2.describe_volume(vid)))

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        """Volumes made by this driver or the in-tree plugin, with the nodes they are attached to; the
        pages of one listing come from one snapshot of them (listing.py)."""
        page = self._listings.page(max_entries, starting_token)
        return Page(items=[self._disk(v) for v in page.items], next_token=page.next_token)

    def _listed(self) -> list[dict[str, Any]]:
        """The EC2 records of the volumes ListVolumes reports."""
        volumes: dict[str, dict[str, Any]] = {}
        for tag_key in LISTED_TAG_KEYS:  # one query per key: some endpoints do not OR tag-key values
            for volume in self.ec2.describe_all(
                "describe_volumes",
                "Volumes",
                Filters=[
                    {"Name": "tag-key", "Values": [tag_key]},
                    {"Name": "status", "Values": LIVE_VOLUME_STATES},
                ],
            ):
                volumes[volume["VolumeId"]] = volume
        return list(volumes.values())

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        """Grow to whole GiB, coalesced with a concurrent modify into one ModifyVolume. Already that big
        -> current size, no modification. Missing -> NotFoundError."""
        return self._modifier.submit(P.volume_id(volume_id), size_bytes=size_bytes).size_bytes

    def modify_volume(
        self, volume_id: str, mutable_parameters: Mapping[str, str], metadata: Mapping[str, str] = EMPTY
    ) -> Disk:
        """Type/iops/throughput first, coalesced with a concurrent resize into one ModifyVolume, then
        the tag changes (mutable.py), only once EC2 took the modification. Spec, ControllerModifyVolume:
        on INVALID_ARGUMENT "the SP MUST NOT have applied any modification to the volume as part of
        this specific call", so a template the claim cannot render, settings the volume cannot take
        (checked before any call) or EC2 refusing the ModifyVolume leaves the tags as they were."""
        vid = P.volume_id(volume_id)
        changes = mutable.tag_changes(mutable_parameters, metadata, self._lenient_tags)
        settings = mutable.settings(mutable_parameters)
        if not changes:
            return self._modifier.submit(vid, parameters=settings)
        modified = self._modifier.submit(vid, parameters=settings) if settings else None
        volume = self.ec2.describe_volume(vid)
        mutable.apply(self.ec2, vid, changes, records.tags(volume))
        return modified or self._disk(volume)  # a Disk reads none of the user's tags

    # ------------------------------------------------------------------ attachment (attachments.py)

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        return self._attacher.attach(P.volume_id(volume_id), node_id, readonly)

    def detach(self, volume_id: str, node_id: str) -> None:
        self._attacher.detach(P.volume_id(volume_id), node_id)

    # ------------------------------------------------------------------ health (health.py), blocks (cbt.py)

    def volume_health(self, volume_id: str) -> tuple[Issue, ...]:
        return self._health.volume(self.ec2.describe_volume(P.volume_id(volume_id)))

    def list_volume_health(self, max_entries: int = 0, starting_token: str = "") -> Page[VolumeHealth]:
        return self._health.listing(self._listed(), max_entries, starting_token)

    def _changed_blocks(self) -> EbsBlocks:
        if self._blocks is None:
            raise FailedPreconditionError(
                "this driver has no EBS direct API client (it serves no controller)"
            )
        return self._blocks

    def snapshot_allocated(
        self, snapshot_id: str, start: int, block: int, secrets: Mapping[str, str]
    ) -> BlockMap:
        """The request's secrets are not used: the driver's AWS identity signs the EBS calls."""
        return self._changed_blocks().allocated(snapshot_id, start, block)

    def snapshot_delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        secrets: Mapping[str, str],
        wanted: Callable[[], bool] = extents.always,
    ) -> BlockMap:
        """`wanted` is not asked: every page of changed blocks is one EBS call, and the stream sees the
        call end between its messages."""
        return self._changed_blocks().delta(base_id, target_id, start, block)

    # ------------------------------------------------------------------ node side

    def prepared_device(self, volume_id: str) -> str | None:
        """The attached device whose NVMe serial names the volume, if the node has it now (no wait)."""
        try:
            return self._devices.find(P.volume_id(volume_id), {}, wait=False)
        except NotFoundError:
            return None

    def _where(self) -> Placement:
        if self._placement is None:
            self._placement = resolve_placement(self._imds, self._node_id, self._zone, self._max_volumes)
        return self._placement

    def node_identity(self) -> NodeIdentity:
        """Instance id, zone (both zone keys) and attach limit; overrides first, then IMDSv2. The limit
        is what CSI volumes may take: recomputed on every call (_free_slots), kubelet re-reading it
        (CSIDriver nodeAllocatableUpdatePeriodSeconds)."""
        where = self._where()
        return NodeIdentity(
            node_id=where.node_id,
            max_volumes=self._free_slots(where),
            topology=records.topology(self.zone_key, where.zone),
        )

    def _free_slots(self, where: Placement) -> int:
        """Without an override, free_attach_slots (with the NVMe instance store volumes this node
        sees); with --max-volumes-per-node N, N minus the EBS volumes mapped at launch, which the
        controller counts against N too (attachments.py), so that the N-th publish the scheduler
        allows is not RESOURCE_EXHAUSTED. Metadata unreachable: the figure known so far."""
        if self._imds is None or not (where.instance_type or self._max_volumes):
            return where.max_volumes
        try:
            if self._max_volumes:
                return max(0, self._max_volumes - launched_volumes(self._imds))
            return free_attach_slots(self._imds, where.instance_type, self._devices.instance_stores())
        except FailedPreconditionError as exc:
            log.warning("attach limit not recomputed, keeping %d: %s", where.max_volumes, exc)
            return where.max_volumes

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """The attached device whose NVMe serial names the volume (or the named Xen device)."""
        return self._devices.find(P.volume_id(volume_id), publish_context)
