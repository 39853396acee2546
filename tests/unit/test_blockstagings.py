"""Block stagings recorded on disk: what a restarted node plugin reads back, and NodeUnstage clears."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csi import paths
from csi.blockstagings import RECORD_DIR, BlockStagings


@pytest.fixture
def roots(tmp_path: Path) -> tuple[str, ...]:
    kubelet, other = tmp_path / "kubelet", tmp_path / "other"
    kubelet.mkdir()
    other.mkdir()
    (tmp_path / "link").symlink_to(kubelet)
    return paths.with_resolved((str(tmp_path / "link"), str(other)))


@pytest.mark.parametrize(
    "volume_id",
    [
        pytest.param("vol-1", id="plain"),
        pytest.param("v" * 128 + " /\\:é", id="long-with-odd-characters"),
    ],
)
def test_a_record_outlives_the_process_until_forgotten(roots: tuple[str, ...], volume_id: str) -> None:
    staging = os.path.join(roots[1], "s", "globalmount")
    BlockStagings(roots).record(volume_id, staging)
    restarted = BlockStagings(roots)
    assert restarted.staged_at(volume_id) == staging
    assert restarted.staged_at(volume_id + "x") is None
    assert restarted.count() == 1, "a root and its resolved form hold one record directory"
    assert os.listdir(os.path.join(roots[1], RECORD_DIR)) != [], "kept under the staging path's root"
    restarted.forget(volume_id)
    restarted.forget(volume_id)  # idempotent
    assert restarted.staged_at(volume_id) is None and restarted.count() == 0


def test_recording_again_replaces_the_staging_path(roots: tuple[str, ...]) -> None:
    """Staging paths come resolved (NodeService), so under the resolved form of a linked root."""
    stagings = BlockStagings(roots)
    stagings.record("v", os.path.join(roots[-1], "a"))
    stagings.record("v", os.path.join(roots[-1], "b"))
    assert stagings.staged_at("v") == os.path.join(roots[-1], "b")
    assert stagings.count() == 1
