"""Volumes in use wait (Events on the PV and the claim) and move once free, also when they became used
after their old PV was deleted; StorageClass twins (created, default mark moved only on request,
removed once unused on rollback); inline pod volumes reported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shim.migrate.journal import Journal
from shim.migrate.lock import ANN_JOURNAL, lease_name
from shim.migrate.twins import ANN_DEFAULT_MOVED, ANN_TWIN_OF, DEFAULT_CLASS
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, leases, pods, pvcs, pvs, storage_classes, volume_attachments
from tests.e2e.migration.harness import (
    ALL_GATES,
    MOVE_TIMEOUT,
    NO_GATES,
    MigrationRelease,
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


def pod_using(namespace: str, name: str, volume: Obj) -> Obj:
    """A pod no scheduler places (none runs here): Pending, which is not terminated, so it uses the volume."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "busybox"}], "volumes": [volume]},
    }


def attachment(name: str, pv: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "node-x", "source": {"persistentVolumeName": pv}},
    }


def test_a_volume_in_use_waits_and_moves_once_its_pod_and_attachment_are_gone(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("inuse")
    pv = sample_pv("aws-ebs", name=f"{run}-ebs")
    name = pv["metadata"]["name"]
    pv["metadata"]["labels"]["e2e-run"] = run
    bound_pair(kube, namespace, pv, claim="data")
    wait_all_bound(kube, namespace, ["data"])
    kube.create(
        pods(namespace),
        pod_using(namespace, "app", {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}),
    )
    kube.create(volume_attachments(), attachment(f"{run}-va", name))
    controller = release.start(
        "ctrl", f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false"
    )
    try:
        wait_for(
            lambda: bool(events_about(kube, namespace, "data", "MigrationWaiting")),
            60,
            "a waiting Event on the claim",
            diagnose=controller.process.tail,
        )
        (on_pv,) = events_about(kube, "default", name, "MigrationWaiting")
        assert (
            f"Pod {namespace}/app (Pending)" in on_pv["message"]
            and f"VolumeAttachment {run}-va" in on_pv["message"]
        )
        time.sleep(3)  # a resync-free pause: still in-tree, and no lock left behind while it waits
        assert "awsElasticBlockStore" in kube.get(pvs(name))["spec"]
        assert controller.metric("ballast_migrate_volumes_waiting", reason="in-use") == 1
        kube.delete(pods(namespace, "app"))
        kube.wait_gone(pods(namespace, "app"), 30, "the pod")
        time.sleep(2)
        assert "awsElasticBlockStore" in kube.get(pvs(name))["spec"], "still attached: still waiting"
    finally:
        kube.delete(volume_attachments(f"{run}-va"))
    kube.wait(pvs(name), converted_and_bound(kube, namespace, "data"), MOVE_TIMEOUT, "converted once free")
    assert controller.metric("ballast_migrate_volumes_waiting", reason="in-use") == 0


def test_a_volume_used_after_its_pv_was_deleted_keeps_it_until_free(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    """Killed right after the DELETE, the controller leaves the old PV Bound behind pv-protection, where a
    new pod can still use it. The resumed conversion sees that pod and waits at that step: the PV and its
    finalizer stay until the pod is gone, and only then is the PV replaced."""
    run = unique("uad")
    pv = sample_pv("aws-ebs", name=f"{run}-ebs")
    name = pv["metadata"]["name"]
    pv["metadata"]["labels"]["e2e-run"] = run
    bound_pair(kube, namespace, pv, claim="data")
    wait_all_bound(kube, namespace, ["data"])
    args = (f"--feature-gates={ALL_GATES}", f"--selector=e2e-run={run}", "--leader-elect=false")
    killed = release.start("ctrl", *args, env={"BALLAST_FAILPOINTS": "migrate.convert.delete"})
    wait_for(lambda: not killed.process.alive(), MOVE_TIMEOUT, "the kill right after the DELETE")
    release.stop_all()
    claim_volume = {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}
    kube.create(pods(namespace), pod_using(namespace, "app", claim_volume))
    controller = release.start("ctrl", *args)
    wait_for(
        lambda: bool(events_about(kube, "default", name, "MigrationWaiting")),
        60,
        "a waiting Event on the deleted PV",
        diagnose=controller.process.tail,
    )
    (on_pv,) = events_about(kube, "default", name, "MigrationWaiting")
    assert f"deleted for the convert but in use by Pod {namespace}/app (Pending)" in on_pv["message"]
    time.sleep(3)  # it keeps waiting
    old = kube.get(pvs(name))
    assert "awsElasticBlockStore" in old["spec"] and old["metadata"].get("deletionTimestamp")
    assert "kubernetes.io/pv-protection" in old["metadata"]["finalizers"]
    journal = Journal.from_json(
        kube.get(leases(namespace, lease_name(name)))["metadata"]["annotations"][ANN_JOURNAL]
    )
    assert journal.step == "delete"
    kube.delete(pods(namespace, "app"))
    kube.wait(pvs(name), converted_and_bound(kube, namespace, "data"), MOVE_TIMEOUT, "converted once free")


def in_tree_class(name: str, default: bool) -> Obj:
    annotations = {DEFAULT_CLASS: "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations},
        "provisioner": "kubernetes.io/aws-ebs",
        "parameters": {"type": "gp2", "fsType": "ext4", "zone": "us-east-1a"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


@pytest.fixture
def moving_release(cluster: Cluster, namespace: str) -> Iterator[MigrationRelease]:
    """A release with migration.moveDefaultClass=true (its ClusterRole may patch StorageClasses)."""
    made = migration_release(cluster, namespace, {"migration": {"moveDefaultClass": True}})
    try:
        yield made
    finally:
        cleanup(made)


def test_twin_gets_the_default_mark_only_when_asked_and_goes_once_unused(
    moving_release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("sc")
    classes = {f"{run}-plain": False, f"{run}-default": True}
    for name, default in classes.items():
        kube.create(storage_classes(), in_tree_class(name, default))
    taken = kube.create(
        storage_classes(), {**in_tree_class(f"{run}-taken-csi", False), "provisioner": "other.example.com"}
    )
    kube.create(storage_classes(), in_tree_class(f"{run}-taken", False))
    try:
        check_twins(moving_release, kube, namespace, run, taken)
    finally:
        for name in [*classes, f"{run}-taken", f"{run}-taken-csi", *(f"{c}-csi" for c in classes)]:
            kube.delete(storage_classes(name))


def check_twins(release: MigrationRelease, kube: Kube, namespace: str, run: str, taken: Obj) -> None:
    release.start("ctrl", f"--feature-gates={ALL_GATES}", "--leader-elect=false", "--move-default-class")
    twin = kube.wait(storage_classes(f"{run}-plain-csi"), lambda sc: True, 60, "the twin")
    assert twin["provisioner"] == "ebs.csi.aws.com"
    assert twin["parameters"] == {"type": "gp2", "csi.storage.k8s.io/fstype": "ext4"}
    assert twin["allowedTopologies"] == [
        {"matchLabelExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "values": ["us-east-1a"]}]}
    ]
    assert (twin["reclaimPolicy"], twin["volumeBindingMode"]) == ("Delete", "WaitForFirstConsumer")
    assert twin["metadata"]["annotations"][ANN_TWIN_OF] == f"{run}-plain"
    assert DEFAULT_CLASS not in twin["metadata"]["annotations"]
    moved = kube.wait(
        storage_classes(f"{run}-default-csi"),
        lambda sc: sc["metadata"]["annotations"].get(DEFAULT_CLASS) == "true",
        60,
        "the default mark",
    )
    assert moved["metadata"]["annotations"][ANN_DEFAULT_MOVED] == "true"
    assert kube.get(storage_classes(f"{run}-default"))["metadata"]["annotations"][DEFAULT_CLASS] == "false"
    wait_for(
        lambda: bool(events_about(kube, "default", f"{run}-taken", "MigrationSkipped")),
        60,
        "a name clash Event",
    )
    assert kube.get(storage_classes(f"{run}-taken-csi"))["provisioner"] == taken["provisioner"], (
        "not ours: left alone"
    )
    # Roll back: a twin a claim names stays (Event) until the claim goes; then it goes and the mark returns.
    kube.create(
        pvcs(namespace),
        {
            "metadata": {"name": "uses-twin"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": f"{run}-default-csi",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    release.stop_all()
    release.start("back", f"--feature-gates={NO_GATES}", "--leader-elect=false", "--move-default-class")
    kube.wait_gone(storage_classes(f"{run}-plain-csi"), 60, "the unused twin")
    wait_for(
        lambda: bool(events_about(kube, "default", f"{run}-default-csi", "TwinInUse")),
        60,
        "a TwinInUse Event",
    )
    assert kube.exists(storage_classes(f"{run}-default-csi"))
    kube.delete(pvcs(namespace, "uses-twin"))
    kube.wait_gone(storage_classes(f"{run}-default-csi"), 60, "the twin once unused")
    assert kube.get(storage_classes(f"{run}-default"))["metadata"]["annotations"][DEFAULT_CLASS] == "true"


def test_inline_in_tree_volumes_are_reported_never_touched(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    inline = {
        "name": "legacy",
        "awsElasticBlockStore": {"volumeID": "vol-0123456789abcdef0", "fsType": "ext4"},
    }
    created = kube.create(pods(namespace), pod_using(namespace, "legacy-app", inline))
    controller = release.start("ctrl", f"--feature-gates={ALL_GATES}", "--leader-elect=false")
    wait_for(
        lambda: bool(events_about(kube, namespace, "legacy-app", "InlineInTreeVolume")),
        60,
        "the report",
        diagnose=controller.process.tail,
    )
    (event,) = events_about(kube, namespace, "legacy-app", "InlineInTreeVolume")
    assert "inline volume legacy uses in-tree kubernetes.io/aws-ebs" in event["message"]
    assert controller.metric("ballast_migrate_inline_volumes", plugin="kubernetes.io/aws-ebs") >= 1
    assert kube.get(pods(namespace, "legacy-app"))["spec"]["volumes"] == created["spec"]["volumes"]
