"""Provisioning from a legacy `kubernetes.io/aws-ebs` StorageClass, as users have them.

Kubernetes' CSI migration hands such claims to the driver named ebs.csi.aws.com: the PV controller
marks the claim for it, external-provisioner translates the class's parameters to CSI, and the PV it
writes back is in-tree (`awsElasticBlockStore`) form. This runs for the aws backend on moto and for the
local backend standing in under that name; the local flavor is not a migration target.
"""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import AWS_ZONE, Bed
from tests.e2e.flows.helpers import (
    GiB,
    assert_pinned_to,
    backend_volume,
    claim,
    create_claim,
    unique,
    volume_handle,
    wait_bound,
)
from tests.e2e.kube import storage_classes

pytestmark = pytest.mark.slow
EBS_TARGETS = ["ebs-standin", "aws"]
IN_TREE = "kubernetes.io/aws-ebs"

# (parameters, size) of classes as they exist in clusters created before CSI.
LEGACY_CLASSES = {
    "gp2-encrypted": ({"type": "gp2", "fsType": "ext4", "encrypted": "true"}, "1Gi"),
    "io1-iops-per-gb": ({"type": "io1", "iopsPerGB": "50", "fsType": "ext4"}, "4Gi"),
}


@pytest.mark.parametrize("bed", EBS_TARGETS, indirect=True)
@pytest.mark.parametrize("legacy", list(LEGACY_CLASSES))
def test_legacy_class_provisions_an_in_tree_pv_through_the_driver(
    bed: Bed, namespace: str, legacy: str
) -> None:
    parameters, size = LEGACY_CLASSES[legacy]
    class_name = unique(legacy)
    bed.kube.create(
        storage_classes(),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": class_name},
            "provisioner": IN_TREE,
            "parameters": parameters,
            "volumeBindingMode": "Immediate",
        },
    )
    try:
        name = unique("legacy")
        create_claim(bed, namespace, claim(name, class_name, size))
        pvc, pv = wait_bound(bed, namespace, name)
    finally:
        bed.kube.delete(storage_classes(class_name))

    annotations = pv["metadata"]["annotations"]
    assert annotations["pv.kubernetes.io/provisioned-by"] == IN_TREE
    assert annotations["pv.kubernetes.io/migrated-to"] == "ebs.csi.aws.com"
    assert pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] == "ebs.csi.aws.com"
    ebs = pv["spec"]["awsElasticBlockStore"]
    assert "csi" not in pv["spec"]
    # The in-tree source names the EBS volume the driver created, under the zone's well-known key.
    assert ebs["volumeID"].startswith("vol-"), ebs
    assert ebs.get("fsType") == "ext4"
    assert_pinned_to(pv, {"topology.kubernetes.io/zone": AWS_ZONE})

    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == int(size[:-2]) * GiB
    if bed.is_aws:
        described = bed.ec2.describe_volumes(VolumeIds=[volume_handle(pv)])["Volumes"][0]
        assert described["VolumeType"] == parameters["type"]
        assert described["Encrypted"] is (parameters.get("encrypted") == "true")
        if "iopsPerGB" in parameters:
            assert described["Iops"] == int(parameters["iopsPerGB"]) * int(size[:-2])
