"""Reply messages built from backend records and staging results: the one place that knows how a
Disk, Snapshot, GroupSnapshot, a volume's stats or health, and storage health look on the wire."""

from __future__ import annotations

from collections.abc import Iterable

from csi._proto import csi_pb2
from csi.backends.base import ContentSource, Disk, GroupSnapshot, Snapshot, SourceKind
from csi.health import Status, StorageIssue, StorageStatus, VolumeHealth
from csi.sizing import VolumeStats

VOLUME_STATUS = {
    Status.DEGRADED: csi_pb2.DEGRADED,
    Status.INACCESSIBLE: csi_pb2.INACCESSIBLE,
    Status.DATA_LOSS: csi_pb2.DATA_LOSS,
}
STORAGE_STATUS = {
    StorageStatus.DEGRADED: csi_pb2.STORAGE_DEGRADED,
    StorageStatus.UNREACHABLE: csi_pb2.STORAGE_UNREACHABLE,
}


def content_source(source: ContentSource | None) -> csi_pb2.VolumeContentSource | None:
    if source is None:
        return None
    if source.kind is SourceKind.SNAPSHOT:
        return csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=source.id)
        )
    return csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=source.id))


def volume_message(disk: Disk) -> csi_pb2.Volume:
    vol = csi_pb2.Volume(
        volume_id=disk.id,
        capacity_bytes=disk.size_bytes,
        volume_context=dict(disk.volume_context),
        content_source=content_source(disk.source),
    )
    if disk.topology:
        vol.accessible_topology.append(csi_pb2.Topology(segments=dict(disk.topology)))
    return vol


def snapshot_message(snap: Snapshot) -> csi_pb2.Snapshot:
    msg = csi_pb2.Snapshot(
        snapshot_id=snap.id,
        source_volume_id=snap.source_volume_id,
        size_bytes=snap.size_bytes,
        ready_to_use=snap.ready,
        group_snapshot_id=snap.group_id,
        accessible_topology=[csi_pb2.Topology(segments=dict(t)) for t in snap.topology],
    )
    msg.creation_time.FromNanoseconds(int(snap.created_at * 1e9))
    return msg


def group_message(group: GroupSnapshot) -> csi_pb2.VolumeGroupSnapshot:
    msg = csi_pb2.VolumeGroupSnapshot(
        group_snapshot_id=group.id,
        snapshots=[snapshot_message(s) for s in group.snapshots],
        ready_to_use=group.ready and all(s.ready for s in group.snapshots),
    )
    msg.creation_time.FromNanoseconds(int(group.created_at * 1e9))
    return msg


def volume_stats(stats: VolumeStats) -> csi_pb2.NodeGetVolumeStatsResponse:
    """Usage: bytes and inodes of a filesystem, bytes of a block device."""
    Usage = csi_pb2.VolumeUsage
    if stats.usage is None:
        return csi_pb2.NodeGetVolumeStatsResponse(usage=[Usage(unit=Usage.BYTES, total=stats.block_bytes)])
    u = stats.usage
    return csi_pb2.NodeGetVolumeStatsResponse(
        usage=[
            Usage(unit=Usage.BYTES, total=u.total_bytes, available=u.available_bytes, used=u.used_bytes),
            Usage(unit=Usage.INODES, total=u.total_inodes, available=u.free_inodes, used=u.used_inodes),
        ]
    )


def volume_health(health: VolumeHealth) -> csi_pb2.VolumeHealth:
    Entry = csi_pb2.VolumeHealth.VolumeHealthEntry
    return csi_pb2.VolumeHealth(
        volume_id=health.volume_id,
        health_statuses=[
            Entry(status=VOLUME_STATUS[i.status], reason=i.reason, message=i.message) for i in health.issues
        ],
    )


def storage_health(issues: Iterable[StorageIssue]) -> csi_pb2.NodeGetStorageHealthResponse:
    Health = csi_pb2.NodeGetStorageHealthResponse.StorageBackendHealth
    return csi_pb2.NodeGetStorageHealthResponse(
        backend_health=[
            Health(status=STORAGE_STATUS[i.status], reason=i.reason, message=i.message) for i in issues
        ]
    )
