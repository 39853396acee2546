"""PVC expansion and VolumeAttributesClass changes, both through csi-resizer."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import Testbed
from tests.e2e.flows.helpers import (
    GiB,
    backend_volume,
    claim,
    create_claim,
    unique,
    volume_handle,
    wait_bound,
)
from tests.e2e.kube import Obj, pvcs, pvs, volume_attributes_classes

pytestmark = pytest.mark.slow
RESIZE_TIMEOUT = 90


def test_claim_expansion_grows_the_volume(testbed: Testbed, namespace: str) -> None:
    name = unique("grow")
    create_claim(testbed, namespace, claim(name, "immediate", "1Gi"))
    _, pv = wait_bound(testbed, namespace, name)

    testbed.kube.patch(pvcs(namespace, name), {"spec": {"resources": {"requests": {"storage": "3Gi"}}}})
    grown = testbed.kube.wait(
        pvs(pv["metadata"]["name"]),
        lambda p: p["spec"]["capacity"]["storage"] == "3Gi",
        RESIZE_TIMEOUT,
        "the PV to be expanded to 3Gi",
    )
    volume = backend_volume(testbed, volume_handle(grown))
    assert volume is not None and volume.capacity_bytes == 3 * GiB
    # A filesystem volume still needs NodeExpandVolume, which kubelet runs: the claim says so.
    conditions = testbed.kube.get(pvcs(namespace, name))["status"].get("conditions", [])
    assert any(c["type"] == "FileSystemResizePending" for c in conditions), conditions


def attributes_class(name: str, driver: str, parameters: dict[str, str]) -> Obj:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttributesClass",
        "metadata": {"name": name},
        "driverName": driver,
        "parameters": parameters,
    }


def test_attributes_class_change_modifies_the_volume(testbed: Testbed, namespace: str) -> None:
    name = unique("vac")
    fast = unique("fast")
    testbed.kube.create(volume_attributes_classes(), attributes_class(fast, testbed.driver, {"iops": "4000"}))
    create_claim(testbed, namespace, claim(name, "immediate"))
    wait_bound(testbed, namespace, name)

    testbed.kube.patch(pvcs(namespace, name), {"spec": {"volumeAttributesClassName": fast}})
    modified = testbed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("currentVolumeAttributesClassName") == fast,
        RESIZE_TIMEOUT,
        f"the claim's current attributes class to become {fast}",
    )
    assert "modifyVolumeStatus" not in modified["status"]
    pv = testbed.kube.get(pvs(modified["spec"]["volumeName"]))
    assert pv["spec"].get("volumeAttributesClassName") == fast
    if testbed.is_aws:
        described = testbed.ec2.describe_volumes(VolumeIds=[volume_handle(pv)])["Volumes"][0]
        assert described["Iops"] == 4000


def test_infeasible_attributes_class_leaves_the_volume_untouched(testbed: Testbed, namespace: str) -> None:
    name = unique("vac-bad")
    fast, impossible = unique("fast"), unique("impossible")
    testbed.kube.create(volume_attributes_classes(), attributes_class(fast, testbed.driver, {"iops": "4000"}))
    testbed.kube.create(
        volume_attributes_classes(),
        attributes_class(impossible, testbed.driver, {"iops": "4000", "color": "blue"}),
    )
    create_claim(testbed, namespace, claim(name, "immediate", attributes_class=fast))
    _, pv = wait_bound(testbed, namespace, name)
    testbed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("currentVolumeAttributesClassName") == fast,
        RESIZE_TIMEOUT,
        f"the claim to be created with attributes class {fast}",
    )
    before = backend_volume(testbed, volume_handle(pv))

    testbed.kube.patch(pvcs(namespace, name), {"spec": {"volumeAttributesClassName": impossible}})
    refused = testbed.kube.wait(
        pvcs(namespace, name),
        lambda c: c["status"].get("modifyVolumeStatus", {}).get("status") == "Infeasible",
        RESIZE_TIMEOUT,
        "the modification to be marked Infeasible",
    )
    assert refused["status"]["modifyVolumeStatus"]["targetVolumeAttributesClassName"] == impossible
    assert refused["status"]["currentVolumeAttributesClassName"] == fast
    assert backend_volume(testbed, volume_handle(pv)) == before
    assert testbed.kube.get(pvs(pv["metadata"]["name"]))["spec"].get("volumeAttributesClassName") == fast
