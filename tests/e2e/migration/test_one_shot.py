"""`ballast-migrate apply | rollback | status` against the real API server, as the chart's
ServiceAccount: dry run, selection, exit codes (RBAC refusals and a lock in a missing namespace
included), and finishing what a killed controller left.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, leases, pods, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    MIGRATE,
    MOVE_TIMEOUT,
    MigrationRelease,
    back_in_tree,
    converted_and_bound,
    events_about,
    plugin_pvs,
    unique,
)
from tests.e2e.process import Process, wait_for
from tests.shim.migrate.samples import sample_pv

pytestmark = pytest.mark.slow


def finished(process: Process, timeout: float = MOVE_TIMEOUT * 2) -> tuple[int, str]:
    wait_for(lambda: not process.alive(), timeout, f"{process.name} to finish", diagnose=process.tail)
    code = process.proc.returncode
    assert isinstance(code, int)
    return code, process.log.read_text()


def json_output(log: str) -> Any:
    """The JSON document the command printed (the log also holds its stderr lines)."""
    start = log.index("{\n")
    return json.loads(log[start : log.rindex("}") + 1])


def test_dry_run_plans_and_changes_nothing(release: MigrationRelease, kube: Kube, namespace: str) -> None:
    run = unique("dry")
    names = plugin_pvs(kube, namespace, run, ["aws-ebs", "gce-pd"])
    before = {n: kube.get(pvs(n)) for n in names.values()}
    code, log = finished(release.one_shot("apply", f"--selector=e2e-run={run}", "--dry-run", "-o", "json"))
    assert code == 0, log
    volumes = {v["pv"]: v for v in json_output(log)["volumes"]}
    assert {v["result"] for v in volumes.values()} == {"planned"}
    assert volumes[names["gce-pd"]]["target"]["spec"]["csi"]["driver"] == "pd.csi.storage.gke.io"
    for name, pv in before.items():
        assert kube.get(pvs(name))["spec"] == pv["spec"]
        assert not kube.exists(leases(namespace, f"ballast-migrate-pv-{name}"))


def test_apply_selects_by_plugin_blocks_on_use_and_rollback_undoes(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("sel")
    names = plugin_pvs(kube, namespace, run, ["aws-ebs", "gce-pd", "cinder"])
    kube.create(
        pods(namespace),
        {
            "metadata": {"name": "app"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "cinder"}}],
            },
        },
    )
    selected = ("--plugin=gce-pd", "--plugin=cinder", "-o", "json")
    code, log = finished(release.one_shot("apply", f"--selector=e2e-run={run}", *selected))
    assert code == 1, "the cinder PV is in use: blocked"
    results = {v["pv"]: v for v in json_output(log)["volumes"]}
    assert set(results) == {names["gce-pd"], names["cinder"]}, "only the selected plugins"
    assert results[names["cinder"]]["result"] == "waiting"
    assert f"Pod {namespace}/app (Pending)" in results[names["cinder"]]["message"]
    assert results[names["gce-pd"]]["result"] == "done"
    kube.wait(pvs(names["gce-pd"]), converted_and_bound(kube, namespace, "gce-pd"), 30, "gce-pd converted")
    assert "awsElasticBlockStore" in kube.get(pvs(names["aws-ebs"]))["spec"], "not selected: untouched"
    code, log = finished(release.one_shot("rollback", f"--pv={names['gce-pd']}", f"--pv={names['aws-ebs']}"))
    assert code == 0, log
    assert "rolled back to its in-tree original" in log and "already in-tree" in log
    kube.wait(pvs(names["gce-pd"]), back_in_tree(kube, namespace, "gce-pd", "gcePersistentDisk"), 30, "back")
    code, log = finished(release.one_shot("apply", "--pv=no-such-pv"))
    assert code == 2 and "--pv: no such PersistentVolume: no-such-pv" in log


def test_status_shows_a_killed_journal_and_apply_finishes_it(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("status")
    names = plugin_pvs(kube, namespace, run, ["aws-ebs", "portworx"])
    kube.patch(pvs(names["aws-ebs"]), {"metadata": {"labels": {"kill-me": "yes"}}})
    killed = release.start(
        "ctrl",
        f"--feature-gates={ALL_GATES}",
        "--leader-elect=false",
        "--lock-duration=3s",
        f"--selector=e2e-run={run},kill-me=yes",
        env={"BALLAST_FAILPOINTS": "migrate.convert.create"},
    )
    wait_for(lambda: not killed.process.alive(), MOVE_TIMEOUT, "the kill at create")
    code, log = finished(release.one_shot("status", f"--selector=e2e-run={run}", "-o", "json"))
    assert code == 0, log
    rows = {r["pv"]: r for r in json_output(log)["volumes"]}
    assert rows[names["aws-ebs"]]["state"] == "converting"
    assert "next step create; held by ctrl_" in rows[names["aws-ebs"]]["detail"]
    assert rows[names["portworx"]]["state"] == "in-tree" and rows[names["portworx"]]["detail"] == "not in use"
    code, log = finished(release.one_shot("apply", f"--pv={names['aws-ebs']}", "-o", "json"))
    assert code == 0, log
    (volume,) = json_output(log)["volumes"]
    assert volume["result"] == "done", "waited for the dead holder's lock, then finished its journal"
    kube.wait(pvs(names["aws-ebs"]), converted_and_bound(kube, namespace, "aws-ebs"), 30, "converted")


def test_controller_dry_run_changes_nothing_and_logs_json(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("ctrl-dry")
    names = plugin_pvs(kube, namespace, run, ["aws-ebs", "azure-disk"])
    before = {n: kube.get(pvs(n))["spec"] for n in names.values()}
    controller = release.start(
        "dry", f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--dry-run", "--log-format=json"
    )

    def planned() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in controller.process.log.read_text().splitlines() if line.strip()]
        return [line for line in lines if line["msg"].startswith("dry run: PV") and "planned" in line["msg"]]

    wait_for(lambda: len(planned()) == 2, 60, "both PVs planned", diagnose=controller.process.tail)
    assert {line["level"] for line in planned()} == {"info"}
    assert {n: kube.get(pvs(n))["spec"] for n in names.values()} == before
    assert kube.items(leases(namespace)) == [], "a dry run takes no lock and elects no leader"
    assert events_about(kube, "default", names["aws-ebs"]) == []


def test_api_errors_are_one_line_and_a_lock_that_cannot_be_taken_fails_its_pv(
    release: MigrationRelease, cluster: Cluster, kube: Kube, namespace: str
) -> None:
    for command in ("status", "apply"):  # the chart's Role grants Leases in the release's namespace only
        code, log = finished(release.one_shot(command, "--namespace=default"))
        assert code == 2, log
        assert log.startswith(
            "ballast-migrate: listing the lock Leases in namespace default: 403 Forbidden: "
            'leases.coordination.k8s.io is forbidden: User "system:serviceaccount:'
        )
        assert log.count("\n") == 1, "one line, no traceback"
    name = unique("no-ns")
    kube.create(pvs(), {"apiVersion": "v1", "kind": "PersistentVolume", **sample_pv("aws-ebs", name=name)})
    argv = [
        str(MIGRATE),
        "apply",
        f"--kubeconfig={cluster.admin_kubeconfig}",
        "--namespace=no-such-namespace",
    ]
    admin = cluster.processes.start(f"{name}-apply", [*argv, f"--pv={name}", "--timeout=1s", "-o", "json"])
    code, log = finished(admin)
    assert code == 1, log
    (volume,) = json_output(log)["volumes"]
    assert volume["result"] == "failed"
    assert (
        volume["message"]
        == 'taking its lock: API error: 404 NotFound: namespaces "no-such-namespace" not found'
    )
    assert "Traceback" not in log
    assert "awsElasticBlockStore" in kube.get(pvs(name))["spec"]


@pytest.mark.parametrize("command", ["status", "apply", "controller"])
def test_a_selector_the_api_server_cannot_parse_is_bad_input(release: MigrationRelease, command: str) -> None:
    """Exit 2 and one line naming --selector: not a controller that stays healthy while every list of
    its PV cache is refused, nor exit 1 as if a PV were blocked."""
    if command == "controller":
        process = release.start(
            "bad-selector", "--selector=migrate in (wave-1", "--leader-elect=false"
        ).process
    else:
        process = release.one_shot(command, "--selector=a=b=c")
    code, log = finished(process, timeout=60)
    assert code == 2, log
    assert log.startswith("ballast-migrate: --selector: "), log
    assert "is not a valid label selector" in log and log.count("\n") == 1, log
