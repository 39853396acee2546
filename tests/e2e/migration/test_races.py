"""Several actors on one batch of PVs: each PV is converted exactly once.

- Two controllers of different versions, leader election off (an upgrade half-way), over 50 PVs.
- A one-shot `ballast-migrate apply` running at the same time as the controller.
- Leader failover: two replicas with leader election; the leader is killed mid-batch (deterministically:
  at its fifth `create` step, so one of its PVs is half-converted), and the other replica finishes.

"Exactly once" is witnessed by a watch on the PVs: each PV name is DELETED once and ADDED once.
"""

from __future__ import annotations

import pytest

from shim.migrate.objects import ANN_CONVERTED_BY
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, leases, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    MOVE_TIMEOUT,
    MigrationRelease,
    converted_and_bound,
    ebs_batch,
    unique,
)
from tests.e2e.migration.watcher import PVWatch
from tests.e2e.process import wait_for

pytestmark = pytest.mark.slow


def wait_converted(kube: Kube, namespace: str, names: list[str]) -> dict[str, str]:
    """Wait until every PV is converted and settled; PV -> the identity that converted it."""
    by = {}
    for name in names:
        pv = kube.wait(
            pvs(name), converted_and_bound(kube, namespace, name), MOVE_TIMEOUT * 2, f"{name} converted"
        )
        by[name] = pv["metadata"]["annotations"][ANN_CONVERTED_BY]
    return by


def assert_exactly_once(watch: PVWatch, names: list[str], created_while_watching: bool = False) -> None:
    assert watch.errors == []
    assert {n: watch.deleted[n] for n in names} == dict.fromkeys(names, 1), "each PV deleted exactly once"
    added = 2 if created_while_watching else 1
    assert {n: watch.added[n] for n in names} == dict.fromkeys(names, added), (
        "each PV re-created exactly once"
    )


def test_two_controller_versions_without_leader_election_convert_each_pv_once(
    release: MigrationRelease, kube: Kube, namespace: str, cluster: Cluster
) -> None:
    run = unique("race")
    common = (f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false")
    with PVWatch(cluster, f"e2e-run={run}") as watch:
        old = release.start("old", *common, "--holder-identity=ctrl-old_0.1.0")
        new = release.start("new", *common, "--holder-identity=ctrl-new_0.2.0")
        names = ebs_batch(kube, namespace, run, 50)  # created while both watch: they race for every PV
        by = wait_converted(kube, namespace, names)
    assert_exactly_once(watch, names, created_while_watching=True)
    assert set(by.values()) <= {"ctrl-old_0.1.0", "ctrl-new_0.2.0"}
    busy = old.metric("ballast_migrate_operations_total", result="busy") + new.metric(
        "ballast_migrate_operations_total", result="busy"
    )
    assert busy > 0, "the two controllers never met on a PV: the race did not happen"
    done = old.metric("ballast_migrate_operations_total", result="done") + new.metric(
        "ballast_migrate_operations_total", result="done"
    )
    assert done == 50


def test_one_shot_apply_racing_the_controller_converts_each_pv_once(
    release: MigrationRelease, kube: Kube, namespace: str, cluster: Cluster
) -> None:
    run = unique("apply")
    names = ebs_batch(kube, namespace, run, 50)
    with PVWatch(cluster, f"e2e-run={run}") as watch:
        release.start(
            "ctrl", f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false"
        )
        apply = release.one_shot("apply", f"--selector=e2e-run={run}", "--plugin=aws-ebs", "-o", "json")
        wait_for(lambda: not apply.alive(), MOVE_TIMEOUT * 3, "apply to finish", diagnose=apply.tail)
        by = wait_converted(kube, namespace, names)
    assert apply.proc.returncode == 0, apply.tail()
    assert_exactly_once(watch, names)
    controller = f"ctrl_{release.controllers[0].identity.split('_', 1)[1]}"
    assert set(by.values()) - {controller} <= {v for v in by.values() if v.startswith("apply-")}


def test_the_other_replica_finishes_the_batch_when_the_leader_dies(
    release: MigrationRelease, kube: Kube, namespace: str, cluster: Cluster
) -> None:
    run = unique("failover")
    names = ebs_batch(kube, namespace, run, 20)
    timings = (
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
        "--lock-duration=4s",
        f"--feature-gates={ALL_GATES}",
        f"--selector=e2e-run={run}",
    )
    record = cluster.root / f"{run}.failpoint"
    with PVWatch(cluster, f"e2e-run={run}") as watch:
        leader = release.start(
            "replica-a",
            *timings,
            env={"BALLAST_FAILPOINTS": "migrate.convert.create@5", "BALLAST_FAILPOINTS_RECORD": str(record)},
        )
        election = leases(namespace, "ballast-migrate-controller")
        kube.wait(
            election, lambda lease: lease["spec"].get("holderIdentity") == leader.identity, 30, "a leader"
        )
        standby = release.start("replica-b", *timings)
        wait_for(lambda: not leader.process.alive(), MOVE_TIMEOUT, "the leader to die mid-batch")
        assert record.read_text().split()[0] == "migrate.convert.create", "killed at its fifth create step"
        still_in_tree = [n for n in names if kube.exists(pvs(n)) and "csi" not in kube.get(pvs(n))["spec"]]
        assert 0 < len(still_in_tree) < len(names), "the leader died mid-batch"
        kube.wait(
            election, lambda lease: lease["spec"].get("holderIdentity") == standby.identity, 30, "failover"
        )
        by = wait_converted(kube, namespace, names)
    assert_exactly_once(watch, names)
    assert standby.identity in by.values(), "the standby finished the batch"
    assert standby.metric("ballast_migrate_leader") == 1
