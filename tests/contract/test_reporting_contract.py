"""The contracts of the optional read-only operations (csi/backends/reporting.py) and of snapshot
topology, held against every backend that offers them: health of a healthy and of an unknown volume,
paging tokens, the device a volume has on this host, where snapshots can be restored, and the checks
snapshot metadata makes before its first range."""

from __future__ import annotations

import pytest

from csi.failures import InvalidTokenError, NotFoundError, OutOfCapacityError, OutOfRangeError
from tests.contract.conftest import Subject
from tests.contract.test_backend_contract import _needs, _options


def test_a_new_volume_is_healthy_and_not_listed(subject: Subject) -> None:
    _needs(subject, "volume_health")
    disk = subject.backend.create_volume("pvc-h", _options(subject))
    assert subject.backend.volume_health(disk.id) == ()
    assert disk.id not in [h.volume_id for h in subject.backend.list_volume_health().items]


def test_health_of_an_unknown_volume_is_not_found(subject: Subject) -> None:
    _needs(subject, "volume_health")
    for volume_id in [subject.unknown_volume, *subject.malformed]:
        with pytest.raises(NotFoundError):
            subject.backend.volume_health(volume_id)


def test_a_foreign_health_token_is_refused(subject: Subject) -> None:
    _needs(subject, "volume_health")
    with pytest.raises(InvalidTokenError):
        subject.backend.list_volume_health(starting_token="not-ours")


def test_a_volume_not_on_this_host_has_no_device(subject: Subject) -> None:
    _needs(subject, "node_volume_health")
    disk = subject.backend.create_volume("pvc-d", _options(subject))
    assert subject.backend.prepared_device(disk.id) is None


def test_snapshots_report_where_they_restore_and_refuse_an_unserved_requisite(subject: Subject) -> None:
    _needs(subject, "snapshot_topology")
    disk = subject.backend.create_volume("pvc-t", _options(subject))
    snap = subject.backend.create_snapshot("snap-t", disk.id, {}, requisite=[dict(disk.topology)])
    assert snap.topology, "a snapshot made with requirements says where it can be restored"
    for segment in snap.topology:
        assert set(segment) <= set(subject.backend.capabilities.topology_keys)
    nowhere = {key: "no-such-place" for key in disk.topology}
    with pytest.raises(OutOfCapacityError):
        subject.backend.create_snapshot("snap-x", disk.id, {}, requisite=[nowhere])


def test_snapshot_metadata_checks_before_the_first_range(subject: Subject) -> None:
    _needs(subject, "snapshot_metadata")
    disk = subject.backend.create_volume("pvc-m", _options(subject))
    snap = subject.backend.create_snapshot("snap-m", disk.id, {})
    block = subject.backend.capabilities.metadata_block_size
    with pytest.raises(NotFoundError):
        subject.backend.snapshot_allocated(subject.unknown_snapshot, 0, block, {})
    with pytest.raises(OutOfRangeError):
        subject.backend.snapshot_allocated(snap.id, snap.size_bytes + 1, block, {})
    blocks = subject.backend.snapshot_allocated(snap.id, 0, block, {})
    assert blocks.volume_bytes == snap.size_bytes
    assert all(r.offset % block == 0 for r in blocks.ranges)
