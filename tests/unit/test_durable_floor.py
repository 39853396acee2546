"""benchmarks/durable_floor.py: the system calls of a durable create, timed phase by phase, leave nothing
behind, and the filesystem they ran on is named."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import durable_floor


def test_each_phase_is_timed_and_the_round_leaves_no_volume(tmp_path: Path) -> None:
    first = durable_floor.measure(tmp_path, 20)
    second = durable_floor.measure(tmp_path, 20)  # rounds share the directory and the database
    for figures in (first, second):
        assert set(figures) == {*durable_floor.PHASES, "total"}
        assert all(figures[p] > 0 for p in durable_floor.PHASES), figures
        assert abs(sum(figures[p] for p in durable_floor.PHASES) - figures["total"]) < 0.001
    assert os.listdir(tmp_path / "volumes") == []


def test_the_filesystem_is_the_one_mounted_over_the_path(tmp_path: Path) -> None:
    facts = durable_floor.filesystem_facts(tmp_path)
    st = os.statvfs(tmp_path)
    assert facts["mount"] and str(tmp_path).startswith(str(facts["mount"]))
    assert os.statvfs(str(facts["mount"])).f_fsid == st.f_fsid
    if facts["type"] == "ext4":
        assert isinstance(facts.get("journal"), bool)
