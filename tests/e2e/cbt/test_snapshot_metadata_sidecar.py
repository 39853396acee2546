"""Changed-block tracking through Kubernetes: a backup client asks the external-snapshot-metadata
sidecar (v0.2.0, built by scripts/k8s-tools) for the changed blocks between two VolumeSnapshots, and the
sidecar gets them from the driver's SnapshotMetadata service.

The chart is deployed on the test bed with the local backend, and rendered a second time with
`snapshotMetadata.enabled`: from that rendering the sidecar's RBAC, the SnapshotMetadataService and the
sidecar container itself (its args, as processes, like every other container here) are taken. The one
change a cluster would not need: the test bed has no cluster DNS or Service proxy, so the sidecar listens
on a free loopback port and the SnapshotMetadataService names that address (its TLS certificate names
127.0.0.1 too) instead of the Service's DNS name.

The backup client is the upstream `snapshot-metadata-lister` run as its own ServiceAccount, bound to the
chart's client ClusterRole: it mints a token for the service's audience, looks the service up, and
streams GetMetadataDelta; the sidecar authenticates it (TokenReview), authorizes it (SubjectAccessReview)
and resolves the VolumeSnapshots to CSI snapshot ids. Known blocks are written into the volume between
the two snapshots; the client must see exactly those.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import Cluster, running_cluster
from tests.e2e.deploy import (
    Deployment,
    deployed_chart,
    find,
    install_crds,
    install_snapshot_crds,
    render_chart,
)
from tests.e2e.kube import Kube, pvcs, pvs, volume_snapshot_contents, volume_snapshots
from tests.e2e.kubelet import register_node
from tests.e2e.pki import CertificateAuthority, KeyPair
from tests.e2e.process import Process, free_port
from tests.e2e.tools import component_dir, k8s_binary

pytestmark = pytest.mark.slow

NAMESPACE = "ballast-system"
APPS = "backups"
NODE = "node-a"
BLOCK = 64 * 1024  # the local backend's block size for changed-block metadata
MiB = 1024**2
SIZE = 64 * MiB
WRITES = [(0, 10), (9 * BLOCK + 100, BLOCK), (SIZE - 1, 1)]  # first block, across blocks 9-10, last byte
EXPECTED = [(0, BLOCK), (9 * BLOCK, 2 * BLOCK), (SIZE - BLOCK, BLOCK)]


def _values(port: int, ca_cert: bytes) -> dict[str, Any]:
    return {
        "backend": {"name": "local", "local": {"dataDir": "{workdir}/data", "zone": "zone-a"}},
        "node": {"kubeletPath": "{workdir}/kubelet"},
        "storageClasses": [{"name": "immediate", "volumeBindingMode": "Immediate"}],
        "volumeSnapshotClasses": [{"name": "snapshots", "deletionPolicy": "Delete"}],
        "snapshotMetadata": {
            "enabled": True,
            "port": port,
            "tlsSecretName": "snapshot-metadata-tls",
            "caCert": base64.b64encode(ca_cert).decode(),
        },
    }


def _apply_sidecar_objects(kube: Kube, rendered: list[dict[str, Any]], port: int) -> None:
    """The sidecar's RBAC and the SnapshotMetadataService from the chart (address: see the docstring)."""
    for role in (
        r for r in rendered if r["kind"] == "ClusterRole" and "snapshot-metadata" in r["metadata"]["name"]
    ):
        kube.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    binding = find(rendered, "ClusterRoleBinding", "-snapshot-metadata")
    kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    service = find(rendered, "SnapshotMetadataService")
    service["spec"]["address"] = f"127.0.0.1:{port}"
    kube.create("/apis/cbt.storage.k8s.io/v1alpha1/snapshotmetadataservices", service)


def _start_sidecar(
    cluster: Cluster, deployment: Deployment, rendered: list[dict[str, Any]], tls: KeyPair
) -> Process:
    """The chart's csi-snapshot-metadata container as a process, with its pod's ServiceAccount."""
    spec = find(rendered, "Deployment", "-controller")["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "csi-snapshot-metadata")
    socket = deployment.controller.host_dirs["socket-dir"] / "csi.sock"  # type: ignore[union-attr]
    args = [
        a.replace("$(ADDRESS)", str(socket))
        .replace("/tls/tls.crt", str(tls.cert))
        .replace("/tls/tls.key", str(tls.key))
        for a in container["args"]
    ]
    kubeconfig = cluster.service_account_kubeconfig(NAMESPACE, spec["serviceAccountName"])
    argv = [str(k8s_binary("csi-snapshot-metadata")), *args, f"--kubeconfig={kubeconfig}"]
    return cluster.processes.start("csi-snapshot-metadata", argv)


@dataclass
class Bed:
    cluster: Cluster
    deployment: Deployment
    rendered: list[dict[str, Any]]  # the chart with snapshotMetadata.enabled
    sidecar: Process


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    k8s_binary("csi-snapshot-metadata")
    k8s_binary("snapshot-metadata-lister")
    crd_dir = component_dir("external-snapshot-metadata", "CSI_SNAPSHOT_METADATA_VERSION") / "crd"
    port = free_port()
    ca = CertificateAuthority(tmp_path)
    tls = ca.issue("snapshot-metadata", "csi-snapshot-metadata", server_ips=("127.0.0.1",))
    with running_cluster() as cluster:
        kube = cluster.admin()
        install_snapshot_crds(kube)
        install_crds(kube, [next(crd_dir.glob("cbt.storage.k8s.io_*.yaml"))])
        controller = [str(k8s_binary("snapshot-controller")), f"--kubeconfig={cluster.admin_kubeconfig}"]
        cluster.processes.start("snapshot-controller", controller)
        values = _values(port, ca.cert_pem)
        off = {**values, "snapshotMetadata": {**values["snapshotMetadata"], "enabled": False}}
        with deployed_chart(cluster, off, NAMESPACE, controller_node=NODE) as deployment:
            register_node(kube, deployment, NODE)
            workdir_values = yaml.safe_load(
                yaml.safe_dump(values).replace("{workdir}", str(deployment.workdir))
            )
            rendered = render_chart(workdir_values, NAMESPACE, cluster.kubernetes_version)
            _apply_sidecar_objects(kube, rendered, port)
            yield Bed(cluster, deployment, rendered, _start_sidecar(cluster, deployment, rendered, tls))


def _snapshot(kube: Kube, name: str, claim: str) -> str:
    """A VolumeSnapshot of `claim`, once ready; returns its CSI snapshot handle."""
    body = {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"volumeSnapshotClassName": "snapshots", "source": {"persistentVolumeClaimName": claim}},
    }
    kube.create(volume_snapshots(APPS), body)
    ready = kube.wait(
        volume_snapshots(APPS, name),
        lambda s: bool((s.get("status") or {}).get("readyToUse")),
        90,
        f"{name} ready",
    )
    content = kube.get(volume_snapshot_contents(ready["status"]["boundVolumeSnapshotContentName"]))
    return str(content["status"]["snapshotHandle"])


def _backup_client(cluster: Cluster, kube: Kube, rendered_client_role: str) -> Path:
    """A ServiceAccount for the backup tool, bound to the chart's client ClusterRole."""
    kubeconfig = cluster.service_account_kubeconfig(APPS, "backup", create=True)
    binding = {
        "metadata": {"name": "backup-snapshot-metadata"},
        "subjects": [{"kind": "ServiceAccount", "name": "backup", "namespace": APPS}],
        "roleRef": {
            "kind": "ClusterRole",
            "name": rendered_client_role,
            "apiGroup": "rbac.authorization.k8s.io",
        },
    }
    kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    return kubeconfig


def _ranges(output: str) -> list[tuple[int, int]]:
    """The lister's JSON records, flattened to (offset, length)."""
    out = []
    for record in json.loads(output):
        blocks = record.get("block_metadata") or record.get("BlockMetadata") or []
        out += [(int(b.get("byte_offset", 0)), int(b.get("size_bytes", 0))) for b in blocks]
    return out


def test_a_backup_client_gets_the_changed_blocks_through_the_sidecar(bed: Bed) -> None:
    cluster, deployment = bed.cluster, bed.deployment
    kube = cluster.admin()
    kube.create("/api/v1/namespaces", {"metadata": {"name": APPS}})
    kube.create(
        pvcs(APPS),
        {
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "immediate",
                "resources": {"requests": {"storage": f"{SIZE // MiB}Mi"}},
            },
        },
    )
    pvc = kube.wait(
        pvcs(APPS, "data"), lambda c: c.get("status", {}).get("phase") == "Bound", 90, "data bound"
    )
    handle = kube.get(pvs(pvc["spec"]["volumeName"]))["spec"]["csi"]["volumeHandle"]
    # the controller's data dir (where the harness put it: under its pod's directories)
    (volume_file,) = deployment.workdir.rglob(f"data/volumes/{handle}.img")
    base = _snapshot(kube, "base", "data")
    fd = os.open(volume_file, os.O_WRONLY)  # the node would write through the loop device: same file
    try:
        for offset, length in WRITES:
            os.pwrite(fd, b"\xa5" * length, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    target = _snapshot(kube, "target", "data")
    assert base != target
    client_role = find(bed.rendered, "ClusterRole", "-snapshot-metadata-client")["metadata"]["name"]
    kubeconfig = _backup_client(cluster, kube, client_role)
    argv = [
        str(k8s_binary("snapshot-metadata-lister")),
        "-kubeconfig", str(kubeconfig),
        "-namespace", APPS,
        "-snapshot", "target",
        "-previous-snapshot", "base",
        "-service-account", "backup",
        "-service-account-namespace", APPS,
        "-output-format", "json",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{result.stderr}\n{bed.sidecar.tail()}\n{deployment.diagnose()}"
    assert _ranges(result.stdout) == EXPECTED, result.stdout
