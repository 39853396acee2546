"""Sample in-tree PVs (pvs.yaml, one per plugin) and a sample journal for the migration unit and e2e tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from shim.migrate.journal import Journal
from shim.migrate.objects import ClaimRef

PVS_FILE = Path(__file__).with_name("pvs.yaml")
Obj = dict[str, Any]

# plugin short name (the PV's name in pvs.yaml) -> (in-tree source key, in-tree plugin, CSI driver)
PLUGINS: dict[str, tuple[str, str, str]] = {
    "aws-ebs": ("awsElasticBlockStore", "kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    "gce-pd": ("gcePersistentDisk", "kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    "azure-disk": ("azureDisk", "kubernetes.io/azure-disk", "disk.csi.azure.com"),
    "azure-file": ("azureFile", "kubernetes.io/azure-file", "file.csi.azure.com"),
    "cinder": ("cinder", "kubernetes.io/cinder", "cinder.csi.openstack.org"),
    "vsphere-volume": ("vsphereVolume", "kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
    "portworx": ("portworxVolume", "kubernetes.io/portworx-volume", "pxd.portworx.com"),
}


def sample_pvs() -> dict[str, Obj]:
    """Every sample PV by plugin short name (fresh copies)."""
    docs = [d for d in yaml.safe_load_all(PVS_FILE.read_text()) if d]
    found = {d["metadata"]["name"]: d for d in docs}
    assert sorted(found) == sorted(PLUGINS), f"{PVS_FILE} must hold one PV per plugin"
    return copy.deepcopy(found)


def sample_pv(plugin: str, name: str | None = None, claim: tuple[str, str, str] | None = None) -> Obj:
    """The sample PV of `plugin`, renamed, optionally pre-bound to claim (namespace, name, uid)."""
    pv = sample_pvs()[plugin]
    if name is not None:
        pv["metadata"]["name"] = name
    if claim is not None:
        namespace, claim_name, uid = claim
        ref = {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "namespace": namespace,
            "name": claim_name,
        }
        pv["spec"]["claimRef"] = {**ref, **({"uid": uid} if uid else {})}
    return pv


def sample_journal(was_bound: bool = True) -> Journal:
    """A convert journal of pv-1 at its first step, bound to claim ns/data unless `was_bound` is False."""
    return Journal(
        id="j-1",
        direction="convert",
        pv="pv-1",
        plugin="kubernetes.io/aws-ebs",
        source_uid="u-1",
        policy="Delete",
        was_bound=was_bound,
        claim=ClaimRef("ns", "data", "c-1") if was_bound else None,
        source={"spec": {}},
        target={"metadata": {"name": "pv-1"}, "spec": {}},
        started_by="a_0.1.0",
        started_at="2026-01-01T00:00:00Z",
    )
