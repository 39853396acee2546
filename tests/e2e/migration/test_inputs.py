"""Bad input never crash-loops the controller: each case gets an Event, a skip and a metric, and the
object is left alone. Plus: a CSI PV without a record is never touched, a converted PV whose disk
changed is refused on rollback, and an API conflict (409) is retried on fresh state.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from shim.migrate import kube as migrate_kube
from shim.migrate.events import EventRecorder
from shim.migrate.metrics import Metrics
from shim.migrate.objects import ANN_CONVERTED_BY, ANN_ORIGINAL
from shim.migrate.steps import Context, LiveDrivers, patch_fresh
from shim.migrate.usage import LiveClaims, live_usage
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, pvcs, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    MOVE_TIMEOUT,
    NO_GATES,
    Controller,
    MigrationRelease,
    bound_pair,
    converted_and_bound,
    events_about,
    unique,
    wait_all_bound,
)
from tests.e2e.process import wait_for
from tests.shim.migrate.samples import Obj, sample_pv

pytestmark = pytest.mark.slow


def healthy(controller: Controller) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{controller.metrics_port}/healthz", timeout=5) as resp:
        return bool(resp.status == 200)


def untouched(now: Obj, before: Obj) -> bool:
    """The same object with the same spec, labels and annotations (the binder may update status)."""
    keys = ("uid", "labels", "annotations")
    same_meta = all(now["metadata"].get(k) == before["metadata"].get(k) for k in keys)
    return same_meta and now["spec"] == before["spec"]


def labelled(plugin: str, name: str, run: str) -> Obj:
    pv = sample_pv(plugin, name=name)
    pv["metadata"].setdefault("labels", {})["e2e-run"] = run
    return pv


def csi_pv(name: str, run: str, record: str | None) -> Obj:
    """A native CSI PV (as a CSI driver provisions it), optionally carrying a record annotation."""
    annotations = {ANN_ORIGINAL: record, ANN_CONVERTED_BY: "someone_0.0.1"} if record is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"e2e-run": run}, "annotations": annotations},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123456789abcdef0"},
        },
    }


def test_malformed_source_is_skipped_with_an_event_and_a_metric(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("bad")
    pv = labelled("aws-ebs", f"{run}-ebs", run)
    pv["spec"]["awsElasticBlockStore"]["volumeID"] = "aws://us-east-1a/not-a-volume"
    bound_pair(kube, namespace, pv, claim="data")
    wait_all_bound(kube, namespace, ["data"])
    before = kube.get(pvs(pv["metadata"]["name"]))
    controller = release.start(
        "ctrl",
        f"--feature-gates={ALL_GATES}",
        f"--selector=e2e-run={run}",
        "--leader-elect=false",
        "--resync-period=1s",
    )
    wait_for(
        lambda: controller.metric("ballast_migrate_skips_total", reason="translation-failed") >= 3,
        60,
        "three resyncs skipping the PV",
        diagnose=controller.process.tail,
    )
    (event,) = events_about(kube, "default", pv["metadata"]["name"], "MigrationSkipped")
    assert event["type"] == "Warning" and "Invalid format for AWS volume" in event["message"]
    after = kube.get(pvs(pv["metadata"]["name"]))
    assert after["metadata"]["uid"] == before["metadata"]["uid"] and after["spec"] == before["spec"], (
        "untouched"
    )
    assert controller.process.alive() and healthy(controller), "no crash loop"


@pytest.mark.parametrize(
    ("record", "reason", "event"),
    [
        pytest.param(
            json.dumps({"metadata": {"name": "@"}, "spec": {"rbd": {"image": "disk", "monitors": ["m"]}}}),
            "unknown-plugin",
            "does not migrate (rbd)",
            id="unknown-plugin",
        ),
        pytest.param("{truncated", "bad-record", "is not JSON", id="malformed-record"),
        pytest.param(
            json.dumps(
                {
                    "metadata": {"name": "@", "labels": {"bad key": "x"}},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "awsElasticBlockStore": {"volumeID": "vol-0123456789abcdef0"},
                    },
                }
            ),
            "bad-record",
            "the API server would refuse the PV to create",
            id="record-the-api-server-refuses",
        ),
    ],
)
def test_unusable_records_are_skipped_and_the_pv_left_alone(
    release: MigrationRelease, kube: Kube, record: str, reason: str, event: str
) -> None:
    run = unique("rec")
    name = f"{run}-pv"
    created = kube.create(pvs(), csi_pv(name, run, record.replace("@", name)))
    controller = release.start(
        "ctrl", f"--feature-gates={NO_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false"
    )
    wait_for(
        lambda: controller.metric("ballast_migrate_skips_total", reason=reason) >= 1,
        60,
        f"a {reason} skip",
        diagnose=controller.process.tail,
    )
    (found,) = events_about(kube, "default", name, "MigrationSkipped")
    assert event in found["message"]
    assert untouched(kube.get(pvs(name)), created)
    assert controller.process.alive() and healthy(controller)


def test_a_csi_pv_without_a_record_is_never_touched(release: MigrationRelease, kube: Kube) -> None:
    run = unique("native")
    name = f"{run}-pv"
    created = kube.create(pvs(), csi_pv(name, run, None))
    controller = release.start(
        "ctrl",
        f"--feature-gates={NO_GATES}",
        f"--selector=e2e-run={run}",
        "--leader-elect=false",
        "--resync-period=1s",
    )
    wait_for(
        lambda: controller.metric("ballast_migrate_api_requests_total", verb="list") >= 10, 60, "resyncs"
    )
    assert untouched(kube.get(pvs(name)), created)
    assert events_about(kube, "default", name) == []
    assert controller.metric("ballast_migrate_operations_total") == 0


def test_a_claim_vanishing_mid_conversion_keeps_the_disk(
    release: MigrationRelease, kube: Kube, namespace: str, cluster: Cluster
) -> None:
    """Killed after the old PV is gone; the claim is deleted meanwhile. The restarted controller creates
    the CSI PV, notes the vanished claim (Event, skip metric) and keeps Retain instead of Delete: a
    Released PV with Delete would take the disk the user has not decided about."""
    run = unique("vanish")
    pv = labelled("aws-ebs", f"{run}-ebs", run)
    bound_pair(kube, namespace, pv, claim="data")
    wait_all_bound(kube, namespace, ["data"])
    common = (f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false")
    killed = release.start("ctrl", *common, env={"BALLAST_FAILPOINTS": "migrate.convert.release"})
    wait_for(lambda: not killed.process.alive(), MOVE_TIMEOUT, "the kill after the old PV went")
    release.stop_all()
    kube.delete(pvcs(namespace, "data"))
    kube.wait_gone(pvcs(namespace, "data"), 30, "the claim")
    controller = release.start("ctrl", *common)
    name = pv["metadata"]["name"]
    wait_for(
        lambda: controller.metric("ballast_migrate_skips_total", reason="claim-vanished") == 1,
        MOVE_TIMEOUT,
        "the vanished claim to be noted",
        diagnose=controller.process.tail,
    )
    wait_for(lambda: bool(events_about(kube, "default", name, "PolicyKept")), 30, "the PolicyKept event")
    after = kube.get(pvs(name))
    assert after["spec"]["csi"]["volumeHandle"] == "vol-0a1b2c3d4e5f60718"
    assert after["spec"]["persistentVolumeReclaimPolicy"] == "Retain", "Delete was not restored"
    assert [e["type"] for e in events_about(kube, "default", name, "ClaimVanished")] == ["Warning"]
    assert controller.process.alive() and healthy(controller)


def test_rollback_refuses_a_pv_that_names_another_disk_now(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("swap")
    pv = labelled("aws-ebs", f"{run}-ebs", run)
    name = pv["metadata"]["name"]
    bound_pair(kube, namespace, pv, claim="data")
    wait_all_bound(kube, namespace, ["data"])
    selector = f"--selector=e2e-run={run}"
    release.start("fwd", f"--feature-gates={ALL_GATES}", selector, "--leader-elect=false")
    converted = kube.wait(pvs(name), converted_and_bound(kube, namespace, "data"), MOVE_TIMEOUT, "converted")
    release.stop_all()
    # The handle is immutable: someone re-creates the PV on another disk, keeping the annotations.
    swapped = {k: converted[k] for k in ("apiVersion", "kind", "spec")}
    swapped["metadata"] = {k: converted["metadata"][k] for k in ("name", "labels", "annotations")}
    swapped["spec"]["csi"]["volumeHandle"] = "vol-0fffffffffffffff0"
    kube.patch(pvs(name), {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    kube.delete(pvs(name))
    kube.patch(pvs(name), {"metadata": {"finalizers": None}})
    kube.wait_gone(pvs(name), 30, "the converted PV")
    replaced = kube.create(pvs(), swapped)
    controller = release.start("back", f"--feature-gates={NO_GATES}", selector, "--leader-elect=false")
    wait_for(
        lambda: bool(events_about(kube, "default", name, "RollbackRefused")),
        60,
        "the refusal",
        diagnose=controller.process.tail,
    )
    (event,) = events_about(kube, "default", name, "RollbackRefused")
    assert "vol-0fffffffffffffff0" in event["message"] and "vol-0a1b2c3d4e5f60718" in event["message"]
    assert untouched(kube.get(pvs(name)), replaced)
    assert controller.metric("ballast_migrate_operations_total", direction="rollback", result="refused") >= 1


def test_an_api_conflict_is_retried_on_fresh_state(cluster: Cluster, kube: Kube, namespace: str) -> None:
    """A write lands between the step's read and its conditional patch (409): the step reads again and
    patches the fresh object, keeping the other writer's change."""
    name = unique("conflict")
    kube.create(pvs(), sample_pv("aws-ebs", name=name))
    metrics = Metrics("test", "test")
    client = migrate_kube.connect(str(cluster.admin_kubeconfig), on_request=metrics.api_request)
    claims, usage, drivers = LiveClaims(client), live_usage(client), LiveDrivers(client)
    context = Context(client, claims, usage, EventRecorder(None, "t"), metrics, 60, drivers)
    uid = kube.get(pvs(name))["metadata"]["uid"]
    seen: list[str] = []

    def change(pv: Obj) -> Obj | None:
        seen.append(pv["metadata"]["resourceVersion"])
        if len(seen) == 1:  # another writer gets in first
            kube.patch(pvs(name), {"metadata": {"labels": {"edited-by": "someone-else"}}})
        return {"spec": {"persistentVolumeReclaimPolicy": "Retain"}}

    try:
        patch_fresh(context, name, uid, change)
    finally:
        client.close()
    after = kube.get(pvs(name))
    assert len(seen) == 2 and seen[0] != seen[1], "read again after the conflict"
    assert metrics.conflicts._value.get() == 1
    assert after["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert after["metadata"]["labels"]["edited-by"] == "someone-else"
    kube.delete(pvs(name))
