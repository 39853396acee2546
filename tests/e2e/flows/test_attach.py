"""Attach and detach through the attach-detach controller and csi-attacher, for a pod placed on a
registered node (the scheduler's placement is played by setting spec.nodeName)."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import Testbed
from tests.e2e.flows.helpers import backend_volume, claim, create_claim, unique, volume_handle, wait_bound
from tests.e2e.kube import Obj, pods, volume_attachments
from tests.e2e.kubelet import has_taint, startup_taint_key

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


def attachment_of(tb: Testbed, pv_name: str) -> Obj | None:
    for va in tb.kube.items(volume_attachments()):
        if va["spec"]["source"].get("persistentVolumeName") == pv_name:
            return va
    return None


def test_node_plugin_removes_its_startup_taint(testbed: Testbed) -> None:
    """Ready and registered, the node plugin takes `<driver>/agent-not-ready` off its own Node."""
    key = startup_taint_key(testbed.driver)
    testbed.kube.wait(
        f"/api/v1/nodes/{testbed.node.name}",
        lambda n: not any(t["key"] == key for t in n["spec"].get("taints") or []),
        60,
        f"the node plugin to remove taint {key}",
    )
    assert not has_taint(testbed.kube, testbed.node.name, key)


def test_pod_on_a_node_attaches_and_detaches_its_volume(testbed: Testbed, namespace: str) -> None:
    name = unique("att")
    create_claim(testbed, namespace, claim(name, "immediate"))
    _, pv = wait_bound(testbed, namespace, name)
    pv_name, handle = pv["metadata"]["name"], volume_handle(pv)

    testbed.kube.create(pods(namespace), pod_using(name, name, testbed.node.name))
    testbed.kube.wait(
        volume_attachments(),
        lambda _: (
            (a := attachment_of(testbed, pv_name)) is not None and bool(a.get("status", {}).get("attached"))
        ),
        ATTACH_TIMEOUT,
        f"a VolumeAttachment of {pv_name} to be attached",
    )
    attachment = attachment_of(testbed, pv_name)
    assert attachment is not None and attachment["spec"]["attacher"] == testbed.driver
    assert attachment["spec"]["nodeName"] == testbed.node.name
    volume = backend_volume(testbed, handle)
    assert volume is not None and volume.published_nodes == [testbed.node.node_id]

    # The pod goes (force-deleted: no kubelet confirms a graceful stop): the volume is detached.
    testbed.kube.request("DELETE", pods(namespace, name), {"gracePeriodSeconds": 0})
    testbed.kube.wait(
        volume_attachments(),
        lambda _: attachment_of(testbed, pv_name) is None,
        ATTACH_TIMEOUT,
        f"the VolumeAttachment of {pv_name} to be deleted",
    )
    volume = backend_volume(testbed, handle)
    assert volume is not None and volume.published_nodes == []
