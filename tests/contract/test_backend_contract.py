"""The contracts of csi.backends.base.Backend, stated once and held against every backend (the fake the
unit tests use included, so it cannot drift from the real ones): idempotency by name, not-found,
attachment rules, paging, expansion, snapshots, and the shape of what comes back."""

from __future__ import annotations

import pytest

from csi.backends.base import ContentSource, DiskOptions, SourceKind
from csi.failures import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidParameterError,
    InvalidTokenError,
    NotFoundError,
)
from tests.contract.conftest import Subject


def _options(s: Subject, units: int = 2, **extra: object) -> DiskOptions:
    return DiskOptions(size_bytes=units * s.unit, **extra)  # type: ignore[arg-type]


def _needs(s: Subject, flag: str) -> None:
    if not getattr(s.backend.capabilities, flag):
        pytest.skip(f"{type(s.backend).__name__} does not offer {flag}")


# ---------------------------------------------------------------------------- volumes


def test_create_is_idempotent_by_name(subject: Subject) -> None:
    first = subject.backend.create_volume("pvc-a", _options(subject))
    again = subject.backend.create_volume("pvc-a", _options(subject))
    assert again.id == first.id and again.size_bytes == first.size_bytes == 2 * subject.unit
    assert subject.backend.get_volume(first.id).id == first.id
    assert set(first.topology) <= set(subject.backend.capabilities.topology_keys)


def test_the_same_name_with_other_options_already_exists(subject: Subject) -> None:
    subject.backend.create_volume("pvc-a", _options(subject, 2))
    with pytest.raises(AlreadyExistsError):
        subject.backend.create_volume("pvc-a", _options(subject, 3))


@pytest.mark.parametrize(
    ("units", "answered"),
    [
        pytest.param((0, 0), True, id="no-range"),
        pytest.param((1, 0), True, id="required-below-it"),
        pytest.param((2, 2), True, id="exactly-it"),
        pytest.param((1, 3), True, id="range-around-it"),
        pytest.param((3, 0), False, id="required-above-it"),
        pytest.param((1, 1), False, id="limit-below-it"),
    ],
)
def test_a_repeat_whose_capacity_range_holds_the_volume_is_answered_by_it(
    subject: Subject, units: tuple[int, int], answered: bool
) -> None:
    """Spec, CreateVolume: a volume of the name "compatible with the specified capacity_range" is the
    answer; ALREADY_EXISTS when its size is outside the range."""
    first = subject.backend.create_volume("pvc-r", _options(subject, 2))
    required, limit = (n * subject.unit for n in units)
    repeat = _options(subject, units[0] or 2, size_range=(required, limit))
    if answered:
        again = subject.backend.create_volume("pvc-r", repeat)
        assert (again.id, again.size_bytes) == (first.id, first.size_bytes)
        return
    with pytest.raises(AlreadyExistsError, match="pvc-r"):
        subject.backend.create_volume("pvc-r", repeat)


def test_the_same_name_is_returned_only_where_the_requisite_topology_allows(subject: Subject) -> None:
    """Spec: an existing volume is the answer only when "accessible from accessibility_requirements";
    otherwise ALREADY_EXISTS. Preferred topology never refuses."""
    disk = subject.backend.create_volume("pvc-t", _options(subject))
    here = dict(disk.topology)
    if not here:
        pytest.skip(f"{type(subject.backend).__name__} reports no topology")
    elsewhere = dict.fromkeys(here, "nowhere")
    for accessible in (
        _options(subject, requisite=[here]),
        _options(subject, requisite=[elsewhere, here]),
        _options(subject, preferred=[elsewhere]),
    ):
        assert subject.backend.create_volume("pvc-t", accessible).id == disk.id
    with pytest.raises(AlreadyExistsError, match="pvc-t"):
        subject.backend.create_volume("pvc-t", _options(subject, requisite=[elsewhere]))


def test_the_volume_context_comes_back_unchanged_and_takes_part_in_idempotency(subject: Subject) -> None:
    context = {"fsType": "xfs", "blockSize": "4096"}
    disk = subject.backend.create_volume("pvc-c", _options(subject, context=context))
    assert dict(disk.volume_context) == context
    assert dict(subject.backend.get_volume(disk.id).volume_context) == context
    with pytest.raises(AlreadyExistsError):
        subject.backend.create_volume("pvc-c", _options(subject, context={"fsType": "ext4"}))


def test_unknown_and_malformed_volumes_are_not_found(subject: Subject) -> None:
    for volume_id in [subject.unknown_volume, *subject.malformed]:
        with pytest.raises(NotFoundError):
            subject.backend.get_volume(volume_id)
        with pytest.raises(NotFoundError):
            subject.backend.delete_volume(volume_id)
        with pytest.raises(NotFoundError):
            subject.backend.expand_volume(volume_id, 4 * subject.unit)


def test_delete_removes_the_volume_and_a_second_delete_is_not_found(subject: Subject) -> None:
    disk = subject.backend.create_volume("pvc-d", _options(subject))
    subject.backend.delete_volume(disk.id)
    with pytest.raises(NotFoundError):
        subject.backend.get_volume(disk.id)
    with pytest.raises(NotFoundError):
        subject.backend.delete_volume(disk.id)
    again = subject.backend.create_volume("pvc-d", _options(subject))
    assert again.id != disk.id, "a deleted name can be created anew"


def test_paging_returns_every_volume_once_and_refuses_a_foreign_token(subject: Subject) -> None:
    made = {subject.backend.create_volume(f"pvc-{i}", _options(subject, 1)).id for i in range(3)}
    assert {d.id for d in subject.backend.list_volumes().items} == made
    seen: list[str] = []
    token = ""
    while True:
        page = subject.backend.list_volumes(max_entries=1, starting_token=token)
        assert len(page.items) <= 1
        seen += [d.id for d in page.items]
        token = page.next_token
        if not token:
            break
    assert sorted(seen) == sorted(made)
    with pytest.raises(InvalidTokenError):
        subject.backend.list_volumes(max_entries=1, starting_token="not-a-token-we-issued")


def test_expand_grows_and_never_shrinks(subject: Subject) -> None:
    _needs(subject, "expand_online")
    disk = subject.backend.create_volume("pvc-e", _options(subject, 2))
    assert subject.backend.expand_volume(disk.id, 4 * subject.unit) >= 4 * subject.unit
    assert subject.backend.get_volume(disk.id).size_bytes >= 4 * subject.unit
    assert subject.backend.expand_volume(disk.id, 4 * subject.unit) >= 4 * subject.unit, "idempotent"
    assert subject.backend.expand_volume(disk.id, 1 * subject.unit) >= 4 * subject.unit, "never shrinks"


def test_unknown_parameters_are_refused_naming_the_key(subject: Subject) -> None:
    with pytest.raises(InvalidParameterError, match="no-such-parameter"):
        subject.backend.validate_parameters({"no-such-parameter": "1"})
    with pytest.raises(InvalidParameterError, match="no-such-parameter"):
        subject.backend.validate_mutable_parameters({"no-such-parameter": "1"})


# ---------------------------------------------------------------------------- attachment


def test_attach_is_idempotent_per_node_and_listed_on_the_volume(subject: Subject) -> None:
    _needs(subject, "attach_required")
    disk = subject.backend.create_volume("pvc-p", _options(subject))
    context = subject.backend.attach(disk.id, subject.node, readonly=False)
    assert subject.backend.attach(disk.id, subject.node, readonly=False) == context
    attached = subject.backend.get_volume(disk.id).attachments
    assert [(a.node_id, a.readonly) for a in attached] == [(subject.node, False)]
    with pytest.raises(AlreadyExistsError):
        subject.backend.attach(disk.id, subject.node, readonly=True)


def test_attach_to_an_unknown_node_or_of_an_unknown_volume_is_not_found(subject: Subject) -> None:
    _needs(subject, "attach_required")
    disk = subject.backend.create_volume("pvc-n", _options(subject))
    with pytest.raises(NotFoundError):
        subject.backend.attach(disk.id, "i-0000000000000dead", readonly=False)
    with pytest.raises(NotFoundError):
        subject.backend.attach(subject.unknown_volume, subject.node, readonly=False)


def test_a_single_node_volume_attached_elsewhere_is_refused(subject: Subject) -> None:
    _needs(subject, "attach_required")
    if not subject.other_node:
        pytest.skip(f"{type(subject.backend).__name__} serves one node")
    disk = subject.backend.create_volume("pvc-s", _options(subject))
    subject.backend.attach(disk.id, subject.node, readonly=False)
    with pytest.raises(FailedPreconditionError):
        subject.backend.attach(disk.id, subject.other_node, readonly=False)


def test_an_attached_volume_is_not_deleted_and_detach_is_idempotent(subject: Subject) -> None:
    _needs(subject, "attach_required")
    disk = subject.backend.create_volume("pvc-x", _options(subject))
    subject.backend.attach(disk.id, subject.node, readonly=False)
    with pytest.raises(FailedPreconditionError):
        subject.backend.delete_volume(disk.id)
    subject.backend.detach(disk.id, subject.node)
    subject.backend.detach(disk.id, subject.node)
    assert not subject.backend.get_volume(disk.id).attachments
    subject.backend.delete_volume(disk.id)
    with pytest.raises(NotFoundError):
        subject.backend.detach(disk.id, subject.node)


# ---------------------------------------------------------------------------- snapshots


def test_snapshots_are_idempotent_by_name_and_source(subject: Subject) -> None:
    _needs(subject, "snapshots")
    disk = subject.backend.create_volume("pvc-s1", _options(subject))
    other = subject.backend.create_volume("pvc-s2", _options(subject))
    snap = subject.backend.create_snapshot("snap-a", disk.id, {})
    assert subject.backend.create_snapshot("snap-a", disk.id, {}).id == snap.id
    assert (snap.source_volume_id, snap.size_bytes) == (disk.id, disk.size_bytes)
    with pytest.raises(AlreadyExistsError):
        subject.backend.create_snapshot("snap-a", other.id, {})
    with pytest.raises(NotFoundError):
        subject.backend.create_snapshot("snap-b", subject.unknown_volume, {})


def test_snapshots_are_found_listed_and_deleted(subject: Subject) -> None:
    _needs(subject, "snapshots")
    disk = subject.backend.create_volume("pvc-l", _options(subject))
    snap = subject.backend.create_snapshot("snap-l", disk.id, {})
    assert subject.backend.get_snapshot(snap.id).id == snap.id
    assert [s.id for s in subject.backend.list_snapshots(snapshot_id=snap.id).items] == [snap.id]
    assert [s.id for s in subject.backend.list_snapshots(source_volume_id=disk.id).items] == [snap.id]
    assert not subject.backend.list_snapshots(snapshot_id=subject.unknown_snapshot).items
    assert not subject.backend.list_snapshots(source_volume_id=subject.unknown_volume).items
    with pytest.raises(NotFoundError):
        subject.backend.get_snapshot(subject.unknown_snapshot)
    subject.backend.delete_snapshot(snap.id)
    with pytest.raises(NotFoundError):
        subject.backend.get_snapshot(snap.id)
    with pytest.raises(NotFoundError):
        subject.backend.delete_snapshot(snap.id)


def test_volumes_restore_from_a_snapshot_and_clone_from_a_volume(subject: Subject) -> None:
    _needs(subject, "snapshots")
    disk = subject.backend.create_volume("pvc-src", _options(subject))
    snap = subject.backend.create_snapshot("snap-src", disk.id, {})
    restored = subject.backend.create_volume(
        "pvc-restored", _options(subject, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
    )
    assert restored.source == ContentSource(SourceKind.SNAPSHOT, snap.id)
    with pytest.raises(NotFoundError):
        subject.backend.create_volume(
            "pvc-lost", _options(subject, source=ContentSource(SourceKind.SNAPSHOT, subject.unknown_snapshot))
        )
    if subject.backend.capabilities.clone:
        clone = subject.backend.create_volume(
            "pvc-clone", _options(subject, source=ContentSource(SourceKind.VOLUME, disk.id))
        )
        assert clone.source == ContentSource(SourceKind.VOLUME, disk.id)
        assert subject.backend.get_volume(clone.id).size_bytes == disk.size_bytes


# ---------------------------------------------------------------------------- node side


def test_the_node_identity_names_an_attachable_node(subject: Subject) -> None:
    ident = subject.backend.node_identity()
    assert ident.node_id == subject.node
    assert ident.max_volumes >= 0
    assert set(ident.topology) <= set(subject.backend.capabilities.topology_keys)
