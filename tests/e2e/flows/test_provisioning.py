"""Dynamic provisioning through external-provisioner, Immediate and WaitForFirstConsumer, with
topology; and the reclaim policies."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import Bed
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
from tests.e2e.kube import pvcs, pvs
from tests.e2e.kubelet import select_node

pytestmark = pytest.mark.slow


def test_immediate_class_provisions_a_volume_with_topology(bed: Bed, namespace: str) -> None:
    name = unique("imm")
    create_claim(bed, namespace, claim(name, "immediate", "2Gi"))
    pvc, pv = wait_bound(bed, namespace, name)

    assert pv["spec"]["csi"]["driver"] == bed.driver
    assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    assert pv["spec"]["capacity"]["storage"] == "2Gi"
    # Reachable from the node's zone only, under the driver's topology key.
    assert_pinned_to(pv, bed.node.topology)
    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == 2 * GiB


def test_wait_for_first_consumer_provisions_for_the_selected_node(bed: Bed, namespace: str) -> None:
    name = unique("wffc")
    create_claim(bed, namespace, claim(name, "wffc"))
    # Nothing happens until a node is chosen for the consumer.
    pending = bed.kube.get(pvcs(namespace, name))
    assert pending.get("status", {}).get("phase") == "Pending"
    # The scheduler's part: it picked node-a for the pod using this claim.
    select_node(bed.kube, namespace, name, bed.node.name)
    _, pv = wait_bound(bed, namespace, name)

    assert_pinned_to(pv, bed.node.topology)
    assert backend_volume(bed, volume_handle(pv)) is not None


@pytest.mark.parametrize(
    "storage_class, keeps_disk", [("immediate", False), ("retain", True)], ids=["Delete", "Retain"]
)
def test_reclaim_policy_decides_whether_the_disk_survives_its_claim(
    bed: Bed, namespace: str, storage_class: str, keeps_disk: bool
) -> None:
    name = unique("reclaim")
    create_claim(bed, namespace, claim(name, storage_class))
    _, pv = wait_bound(bed, namespace, name)
    handle = volume_handle(pv)

    bed.kube.delete(pvcs(namespace, name))
    if keeps_disk:
        bed.kube.wait(
            pvs(pv["metadata"]["name"]), lambda p: p["status"]["phase"] == "Released", 60, "PV Released"
        )
        assert backend_volume(bed, handle) is not None
        bed.kube.delete(pvs(pv["metadata"]["name"]))  # the admin's cleanup; the disk stays
        assert backend_volume(bed, handle) is not None
    else:
        bed.kube.wait_gone(pvs(pv["metadata"]["name"]), 60, "the released PV")
        assert backend_volume(bed, handle) is None
