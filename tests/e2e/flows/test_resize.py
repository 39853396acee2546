"""PVC expansion and VolumeAttributesClass changes, both through csi-resizer."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import Bed
from tests.e2e.flows.helpers import (
    GiB,
    backend_volume,
    claim,
    create_claim,
    ec2_tags,
    unique,
    volume_handle,
    wait_bound,
)
from tests.e2e.kube import Obj, pvcs, pvs, volume_attributes_classes

pytestmark = pytest.mark.slow
RESIZE_TIMEOUT = 90
VAC_SIZE = "8Gi"  # EBS gives gp3 at most 500 IOPS per GiB (3000 at any size): 4000 IOPS needs 8 GiB


def test_claim_expansion_grows_the_volume(bed: Bed, namespace: str) -> None:
    name = unique("grow")
    create_claim(bed, namespace, claim(name, "immediate", "1Gi"))
    _, pv = wait_bound(bed, namespace, name)

    bed.kube.patch(pvcs(namespace, name), {"spec": {"resources": {"requests": {"storage": "3Gi"}}}})
    grown = bed.kube.wait(
        pvs(pv["metadata"]["name"]),
        lambda p: p["spec"]["capacity"]["storage"] == "3Gi",
        RESIZE_TIMEOUT,
        "the PV to be expanded to 3Gi",
    )
    volume = backend_volume(bed, volume_handle(grown))
    assert volume is not None and volume.capacity_bytes == 3 * GiB
    # A filesystem volume still needs NodeExpandVolume, which kubelet runs: the claim says so.
    conditions = bed.kube.get(pvcs(namespace, name))["status"].get("conditions", [])
    assert any(c["type"] == "FileSystemResizePending" for c in conditions), conditions


def attributes_class(name: str, driver: str, parameters: dict[str, str]) -> Obj:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttributesClass",
        "metadata": {"name": name},
        "driverName": driver,
        "parameters": parameters,
    }


def test_attributes_class_change_modifies_the_volume(bed: Bed, namespace: str) -> None:
    name = unique("vac")
    fast = unique("fast")
    changes = {"iops": "4000"}
    if bed.is_aws:  # with a tag the resizer's names fill (--extra-modify-metadata)
        changes["tagSpecification_1"] = "modified-for={{ .PVCName }}"
    bed.kube.create(volume_attributes_classes(), attributes_class(fast, bed.driver, changes))
    create_claim(bed, namespace, claim(name, "immediate", VAC_SIZE))
    wait_bound(bed, namespace, name)

    bed.kube.patch(pvcs(namespace, name), {"spec": {"volumeAttributesClassName": fast}})
    modified = bed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("currentVolumeAttributesClassName") == fast,
        RESIZE_TIMEOUT,
        f"the claim's current attributes class to become {fast}",
    )
    assert "modifyVolumeStatus" not in modified["status"]
    pv = bed.kube.get(pvs(modified["spec"]["volumeName"]))
    assert pv["spec"].get("volumeAttributesClassName") == fast
    if bed.is_aws:
        described = bed.ec2.describe_volumes(VolumeIds=[volume_handle(pv)])["Volumes"][0]
        assert described["Iops"] == 4000
        assert ec2_tags(bed, volume_id=volume_handle(pv))["modified-for"] == name


def test_infeasible_attributes_class_leaves_the_volume_untouched(bed: Bed, namespace: str) -> None:
    name = unique("vac-bad")
    fast, impossible = unique("fast"), unique("impossible")
    bed.kube.create(volume_attributes_classes(), attributes_class(fast, bed.driver, {"iops": "4000"}))
    bed.kube.create(
        volume_attributes_classes(),
        attributes_class(impossible, bed.driver, {"iops": "4000", "color": "blue"}),
    )
    create_claim(bed, namespace, claim(name, "immediate", VAC_SIZE, attributes_class=fast))
    _, pv = wait_bound(bed, namespace, name)
    bed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("currentVolumeAttributesClassName") == fast,
        RESIZE_TIMEOUT,
        f"the claim to be created with attributes class {fast}",
    )
    before = backend_volume(bed, volume_handle(pv))

    bed.kube.patch(pvcs(namespace, name), {"spec": {"volumeAttributesClassName": impossible}})
    refused = bed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("modifyVolumeStatus", {}).get("status") == "Infeasible",
        RESIZE_TIMEOUT,
        "the modification to be marked Infeasible",
    )
    assert refused["status"]["modifyVolumeStatus"]["targetVolumeAttributesClassName"] == impossible
    assert refused["status"]["currentVolumeAttributesClassName"] == fast
    assert backend_volume(bed, volume_handle(pv)) == before
    assert bed.kube.get(pvs(pv["metadata"]["name"]))["spec"].get("volumeAttributesClassName") == fast


def test_expansion_the_backend_can_never_reach_is_recovered_with_a_lower_request(
    bed: Bed, namespace: str
) -> None:
    """RecoverVolumeExpansionFailure: the driver answers OUT_OF_RANGE for a size it can never reach
    (csi-resizer marks it infeasible); the user lowers the request and the expansion goes through."""
    name = unique("recover")
    create_claim(bed, namespace, claim(name, "immediate", "1Gi"))
    _, pv = wait_bound(bed, namespace, name)

    bed.kube.patch(pvcs(namespace, name), {"spec": {"resources": {"requests": {"storage": "100Ti"}}}})
    failed = bed.kube.wait(
        pvcs(namespace, name),
        lambda c: (
            c["status"].get("allocatedResourceStatuses", {}).get("storage") == "ControllerResizeInfeasible"
        ),
        RESIZE_TIMEOUT,
        "the expansion to 100Ti to be marked infeasible",
    )
    assert failed["status"]["capacity"]["storage"] == "1Gi"
    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == GiB

    bed.kube.patch(pvcs(namespace, name), {"spec": {"resources": {"requests": {"storage": "2Gi"}}}})
    bed.kube.wait(
        pvs(pv["metadata"]["name"]),
        lambda p: p["spec"]["capacity"]["storage"] == "2Gi",
        RESIZE_TIMEOUT,
        "the PV to be expanded to the lowered 2Gi",
    )
    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == 2 * GiB
