"""The read-only reporting operations of the local backend (csi.backends.reporting), delegated to the
health checks (health.py) and changed-block tracking (cbt.py) of its data dir."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from csi import extents
from csi.backends.local.cbt import LocalBlocks
from csi.backends.local.health import LocalHealth
from csi.backends.paging import Page
from csi.backends.reporting import BlockMap
from csi.health import Issue, StorageIssue, VolumeHealth


class LocalReporting:
    health: LocalHealth
    blocks: LocalBlocks

    def volume_health(self, volume_id: str) -> tuple[Issue, ...]:
        return self.health.volume(volume_id)

    def list_volume_health(self, max_entries: int = 0, starting_token: str = "") -> Page[VolumeHealth]:
        return self.health.listing(max_entries, starting_token)

    def storage_health(self) -> list[StorageIssue]:
        """The data dir's filesystem: a node-only process shares the data dir, so it sees the same."""
        return self.health.storage()

    def snapshot_allocated(
        self, snapshot_id: str, start: int, block: int, secrets: Mapping[str, str]
    ) -> BlockMap:
        """The local backend needs no secrets; they are not kept."""
        return self.blocks.allocated(snapshot_id, start, block)

    def snapshot_delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        secrets: Mapping[str, str],
        wanted: Callable[[], bool] = extents.always,
    ) -> BlockMap:
        return self.blocks.delta(base_id, target_id, start, block, wanted)
