"""EC2 records as backend records: the mapping from DescribeVolumes / DescribeSnapshots items to Disk and
Snapshot, and the tags that carry what EC2 has no field for. Listings page with base.seek_page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from csi import keys
from csi.backends.aws import params as P
from csi.backends.base import Attachment, ContentSource, Disk, GiB, Snapshot, SourceKind

ATTACHED_STATES = ("attaching", "attached")


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
    if volume_tags.get(P.TAG_SOURCE_VOLUME):
        return ContentSource(SourceKind.VOLUME, volume_tags[P.TAG_SOURCE_VOLUME])
    if volume.get("SnapshotId"):
        return ContentSource(SourceKind.SNAPSHOT, volume["SnapshotId"])
    return None


def _attachments(volume: Mapping[str, Any], volume_tags: Mapping[str, str]) -> tuple[Attachment, ...]:
    return tuple(
        Attachment(
            node_id=a["InstanceId"],
            readonly=P.TAG_READONLY_PREFIX + a["InstanceId"] in volume_tags,
            publish_context={keys.PC_DEVICE_PATH: a.get("Device", "")},
        )
        for a in volume.get("Attachments", [])
        if a.get("State") in ATTACHED_STATES
    )


def to_disk(volume: Mapping[str, Any], zone_key: str) -> Disk:
    """The Disk of an EC2 volume; `zone_key` is the driver's topology key."""
    volume_tags = tags(volume)
    return Disk(
        id=volume["VolumeId"],
        name=volume_tags.get(P.TAG_VOLUME_NAME, volume["VolumeId"]),
        size_bytes=int(volume["Size"]) * GiB,
        topology=topology(zone_key, volume["AvailabilityZone"]),
        parameters=_parameters(volume),
        volume_context={
            k[len(P.TAG_CONTEXT_PREFIX) :]: v
            for k, v in volume_tags.items()
            if k.startswith(P.TAG_CONTEXT_PREFIX)
        },
        source=_source(volume, volume_tags),
        attachments=_attachments(volume, volume_tags),
        multi_node=bool(volume.get("MultiAttachEnabled")),
    )


def accessible_zones(snap: Mapping[str, Any]) -> list[str]:
    """The zones a snapshot was created to be restored in ([]: no promise was asked for)."""
    return [z for z in tags(snap).get(P.TAG_ACCESSIBLE_ZONES, "").split(",") if z]


def to_snapshot(snap: Mapping[str, Any], zone_key: str) -> Snapshot:
    """The Snapshot of an EC2 snapshot; ready once EC2 reports it completed. `zone_key` is the driver's
    topology key: a snapshot made with accessibility requirements reports the zones it was made for."""
    started = snap.get("StartTime")
    return Snapshot(
        id=snap["SnapshotId"],
        name=tags(snap).get(P.TAG_SNAPSHOT_NAME, snap["SnapshotId"]),
        source_volume_id=snap.get("VolumeId", ""),
        size_bytes=int(snap.get("VolumeSize", 0)) * GiB,
        created_at=started.timestamp() if started is not None else 0.0,
        ready=snap.get("State") == "completed",
        topology=tuple(topology(zone_key, z) for z in accessible_zones(snap)),
    )
