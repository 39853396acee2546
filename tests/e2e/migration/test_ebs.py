"""EBS end to end: the driver on the local backend, deployed by the chart as `ebs.csi.aws.com`, serves a
volume provisioned from a legacy `kubernetes.io/aws-ebs` StorageClass (an in-tree PV). A file written
through the in-tree volume (kubelet's translation of it) reads back through the converted CSI PV, and
again after the rollback, each time staged and published over gRPC after a real attach by the
attach-detach controller and csi-attacher. While the pod uses the volume, the controller waits.
The reclaim policy Delete still removes the disk after conversion and after rollback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from csi._proto import csi_pb2
from shim.migrate.objects import ANN_ORIGINAL, record_of
from tests.conftest import require_root, require_tool
from tests.csiclient import client
from tests.e2e.cluster import Cluster
from tests.e2e.deploy import Deployment, deployed_chart
from tests.e2e.flows.conftest import AWS_ZONE, Bed, flavor_values
from tests.e2e.flows.helpers import backend_volume
from tests.e2e.kube import Kube, csi_nodes, namespaces, phase_is, pvcs, pvs, storage_classes
from tests.e2e.kubelet import RegisteredNode, has_taint, register_node, startup_taint_key
from tests.e2e.migration.harness import (
    MOVE_TIMEOUT,
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
from tests.e2e.migration.volumes import Kubelet, Mounted
from tests.e2e.process import wait_for
from tests.integration.conftest import write_mbr
from tests.shim.migrate.samples import Obj

pytestmark = [pytest.mark.slow, pytest.mark.root]
AWS_GATES = "--feature-gates=CSIMigration=true,CSIMigrationAWS=true"
OFF_GATES = "--feature-gates=CSIMigration=true,CSIMigrationAWS=false"
MIGRATED_PLUGINS = "storage.alpha.kubernetes.io/migrated-plugins"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"


@dataclass
class Ebs:
    kube: Kube
    namespace: str
    deployment: Deployment
    node: RegisteredNode
    kubelet: Kubelet
    release: MigrationRelease
    legacy_class: str

    @property
    def bed(self) -> Bed:
        return Bed("ebs-standin", self.kube, self.deployment, self.node)

    def provision(self, claim: str, run: str) -> Obj:
        """A claim of the legacy class, bound to the in-tree PV the driver provisioned; labelled `run`."""
        self.kube.create(
            pvcs(self.namespace),
            {
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": self.legacy_class,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        pvc = self.kube.wait(pvcs(self.namespace, claim), phase_is("Bound"), 90, f"claim {claim} bound")
        name = pvc["spec"]["volumeName"]
        return self.kube.patch(pvs(name), {"metadata": {"labels": {"e2e-run": run}}})

    def volume_file(self, volume_id: str) -> Path:
        """The local backend's file behind a volume (the stand-in's "EBS volume")."""
        return self.deployment.workdir / "data" / "volumes" / f"{volume_id}.img"

    def legacy_pv(self, claim: str, run: str, partition: int = 0) -> Obj:
        """A disk the way the in-tree plugin left it: created on EBS (CreateVolume here), and a PV whose
        volumeID is `aws://<zone>/vol-...` with the beta zone label, bound to `claim`."""
        with client(self.deployment.controller_endpoint) as csi:
            volume = csi.controller.CreateVolume(
                csi_pb2.CreateVolumeRequest(
                    name=unique("kubernetes-dynamic-pvc"),
                    parameters={"type": "gp2"},
                    capacity_range=csi_pb2.CapacityRange(required_bytes=1024**3),
                    volume_capabilities=[mount_capability()],
                ),
                timeout=60,
            ).volume
        pv: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": unique("pvc"),
                "labels": {"e2e-run": run, BETA_ZONE: AWS_ZONE},
                "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/aws-ebs"},
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": self.legacy_class,
                "awsElasticBlockStore": {
                    "volumeID": f"aws://{AWS_ZONE}/{volume.volume_id}",
                    "fsType": "ext4",
                },
            },
        }
        if partition:
            pv["spec"]["awsElasticBlockStore"]["partition"] = partition
        bound_pair(self.kube, self.namespace, pv, claim)
        wait_all_bound(self.kube, self.namespace, [claim])
        return self.kube.get(pvs(pv["metadata"]["name"]))


def mount_capability() -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )


@pytest.fixture(scope="module")
def ebs(cluster: Cluster) -> Iterator[Ebs]:
    require_root()
    require_tool("mkfs.ext4")
    kube, namespace = cluster.admin(), unique("ebs")
    kube.create(namespaces(), {"metadata": {"name": namespace}})
    legacy = unique("legacy-gp2")
    kube.create(
        storage_classes(),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": legacy},
            "provisioner": "kubernetes.io/aws-ebs",
            "parameters": {"type": "gp2", "fsType": "ext4"},
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    )
    try:
        # Snapshots play no part here: no VolumeSnapshot CRDs, no csi-snapshotter.
        values = {
            **flavor_values("ebs-standin", ""),
            "volumeSnapshotClasses": [],
            "volumeGroupSnapshotClasses": [],
        }
        values["sidecars"] = {"snapshotter": {"enabled": False}}
        node_name = unique("node")
        with deployed_chart(cluster, values, namespace, controller_node=node_name) as deployment:
            node = register_node(kube, deployment, node_name)
            # Pods go on the node only once the plugin has removed its startup taint (NoExecute: the
            # taint-eviction controller deletes pods that land before).
            taint = startup_taint_key(deployment.driver_name)
            wait_for(lambda: not has_taint(kube, node_name, taint), 60, "the node plugin to remove its taint")
            # kubelet, with CSI migration on, lists the migrated plugins on its CSINode; the attach-detach
            # controller then attaches in-tree aws-ebs volumes through ebs.csi.aws.com.
            kube.patch(
                csi_nodes(node.name),
                {"metadata": {"annotations": {MIGRATED_PLUGINS: "kubernetes.io/aws-ebs"}}},
            )
            release = migration_release(cluster, namespace)
            kubelet = Kubelet(kube, node, deployment.node_endpoint(node.name), node_kubelet_dir(node))
            try:
                yield Ebs(kube, namespace, deployment, node, kubelet, release, legacy)
            finally:
                cleanup(release)
    finally:
        kube.delete(storage_classes(legacy))
        kube.delete(namespaces(namespace))


def node_kubelet_dir(node: RegisteredNode) -> Path:
    """The kubelet dir the node plugin was started with (its --kubelet-dir, as the harness passed it)."""
    argv = node.pod.processes["ballast-plugin"].argv
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith("--kubelet-dir=")]
    return Path(value)


def write_line(mounted: Mounted, line: str) -> None:
    with open(mounted.target / "data.txt", "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_lines(mounted: Mounted) -> list[str]:
    return (mounted.target / "data.txt").read_text().splitlines()


def test_data_written_in_tree_reads_back_through_the_csi_pv_and_after_rollback(ebs: Ebs) -> None:
    run, kube, ns = unique("data"), ebs.kube, ebs.namespace
    in_tree = ebs.legacy_pv("data", run)
    name = in_tree["metadata"]["name"]
    volume_id = in_tree["spec"]["awsElasticBlockStore"]["volumeID"]
    assert volume_id.startswith(f"aws://{AWS_ZONE}/vol-")
    writer = ebs.kubelet.start_pod(ns, "writer", "data", in_tree)
    assert writer.handle == volume_id.rsplit("/", 1)[1], "kubelet's translation drops the aws://zone/ prefix"
    write_line(writer, "written through the in-tree volume")
    controller = ebs.release.start("ctrl", AWS_GATES, f"--selector=e2e-run={run}", "--leader-elect=false")
    wait_for(
        lambda: bool(events_about(kube, "default", name, "MigrationWaiting")),
        60,
        "waiting while in use",
        diagnose=controller.process.tail,
    )
    assert "awsElasticBlockStore" in kube.get(pvs(name))["spec"], "in use: not converted"
    ebs.kubelet.stop_pod(ns, writer, name)
    converted = kube.wait(
        pvs(name), converted_and_bound(kube, ns, "data"), MOVE_TIMEOUT, "converted once free"
    )
    check_topology(converted, ebs.node)
    reader = ebs.kubelet.start_pod(ns, "reader", "data", converted)
    assert reader.handle == writer.handle and converted["spec"]["csi"]["volumeHandle"] == writer.handle
    assert read_lines(reader) == ["written through the in-tree volume"]
    write_line(reader, "written through the CSI PV")
    ebs.kubelet.stop_pod(ns, reader, name)
    ebs.release.stop_all()
    ebs.release.start("ctrl", OFF_GATES, f"--selector=e2e-run={run}", "--leader-elect=false")
    back = kube.wait(
        pvs(name), back_in_tree(kube, ns, "data", "awsElasticBlockStore"), MOVE_TIMEOUT, "rolled back"
    )
    assert record_of(back) == json.loads(converted["metadata"]["annotations"][ANN_ORIGINAL])
    again = ebs.kubelet.start_pod(ns, "again", "data", back)
    assert read_lines(again) == ["written through the in-tree volume", "written through the CSI PV"]
    ebs.kubelet.stop_pod(ns, again, name)
    deleted_with_its_claim(ebs, "data", back)


def check_topology(converted: Obj, node: RegisteredNode) -> None:
    """The translated node affinity names the driver's topology key, and the node the driver reports
    (NodeGetInfo, written to the Node by kubelet) satisfies it."""
    (term,) = converted["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    required = {e["key"]: e["values"] for e in term["matchExpressions"]}
    assert required == {"topology.ebs.csi.aws.com/zone": [AWS_ZONE]}
    assert all(node.topology.get(key) in values for key, values in required.items()), node.topology


def deleted_with_its_claim(ebs: Ebs, claim: str, pv: Obj) -> None:
    """Reclaim policy Delete: the claim goes, the external-provisioner (migrated-to names it) deletes
    the disk through the driver, then the PV."""
    notes = pv["metadata"]["annotations"]
    assert notes["pv.kubernetes.io/provisioned-by"] == "kubernetes.io/aws-ebs"
    assert notes["pv.kubernetes.io/migrated-to"] == "ebs.csi.aws.com"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    # The PV was re-created without finalizers: pv-protection comes back at admission, and the
    # external-provisioner adds its own again because migrated-to names its driver and policy is Delete.
    finalizers = ebs.kube.get(pvs(pv["metadata"]["name"]))["metadata"]["finalizers"]
    assert {"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"} <= set(
        finalizers
    )
    handle = (
        pv["spec"]["csi"]["volumeHandle"]
        if "csi" in pv["spec"]
        else (pv["spec"]["awsElasticBlockStore"]["volumeID"].rsplit("/", 1)[1])
    )
    assert backend_volume(ebs.bed, handle) is not None
    ebs.kube.delete(pvcs(ebs.namespace, claim))
    ebs.kube.wait_gone(pvs(pv["metadata"]["name"]), 90, "the PV, deleted by its reclaim policy")
    assert backend_volume(ebs.bed, handle) is None, "the disk is deleted with it"


def test_reclaim_policy_delete_still_deletes_the_disk_after_conversion(ebs: Ebs) -> None:
    run, kube, ns = unique("reclaim"), ebs.kube, ebs.namespace
    name = ebs.provision("gone", run)["metadata"]["name"]
    ebs.release.start("ctrl", AWS_GATES, f"--selector=e2e-run={run}", "--leader-elect=false")
    converted = kube.wait(pvs(name), converted_and_bound(kube, ns, "gone"), MOVE_TIMEOUT, "converted")
    deleted_with_its_claim(ebs, "gone", converted)


def test_the_partition_of_a_legacy_pv_is_what_the_converted_pv_mounts(ebs: Ebs) -> None:
    """In-tree `partition: 1` becomes the CSI attribute partition "1": the node stages /dev/loopNp1
    before and after conversion, never the whole disk (it holds a partition table), and the data stays."""
    run, kube, ns = unique("part"), ebs.kube, ebs.namespace
    in_tree = ebs.legacy_pv("part", run, partition=1)
    name = in_tree["metadata"]["name"]
    volume_id = in_tree["spec"]["awsElasticBlockStore"]["volumeID"].rsplit("/", 1)[1]
    write_mbr(str(ebs.volume_file(volume_id)), 2048, 1024**3 // 512 - 2048)
    writer = ebs.kubelet.start_pod(ns, "p-writer", "part", in_tree)
    assert mount_source(writer.staging).endswith("p1")
    write_line(writer, "on partition 1")
    ebs.kubelet.stop_pod(ns, writer, name)
    ebs.release.start("ctrl", AWS_GATES, f"--selector=e2e-run={run}", "--leader-elect=false")
    converted = kube.wait(pvs(name), converted_and_bound(kube, ns, "part"), MOVE_TIMEOUT, "converted")
    assert converted["spec"]["csi"]["volumeAttributes"] == {"partition": "1"}
    reader = ebs.kubelet.start_pod(ns, "p-reader", "part", converted)
    assert mount_source(reader.staging).endswith("p1")
    assert read_lines(reader) == ["on partition 1"]
    ebs.kubelet.stop_pod(ns, reader, name)
    with open(ebs.volume_file(volume_id), "rb") as fh:
        fh.seek(510)
        assert fh.read(2) == b"\x55\xaa", "the partition table was kept"


def mount_source(path: Path) -> str:
    """The device mounted at `path`, from this host's mount table."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            return fields[fields.index("-") + 2]
    raise AssertionError(f"nothing is mounted at {path}")


def test_a_claim_of_the_twin_provisions_a_csi_pv_through_the_driver(ebs: Ebs) -> None:
    """The legacy class's twin carries the translated parameters (fsType as csi.storage.k8s.io/fstype)
    and ebs.csi.aws.com as provisioner; a claim of it gets a native CSI PV from the driver."""
    kube, twin = ebs.kube, f"{ebs.legacy_class}-csi"
    ebs.release.start("twins", AWS_GATES, "--selector=e2e-run=none", "--leader-elect=false")
    made = kube.wait(storage_classes(twin), lambda sc: True, 60, "the twin of the legacy class")
    assert made["parameters"] == {"type": "gp2", "csi.storage.k8s.io/fstype": "ext4"}
    kube.create(
        pvcs(ebs.namespace),
        {
            "metadata": {"name": "on-twin"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": twin,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    pvc = kube.wait(pvcs(ebs.namespace, "on-twin"), phase_is("Bound"), 90, "a claim of the twin bound")
    pv = kube.get(pvs(pvc["spec"]["volumeName"]))
    assert pv["spec"]["csi"]["driver"] == "ebs.csi.aws.com" and "awsElasticBlockStore" not in pv["spec"]
    assert pv["spec"]["csi"]["fsType"] == "ext4"
    assert backend_volume(ebs.bed, pv["spec"]["csi"]["volumeHandle"]) is not None
    ebs.release.stop_all()
    kube.delete(pvcs(ebs.namespace, "on-twin"))
    kube.wait_gone(pvs(pv["metadata"]["name"]), 90, "the twin's PV, deleted with its claim")
    kube.delete(storage_classes(twin))
