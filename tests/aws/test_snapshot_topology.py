"""Snapshot accessibility on EBS: the zones a CreateSnapshot with requisite topology is promised are
kept in a tag and reported as its topology; a requisite outside the region, or a restore that none of
the promised zones satisfies, is RESOURCE_EXHAUSTED; any other restore lands in a promised zone."""

from __future__ import annotations

from typing import Any

import pytest

from csi import keys
from csi.backends.aws import AwsBackend
from csi.backends.aws.params import TAG_ACCESSIBLE_ZONES
from csi.backends.aws.records import tags
from csi.backends.base import ContentSource, DiskOptions, GiB, SourceKind
from csi.failures import OutOfCapacityError
from tests.aws.conftest import OTHER_ZONE
from tests.motoserver import ZONE

ZONE_KEY = keys.topology_zone_key("ebs.csi.aws.com")


def _segment(zone: str) -> dict[str, str]:
    return {ZONE_KEY: zone, keys.WELL_KNOWN_ZONE: zone}


def test_a_requisite_zone_is_promised_and_reported(backend: AwsBackend, ec2: Any) -> None:
    vol = backend.create_volume("v", DiskOptions(size_bytes=GiB))
    snap = backend.create_snapshot("s", vol.id, {}, requisite=[{keys.WELL_KNOWN_ZONE: ZONE}])
    assert [dict(t) for t in snap.topology] == [_segment(ZONE)]
    raw = ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0]
    assert tags(raw)[TAG_ACCESSIBLE_ZONES] == ZONE
    assert [dict(t) for t in backend.get_snapshot(snap.id).topology] == [_segment(ZONE)]
    listed = backend.list_snapshots(source_volume_id=vol.id).items
    assert [dict(t) for t in listed[0].topology] == [_segment(ZONE)]


def test_without_requirements_a_snapshot_is_usable_from_every_zone(backend: AwsBackend) -> None:
    vol = backend.create_volume("v", DiskOptions(size_bytes=GiB))
    assert backend.create_snapshot("s", vol.id, {}).topology == ()


def test_a_requisite_outside_the_region_is_refused(backend: AwsBackend, ec2: Any) -> None:
    vol = backend.create_volume("v", DiskOptions(size_bytes=GiB))
    with pytest.raises(OutOfCapacityError, match="is a zone of this region"):
        backend.create_snapshot("s", vol.id, {}, requisite=[_segment("eu-west-9z")])
    assert ec2.describe_snapshots(Filters=[{"Name": "volume-id", "Values": [vol.id]}])["Snapshots"] == []


def test_a_restore_stays_in_the_promised_zones(backend: AwsBackend) -> None:
    vol = backend.create_volume("v", DiskOptions(size_bytes=GiB))
    snap = backend.create_snapshot("s", vol.id, {}, requisite=[_segment(ZONE)])
    source = ContentSource(SourceKind.SNAPSHOT, snap.id)
    elsewhere = DiskOptions(size_bytes=GiB, source=source, requisite=[_segment(OTHER_ZONE)])
    with pytest.raises(OutOfCapacityError, match=snap.id):
        backend.create_volume("restored-elsewhere", elsewhere)
    either = DiskOptions(
        size_bytes=GiB,
        source=source,
        requisite=[_segment(OTHER_ZONE), _segment(ZONE)],
        preferred=[_segment(OTHER_ZONE)],
    )
    restored = backend.create_volume("restored", either)
    assert restored.topology[keys.WELL_KNOWN_ZONE] == ZONE, "the preferred zone was not promised"


@pytest.mark.parametrize(
    ("requisite", "preferred", "zone"),
    [
        pytest.param([], [], OTHER_ZONE, id="no-requirements"),
        pytest.param([], [_segment(ZONE)], OTHER_ZONE, id="preferred-outside-the-promise"),
        pytest.param([{"kubernetes.io/hostname": "node-1"}], [], OTHER_ZONE, id="requisite-without-a-zone"),
        pytest.param(
            [{"kubernetes.io/hostname": "node-1"}],
            [_segment(ZONE), _segment("us-east-1c")],
            "us-east-1c",
            id="preferred-promised-zone-first",
        ),
    ],
)
def test_a_restore_without_a_zone_requirement_lands_in_a_promised_zone(
    backend: AwsBackend, requisite: list[dict[str, str]], preferred: list[dict[str, str]], zone: str
) -> None:
    """docs/aws.md: a restore "otherwise lands in one of them", not in the driver's default zone (ZONE)."""
    vol = backend.create_volume("v", DiskOptions(size_bytes=GiB))
    promised = [_segment(OTHER_ZONE), _segment("us-east-1c")]
    snap = backend.create_snapshot("s", vol.id, {}, requisite=promised)
    source = ContentSource(SourceKind.SNAPSHOT, snap.id)
    restore = DiskOptions(size_bytes=GiB, source=source, requisite=requisite, preferred=preferred)
    assert backend.create_volume("restored", restore).topology[keys.WELL_KNOWN_ZONE] == zone
