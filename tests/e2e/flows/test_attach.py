"""Attach and detach through the attach-detach controller and csi-attacher, for a pod placed on a
registered node (the scheduler's placement is played by setting spec.nodeName)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.flows.conftest import AWS_ZONE, LOCAL_ATTACH_LIMIT, Bed
from tests.e2e.flows.helpers import backend_volume, claim, create_claim, unique, volume_handle, wait_bound
from tests.e2e.kube import Obj, pods, volume_attachments
from tests.e2e.kubelet import has_taint, refresh_allocatable, startup_taint_key

pytestmark = pytest.mark.slow
ATTACH_TIMEOUT = 90


def pod_using(name: str, claim_name: str, node: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
        },
    }


def attachment_of(tb: Bed, pv_name: str) -> Obj | None:
    for va in tb.kube.items(volume_attachments()):
        if va["spec"]["source"].get("persistentVolumeName") == pv_name:
            return va
    return None


def is_attached(bed: Bed, pv_name: str) -> Callable[[Obj], bool]:
    """A `wait` condition (on the VolumeAttachment list): the PV's attachment reports attached."""
    return lambda _: bool(((attachment_of(bed, pv_name) or {}).get("status") or {}).get("attached"))


def is_detached(bed: Bed, pv_name: str) -> Callable[[Obj], bool]:
    return lambda _: attachment_of(bed, pv_name) is None


def test_node_plugin_removes_its_startup_taint(bed: Bed) -> None:
    """Ready and registered, the node plugin takes `<driver>/agent-not-ready` off its own Node."""
    key = startup_taint_key(bed.driver)
    bed.kube.wait(
        f"/api/v1/nodes/{bed.node.name}",
        lambda n: not any(t["key"] == key for t in n["spec"].get("taints") or []),
        60,
        f"the node plugin to remove taint {key}",
    )
    assert not has_taint(bed.kube, bed.node.name, key)


def test_pod_on_a_node_attaches_and_detaches_its_volume(bed: Bed, namespace: str) -> None:
    name = unique("att")
    create_claim(bed, namespace, claim(name, "immediate"))
    _, pv = wait_bound(bed, namespace, name)
    pv_name, handle = pv["metadata"]["name"], volume_handle(pv)

    bed.kube.create(pods(namespace), pod_using(name, name, bed.node.name))
    bed.kube.wait(
        volume_attachments(),
        lambda _: (
            (a := attachment_of(bed, pv_name)) is not None and bool(a.get("status", {}).get("attached"))
        ),
        ATTACH_TIMEOUT,
        f"a VolumeAttachment of {pv_name} to be attached",
    )
    attachment = attachment_of(bed, pv_name)
    assert attachment is not None and attachment["spec"]["attacher"] == bed.driver
    assert attachment["spec"]["nodeName"] == bed.node.name
    volume = backend_volume(bed, handle)
    assert volume is not None and volume.published_nodes == [bed.node.node_id]

    # The pod goes (force-deleted: no kubelet confirms a graceful stop): the volume is detached.
    bed.kube.request("DELETE", pods(namespace, name), {"gracePeriodSeconds": 0})
    bed.kube.wait(
        volume_attachments(),
        lambda _: attachment_of(bed, pv_name) is None,
        ATTACH_TIMEOUT,
        f"the VolumeAttachment of {pv_name} to be deleted",
    )
    volume = backend_volume(bed, handle)
    assert volume is not None and volume.published_nodes == []


@pytest.mark.parametrize("bed", ["aws"], indirect=True)
def test_full_node_answers_resource_exhausted_until_a_slot_frees(bed: Bed, namespace: str) -> None:
    """The node's slots (its instance type's, minus volumes attached outside the driver) are full:
    csi-attacher gets RESOURCE_EXHAUSTED and reports it on the VolumeAttachment; once a slot frees it
    retries and the volume attaches."""
    # kubelet's allocatable refresh (every nodeAllocatableUpdatePeriodSeconds) keeps CSINode current.
    slots = refresh_allocatable(bed.kube, bed.deployment, bed.node.name)
    instance = bed.node.node_id
    foreign: list[tuple[str, str]] = []  # (volume, device) attached outside the driver
    for i in range(slots):
        vid = bed.ec2.create_volume(AvailabilityZone=AWS_ZONE, Size=1)["VolumeId"]
        device = f"/dev/sd{chr(ord('f') + i % 11)}{i}"
        bed.ec2.attach_volume(VolumeId=vid, InstanceId=instance, Device=device)
        foreign.append((vid, device))
    try:
        name = unique("full")
        create_claim(bed, namespace, claim(name, "immediate"))
        _, pv = wait_bound(bed, namespace, name)
        pv_name = pv["metadata"]["name"]
        bed.kube.create(pods(namespace), pod_using(name, name, bed.node.name))
        bed.kube.wait(
            volume_attachments(),
            lambda _: (
                "no free attach slot"
                in str(((attachment_of(bed, pv_name) or {}).get("status") or {}).get("attachError", {}))
            ),
            ATTACH_TIMEOUT,
            "csi-attacher to report the full node on the VolumeAttachment",
        )
        attachment = attachment_of(bed, pv_name)
        assert attachment is not None and not attachment["status"].get("attached")

        vid, device = foreign.pop()
        bed.ec2.detach_volume(VolumeId=vid, InstanceId=instance, Device=device)
        bed.kube.wait(
            volume_attachments(),
            lambda _: bool(((attachment_of(bed, pv_name) or {}).get("status") or {}).get("attached")),
            ATTACH_TIMEOUT,
            "the attachment to succeed once a slot is free",
        )
        volume = backend_volume(bed, volume_handle(pv))
        assert volume is not None and volume.published_nodes == [instance]
        bed.kube.request("DELETE", pods(namespace, name), {"gracePeriodSeconds": 0})
        bed.kube.wait(
            volume_attachments(), lambda _: attachment_of(bed, pv_name) is None, ATTACH_TIMEOUT, "detach"
        )
    finally:
        for vid, device in foreign:
            bed.ec2.detach_volume(VolumeId=vid, InstanceId=instance, Device=device)


@pytest.mark.parametrize("bed", ["local"], indirect=True)
def test_local_node_at_its_limit_answers_resource_exhausted_until_a_volume_detaches(
    bed: Bed, namespace: str
) -> None:
    """The chart gives node.maxVolumesPerNode to both pods: NodeGetInfo reports it (CSINode), and the
    controller refuses the attach past it until a pod on the node goes."""
    slots = refresh_allocatable(bed.kube, bed.deployment, bed.node.name)
    assert slots == LOCAL_ATTACH_LIMIT
    names = [unique("slot") for _ in range(slots + 1)]
    pv_names = []
    for name in names:
        create_claim(bed, namespace, claim(name, "immediate"))
        pv_names.append(wait_bound(bed, namespace, name)[1]["metadata"]["name"])
    for name in names[:slots]:
        bed.kube.create(pods(namespace), pod_using(name, name, bed.node.name))
    for pv_name in pv_names[:slots]:
        bed.kube.wait(
            volume_attachments(),
            is_attached(bed, pv_name),
            ATTACH_TIMEOUT,
            f"{pv_name} to attach",
        )
    last, last_pv = names[-1], pv_names[-1]
    bed.kube.create(pods(namespace), pod_using(last, last, bed.node.name))
    bed.kube.wait(
        volume_attachments(),
        lambda _: (
            "limit" in str(((attachment_of(bed, last_pv) or {}).get("status") or {}).get("attachError", {}))
        ),
        ATTACH_TIMEOUT,
        "csi-attacher to report the node's limit on the VolumeAttachment",
    )
    bed.kube.request("DELETE", pods(namespace, names[0]), {"gracePeriodSeconds": 0})
    bed.kube.wait(
        volume_attachments(),
        is_attached(bed, last_pv),
        ATTACH_TIMEOUT,
        "the last volume to attach once a slot is free",
    )
    for name in names[1:]:
        bed.kube.request("DELETE", pods(namespace, name), {"gracePeriodSeconds": 0})
    for pv_name in pv_names:
        bed.kube.wait(
            volume_attachments(),
            is_detached(bed, pv_name),
            ATTACH_TIMEOUT,
            "detach",
        )
