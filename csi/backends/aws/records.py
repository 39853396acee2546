"""EC2 records as backend records: the mapping from DescribeVolumes / DescribeSnapshots items to Disk and
Snapshot, the tags that carry what EC2 has no field for, and the seek paging of listings."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from csi import keys
from csi.backends.aws import params as P
from csi.backends.base import Attachment, Condition, ContentSource, Disk, GiB, Page, Snapshot, SourceKind
from csi.failures import InvalidTokenError

T = TypeVar("T")

TAG_SOURCE_VOLUME = "CSISourceVolumeId"  # set on clones: CreateVolume idempotency compares it
TAG_READONLY_PREFIX = "ballast.dev/published-readonly/"  # + instance id: published read-only there
TAG_CONTEXT_PREFIX = "ballast.dev/volume-context/"  # one tag per generic volume_context entry (fsType, ...)
ATTACHED_STATES = ("attaching", "attached")
TOKEN_PREFIX = "after:"


def tags(item: Mapping[str, Any]) -> dict[str, str]:
    """An EC2 item's tags as a dict."""
    return {t["Key"]: t.get("Value", "") for t in item.get("Tags", [])}


def tag_spec(resource: str, values: Mapping[str, str]) -> list[dict[str, Any]]:
    """TagSpecifications for creating one `resource` ("volume", "snapshot") with these tags."""
    return [{"ResourceType": resource, "Tags": [{"Key": k, "Value": v} for k, v in values.items()]}]


def topology(zone_key: str, zone: str) -> dict[str, str]:
    """The topology segment of a zone: the driver's own key and the well-known one."""
    return {zone_key: zone, keys.WELL_KNOWN_ZONE: zone}


def _parameters(volume: Mapping[str, Any]) -> dict[str, str]:
    params = {P.TYPE: volume.get("VolumeType", "")}
    if volume.get("Iops"):
        params[P.IOPS] = str(volume["Iops"])
    if volume.get("Throughput"):
        params[P.THROUGHPUT] = str(volume["Throughput"])
    if volume.get("Encrypted"):
        params[P.ENCRYPTED] = "true"
    return params


def _source(volume: Mapping[str, Any], volume_tags: Mapping[str, str]) -> ContentSource | None:
    if volume_tags.get(TAG_SOURCE_VOLUME):
        return ContentSource(SourceKind.VOLUME, volume_tags[TAG_SOURCE_VOLUME])
    if volume.get("SnapshotId"):
        return ContentSource(SourceKind.SNAPSHOT, volume["SnapshotId"])
    return None


def _attachments(volume: Mapping[str, Any], volume_tags: Mapping[str, str]) -> tuple[Attachment, ...]:
    return tuple(
        Attachment(
            node_id=a["InstanceId"],
            readonly=TAG_READONLY_PREFIX + a["InstanceId"] in volume_tags,
            publish_context={keys.PC_DEVICE_PATH: a.get("Device", "")},
        )
        for a in volume.get("Attachments", [])
        if a.get("State") in ATTACHED_STATES
    )


def to_disk(volume: Mapping[str, Any], zone_key: str) -> Disk:
    """The Disk of an EC2 volume; `zone_key` is the driver's topology key."""
    volume_tags = tags(volume)
    state = volume.get("State", "")
    condition = Condition()
    if state == "error":
        condition = Condition(abnormal=True, message=f"EBS reports volume state {state!r}")
    return Disk(
        id=volume["VolumeId"],
        name=volume_tags.get(P.TAG_VOLUME_NAME, volume["VolumeId"]),
        size_bytes=int(volume["Size"]) * GiB,
        topology=topology(zone_key, volume["AvailabilityZone"]),
        parameters=_parameters(volume),
        volume_context={
            k[len(TAG_CONTEXT_PREFIX) :]: v
            for k, v in volume_tags.items()
            if k.startswith(TAG_CONTEXT_PREFIX)
        },
        source=_source(volume, volume_tags),
        attachments=_attachments(volume, volume_tags),
        condition=condition,
        multi_node=bool(volume.get("MultiAttachEnabled")),
    )


def to_snapshot(snap: Mapping[str, Any]) -> Snapshot:
    """The Snapshot of an EC2 snapshot; ready once EC2 reports it completed."""
    started = snap.get("StartTime")
    return Snapshot(
        id=snap["SnapshotId"],
        name=tags(snap).get(P.TAG_SNAPSHOT_NAME, snap["SnapshotId"]),
        source_volume_id=snap.get("VolumeId", ""),
        size_bytes=int(snap.get("VolumeSize", 0)) * GiB,
        created_at=started.timestamp() if started is not None else 0.0,
        ready=snap.get("State") == "completed",
    )


def page(items: Sequence[T], ident: Callable[[T], str], max_entries: int, token: str) -> Page[T]:
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
