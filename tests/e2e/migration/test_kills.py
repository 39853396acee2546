"""Kill the controller at each named step of a conversion and of a rollback, then restart it.

Each step gets its own PV (selected by label) and its own controller, armed with the failpoint
`migrate.<direction>.<step>` (shim/failpoints.py: SIGKILL right after the step's work, before the
journal records it, which is the hardest place to resume from). All seven run at once. Then:
- the kill landed where it was aimed: the process died of SIGKILL, the failpoint record names the step
  and that process, and the cluster shows exactly that step's work done (the table below);
- after a restart (same pod name, so the same identity takes its lock back at once) the PV ends
  converted (or back in-tree), its claim Bound to it, the volume handle names the same disk, there is
  one PV for the claim and no lock left.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shim import Translator
from shim.migrate.journal import Journal
from shim.migrate.lock import ANN_JOURNAL, lease_name
from shim.migrate.objects import ANN_JOURNAL_ID, record_of
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, KubeError, leases, namespaces, pvcs, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    MOVE_TIMEOUT,
    NO_GATES,
    MigrationRelease,
    back_in_tree,
    bound_pair,
    cleanup,
    converted_and_bound,
    events_about,
    migration_release,
    unique,
    wait_all_bound,
)
from tests.e2e.process import wait_for
from tests.shim.migrate.samples import Obj, sample_pv

pytestmark = pytest.mark.slow
STEPS = ("record", "retain", "delete", "release", "create", "bound", "restore")
EBS = "awsElasticBlockStore"
Check = Callable[[Obj | None, Obj], None]  # (the PV or None, the claim) after the kill


def in_tree(policy: str) -> Check:
    def check(pv: Obj | None, claim: Obj) -> None:
        assert pv is not None and EBS in pv["spec"] and "csi" not in pv["spec"]
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == policy
        assert "deletionTimestamp" not in pv["metadata"]

    return check


def csi(policy: str, journal_mark: bool, claim_bound: bool) -> Check:
    def check(pv: Obj | None, claim: Obj) -> None:
        assert pv is not None and "csi" in pv["spec"] and EBS not in pv["spec"]
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == policy
        assert (ANN_JOURNAL_ID in pv["metadata"].get("annotations", {})) is journal_mark
        if claim_bound:
            assert (
                claim["status"]["phase"] == "Bound" and claim["spec"]["volumeName"] == pv["metadata"]["name"]
            )

    return check


def deleting(pv: Obj | None, claim: Obj) -> None:
    assert pv is not None and EBS in pv["spec"] and pv["metadata"].get("deletionTimestamp")
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain", (
        "never deleted while it could take the disk"
    )
    assert "kubernetes.io/pv-protection" in pv["metadata"]["finalizers"]


def absent(pv: Obj | None, claim: Obj) -> None:
    assert pv is None
    assert claim["status"]["phase"] in ("Lost", "Bound"), "the binder has not seen the PV go yet, or has"


def swap(check: Check) -> Check:
    """The same check with in-tree and CSI exchanged (for a rollback)."""

    def swapped(pv: Obj | None, claim: Obj) -> None:
        if pv is not None:
            pv = {**pv, "spec": dict(pv["spec"])}
            if "csi" in pv["spec"]:
                pv["spec"][EBS] = pv["spec"].pop("csi")
            elif EBS in pv["spec"]:
                pv["spec"]["csi"] = pv["spec"].pop(EBS)
        check(pv, claim)

    return swapped


# step -> (the journal's next step after the kill, what the cluster shows), for a conversion.
LANDED: dict[str, tuple[str, Check]] = {
    "record": ("retain", in_tree("Delete")),
    "retain": ("retain", in_tree("Retain")),
    "delete": ("delete", deleting),
    "release": ("release", absent),
    "create": ("create", csi("Retain", journal_mark=True, claim_bound=False)),
    "bound": ("bound", csi("Retain", journal_mark=True, claim_bound=True)),
    "restore": ("restore", csi("Delete", journal_mark=False, claim_bound=True)),
}


@dataclass
class Kill:
    step: str
    pv: str
    claim: str
    record_file: Path
    pid: int = 0
    returncode: int | None = None
    recorded: str = ""
    lease: Obj | None = None
    pv_after: Obj | None = None
    claim_after: Obj = field(default_factory=dict)
    final_pv: Obj = field(default_factory=dict)  # after the restart finished
    final_claim: Obj = field(default_factory=dict)
    pvs_of_claim: list[str] = field(default_factory=list)
    converted_events: int = 0


@dataclass
class Round:
    kube: Kube
    namespace: str
    direction: str
    originals: dict[str, Obj]
    kills: dict[str, Kill]


def _get(kube: Kube, path: str) -> Obj | None:
    try:
        return kube.get(path)
    except KubeError as err:
        if err.status == 404:
            return None
        raise


def _kill_round(
    release: MigrationRelease, tmp: Path, run: str, direction: str, gates: str
) -> dict[str, Kill]:
    kube, namespace = release.kube, release.namespace
    kills = {s: Kill(s, f"{run}-{s}", f"c-{s}", tmp / f"{direction}-{s}.record") for s in STEPS}
    started = {}
    for kill in kills.values():
        env = {
            "BALLAST_FAILPOINTS": f"migrate.{direction}.{kill.step}",
            "BALLAST_FAILPOINTS_RECORD": str(kill.record_file),
        }
        args = (f"--feature-gates={gates}", f"--selector=e2e-run={run}-{kill.step}", "--leader-elect=false")
        started[kill.step] = release.start(f"{direction}-{kill.step}", *args, env=env)
    for step, controller in started.items():
        kill = kills[step]
        wait_for(lambda: not controller.process.alive(), MOVE_TIMEOUT, f"the kill at {direction}.{step}")  # noqa: B023
        kill.pid, kill.returncode = controller.process.pid, controller.process.proc.returncode
        kill.recorded = kill.record_file.read_text() if kill.record_file.exists() else ""
        kill.lease = _get(kube, leases(namespace, lease_name(kill.pv)))
        kill.pv_after = _get(kube, pvs(kill.pv))
        kill.claim_after = kube.get(pvcs(namespace, kill.claim))
    release.stop_all()
    for kill in kills.values():  # the same pods come back (same identity), without failpoints
        release.start(
            f"{direction}-{kill.step}",
            f"--feature-gates={gates}",
            f"--selector=e2e-run={run}-{kill.step}",
            "--leader-elect=false",
        )
    return kills


def _final(kube: Kube, namespace: str, kill: Kill) -> None:
    """The end state once the restarted controller finished."""
    kill.final_pv = kube.get(pvs(kill.pv))
    kill.final_claim = kube.get(pvcs(namespace, kill.claim))
    kill.pvs_of_claim = [
        p["metadata"]["name"]
        for p in kube.items(pvs())
        if p["spec"].get("claimRef", {}).get("name") == kill.claim
        and p["spec"]["claimRef"].get("namespace") == namespace
    ]
    kill.converted_events = len(events_about(kube, "default", kill.pv, "Converted"))


@pytest.fixture(scope="module")
def rounds(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Round]]:
    """Both kill rounds: conversions killed at each step and resumed, then rollbacks likewise."""
    kube, namespace = cluster.admin(), unique("kills")
    kube.create(namespaces(), {"metadata": {"name": namespace}})
    release = migration_release(cluster, namespace)
    tmp, run = tmp_path_factory.mktemp("kills"), unique("k")
    try:
        for step in STEPS:
            pv = sample_pv("aws-ebs", name=f"{run}-{step}")
            pv["metadata"]["labels"]["e2e-run"] = f"{run}-{step}"
            bound_pair(kube, namespace, pv, claim=f"c-{step}")
        wait_all_bound(kube, namespace, [f"c-{s}" for s in STEPS])
        originals = {s: kube.get(pvs(f"{run}-{s}")) for s in STEPS}
        found = {
            "convert": Round(
                kube, namespace, "convert", originals, _kill_round(release, tmp, run, "convert", ALL_GATES)
            )
        }
        for kill in found["convert"].kills.values():
            kube.wait(
                pvs(kill.pv),
                converted_and_bound(kube, namespace, kill.claim),
                MOVE_TIMEOUT,
                f"{kill.pv} resumed",
            )
            _final(kube, namespace, kill)
        release.stop_all()
        found["rollback"] = Round(
            kube, namespace, "rollback", originals, _kill_round(release, tmp, run, "rollback", NO_GATES)
        )
        for kill in found["rollback"].kills.values():
            wait = back_in_tree(kube, namespace, kill.claim, EBS)
            kube.wait(pvs(kill.pv), wait, MOVE_TIMEOUT, f"{kill.pv} rollback resumed")
            _final(kube, namespace, kill)
        yield found
    finally:
        cleanup(release)
        kube.delete(namespaces(namespace))


@pytest.mark.parametrize("direction", ["convert", "rollback"])
@pytest.mark.parametrize("step", STEPS)
def test_the_kill_landed_at_the_named_step(rounds: dict[str, Round], direction: str, step: str) -> None:
    kill = rounds[direction].kills[step]
    assert kill.returncode == -signal.SIGKILL, f"the controller was not killed (exit {kill.returncode})"
    assert kill.recorded.split() == [f"migrate.{direction}.{step}", str(kill.pid)], kill.recorded
    next_step, check = LANDED[step]
    assert kill.lease is not None, "the lock (with its journal) must survive the kill"
    journal = Journal.from_json(kill.lease["metadata"]["annotations"][ANN_JOURNAL])
    assert (journal.direction, journal.step) == (direction, next_step)
    assert kill.lease["spec"]["holderIdentity"].startswith(f"{direction}-{step}_")
    (check if direction == "convert" else swap(check))(kill.pv_after, kill.claim_after)


@pytest.mark.parametrize("direction", ["convert", "rollback"])
@pytest.mark.parametrize("step", STEPS)
def test_a_restart_finishes_with_one_pv_on_the_same_disk(
    rounds: dict[str, Round], direction: str, step: str
) -> None:
    done = rounds[direction]
    kill = done.kills[step]
    original = done.originals[step]
    pv, claim = kill.final_pv, kill.final_claim
    assert (
        claim["metadata"]["uid"] == original["spec"]["claimRef"]["uid"]
        and claim["status"]["phase"] == "Bound"
    )
    assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert kill.pvs_of_claim == [kill.pv], "nothing duplicated"
    handle = Translator().translate_in_tree_pv_to_csi(record_of(original))["spec"]["csi"]["volumeHandle"]
    if direction == "convert":
        assert pv["spec"]["csi"]["volumeHandle"] == handle == "vol-0a1b2c3d4e5f60718"
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert kill.converted_events == 1
    else:
        assert record_of(pv) == record_of(original), "exactly the original again"
