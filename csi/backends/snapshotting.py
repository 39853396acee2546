"""The snapshot operations of the Backend interface, for a backend that keeps them in a snapshot store.

A backend mixes in SnapshotDelegation (before Backend) and sets `_snapshots`; the store's contracts are
the Backend methods' (idempotent create by name, delete of an unknown id is OK, get of one is NotFound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from csi.backends.base import EMPTY, Page, Snapshot


class SnapshotStore(Protocol):
    def create(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]],
        metadata: Mapping[str, str],
    ) -> Snapshot: ...

    def delete(self, snapshot_id: str) -> None: ...

    def get(self, snapshot_id: str) -> Snapshot: ...

    def page(
        self, snapshot_id: str, source_volume_id: str, max_entries: int, starting_token: str
    ) -> Page[Snapshot]: ...


class SnapshotDelegation:
    """create/delete/get/list_snapshots answered by `self._snapshots`."""

    _snapshots: SnapshotStore

    def create_snapshot(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]] = (),
        metadata: Mapping[str, str] = EMPTY,
    ) -> Snapshot:
        return self._snapshots.create(name, source_volume_id, parameters, requisite, metadata)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._snapshots.delete(snapshot_id)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return self._snapshots.get(snapshot_id)

    def list_snapshots(
        self,
        *,
        snapshot_id: str = "",
        source_volume_id: str = "",
        max_entries: int = 0,
        starting_token: str = "",
    ) -> Page[Snapshot]:
        return self._snapshots.page(snapshot_id, source_volume_id, max_entries, starting_token)
