"""Reply messages built from backend records and staging results: the one place that knows how a
Disk, Snapshot, GroupSnapshot or a volume's stats look on the wire."""

from __future__ import annotations

from csi._proto import csi_pb2
from csi.backends.base import Condition, ContentSource, Disk, GroupSnapshot, Snapshot, SourceKind
from csi.staging import VolumeStats

HEALTHY = Condition().message


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
    """Usage (bytes and inodes of a filesystem, bytes of a block device) and the volume condition."""
    condition = csi_pb2.VolumeCondition(abnormal=bool(stats.abnormal), message=stats.abnormal or HEALTHY)
    Usage = csi_pb2.VolumeUsage
    if stats.usage is not None:
        u = stats.usage
        usage = [
            Usage(unit=Usage.BYTES, total=u.total_bytes, available=u.available_bytes, used=u.used_bytes),
            Usage(unit=Usage.INODES, total=u.total_inodes, available=u.free_inodes, used=u.used_inodes),
        ]
    elif stats.abnormal:
        usage = []
    else:
        usage = [Usage(unit=Usage.BYTES, total=stats.block_bytes)]
    return csi_pb2.NodeGetVolumeStatsResponse(usage=usage, volume_condition=condition)
