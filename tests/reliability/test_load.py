"""Load: several clients run whole volume lives at once against the real driver (local backend, real
loop devices, mkfs and mounts), node and controller lives in turn, every request sent twice
concurrently. Only true duplicates may be refused (ABORTED); afterwards nothing is left.

Memory is a target, so it is measured by a benchmark, not asserted here: the long form,
benchmarks/soak.py, records RSS and descriptor counts in benchmarks/results/soak.json.
"""

from __future__ import annotations

import pytest

from benchmarks.soak import CONTROLLER_LIFE_OPERATIONS, NODE_LIFE_OPERATIONS, leftovers, run_workload
from tests.conformance.driver import NODE_ID
from tests.reliability.conftest import Proc, assert_consistent, loops_over

pytestmark = [pytest.mark.root, pytest.mark.slow]

WORKERS = 4
LIVES = 150  # per worker: 600 lives, half of each kind, every operation sent twice at once


def test_concurrent_lifecycles_hold_without_errors_or_leaks(proc: Proc) -> None:
    driver = proc.start()
    tally = run_workload(driver.endpoint, proc.workdir, NODE_ID, workers=WORKERS, lives=LIVES, prefix="load")

    assert tally.errors == [], tally.errors[:10]
    kinds = [(w + n) % 2 for w in range(WORKERS) for n in range(LIVES)]
    expected = kinds.count(0) * NODE_LIFE_OPERATIONS + kinds.count(1) * CONTROLLER_LIFE_OPERATIONS
    assert tally.operations == expected
    assert tally.aborted > 0, "the duplicates never overlapped: the workload did not test concurrency"
    assert leftovers(driver.endpoint, proc.data_dir) == {"volumes": 0, "snapshots": 0, "files": []}
    st = assert_consistent(proc.data_dir)
    assert st.volume_rows == {} and st.snapshot_rows == {}
    assert loops_over(proc.data_dir) == []
