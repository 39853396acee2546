"""In-tree -> CSI -> in-tree returns the original PV, for every plugin.

Kubernetes' translation is lossy in known places (spec 6), so each original is written the way
Kubernetes can restore it: GA zone *and* region requirements and labels (a term without a region gets
one added on the way back), no fields the CSI side drops (Portworx readOnly, Cinder secretRef,
vSphere storagePolicyName/ID), and EBS IDs already in `vol-...` form. vSphere cannot round-trip a
volume path at all: Kubernetes reads it back from an `initialvolumefilepath` attribute it never writes,
so its case uses an empty path and the loss is asserted separately.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shim import Translator

GA_ZONE = "topology.kubernetes.io/zone"
GA_REGION = "topology.kubernetes.io/region"


def pv(
    source_key: str, source: dict[str, Any], *, zone: str = "", region: str = "", **meta: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": "10Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "claimRef": {"name": "claim", "namespace": "apps"},
        source_key: source,
    }
    metadata: dict[str, Any] = {"name": "pv-1", **meta}
    if zone:
        metadata["labels"] = {GA_ZONE: zone, GA_REGION: region}
        expressions = [
            {"key": GA_ZONE, "operator": "In", "values": [zone]},
            {"key": GA_REGION, "operator": "In", "values": [region]},
        ]
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": spec}


CASES = [
    pytest.param(
        pv(
            "gcePersistentDisk",
            {"pdName": "disk-1", "fsType": "ext4", "partition": 2, "readOnly": True},
            zone="us-central1-a",
            region="us-central1",
        ),
        id="gce-pd-zonal",
    ),
    pytest.param(pv("gcePersistentDisk", {"pdName": "disk-1"}), id="gce-pd-no-topology"),
    pytest.param(
        pv(
            "awsElasticBlockStore",
            {"volumeID": "vol-0123", "fsType": "xfs", "partition": 1, "readOnly": True},
            zone="us-west-2a",
            region="us-west-2",
        ),
        id="aws-ebs-zonal",
    ),
    pytest.param(pv("awsElasticBlockStore", {"volumeID": "vol-0123"}), id="aws-ebs-no-topology"),
    pytest.param(
        pv(
            "azureDisk",
            {
                "diskName": "disk-1",
                "diskURI": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/disk-1",
                "cachingMode": "ReadOnly",
                "fsType": "ext4",
                "readOnly": False,
                "kind": "Managed",
            },
        ),
        id="azure-disk",
    ),
    pytest.param(
        pv(
            "azureFile",
            {
                "secretName": "azure-storage-account-acct-secret",
                "shareName": "share",
                "secretNamespace": "apps",
                "readOnly": True,
            },
            annotations={"kubernetes.io/azure-file-resource-group": "rg"},
        ),
        id="azure-file",
    ),
    pytest.param(
        pv(
            "cinder", {"volumeID": "c-1", "fsType": "ext4", "readOnly": True}, zone="nova", region="RegionOne"
        ),
        id="cinder-zonal",
    ),
    pytest.param(
        pv(
            "vsphereVolume",
            {"volumePath": "", "fsType": "ext4"},
            zone="zone-a",
            region="region-1",
        ),
        id="vsphere-volume",
    ),
    pytest.param(
        pv(
            "portworxVolume",
            {"volumeID": "px-1", "fsType": "ext4"},
            annotations={
                "openstorage.io/auth-secret-name": "s",
                "openstorage.io/auth-secret-namespace": "ns",
            },
        ),
        id="portworx",
    ),
]


@pytest.mark.parametrize("original", CASES)
def test_round_trip_returns_the_original(original: dict[str, Any]) -> None:
    t = Translator()
    before = copy.deepcopy(original)
    csi = t.translate_in_tree_pv_to_csi(original)
    assert "csi" in csi["spec"] and csi["spec"]["csi"]["driver"]
    assert t.translate_csi_pv_to_in_tree(csi) == original
    assert original == before


SOURCE_KEYS = {"gcePersistentDisk", "awsElasticBlockStore", "azureDisk", "azureFile", "cinder",
               "vsphereVolume", "portworxVolume"}  # fmt: skip


def test_every_plugin_has_a_round_trip_case() -> None:
    covered = {key for case in CASES for key in case.values[0]["spec"] if key in SOURCE_KEYS}  # type: ignore[index]
    assert covered == SOURCE_KEYS


@pytest.mark.parametrize(
    ("plugin_source", "lost"),
    [
        pytest.param(("vsphereVolume", {"volumePath": "[ds] vols/d.vmdk"}), "volumePath", id="vsphere-path"),
        pytest.param(
            ("vsphereVolume", {"volumePath": "", "storagePolicyName": "gold"}),
            "storagePolicyName",
            id="vsphere-policy",
        ),
        pytest.param(
            ("portworxVolume", {"volumeID": "px-1", "readOnly": True}), "readOnly", id="portworx-readonly"
        ),
    ],
)
def test_documented_kubernetes_losses(plugin_source: tuple[str, dict[str, Any]], lost: str) -> None:
    """Kubernetes drops these fields on the way to CSI; the shim does the same (spec 6.2, 6.8)."""
    key, source = plugin_source
    back = Translator().translate_csi_pv_to_in_tree(Translator().translate_in_tree_pv_to_csi(pv(key, source)))
    assert back["spec"][key].get(lost) in (None, "")
    assert source[lost] not in (None, "")
