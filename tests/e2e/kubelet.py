"""The parts of a kubelet (and of the scheduler) the test bed plays itself, since none runs here.

A kubelet registers a node plugin through node-driver-registrar: it calls NodeGetInfo and writes the
answer into the Node (topology labels, the node-id annotation) and into CSINode (node id, topology keys,
allocatable count), then re-reads NodeGetInfo every `nodeAllocatableUpdatePeriodSeconds` of the
CSIDriver. The scheduler writes the selected-node annotation on a WaitForFirstConsumer claim and sets
spec.nodeName on a pod. The functions here do exactly those writes, from the driver's real answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc
from tests.e2e.deploy import Deployment, PodProcesses, find, start_pod, wait_socket
from tests.e2e.kube import MERGE_PATCH, Kube, KubeError, csi_nodes, nodes, pvcs

NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
CONTROLLER_MANAGED_ATTACH = "volumes.kubernetes.io/controller-managed-attach-detach"


def startup_taint_key(driver_name: str) -> str:
    """The taint a node carries until the driver's node plugin is ready (removed by the plugin)."""
    return f"{driver_name}/agent-not-ready"


@dataclass
class RegisteredNode:
    name: str
    node_id: str
    topology: dict[str, str]
    max_volumes: int
    pod: PodProcesses


def node_info(endpoint: str) -> csi_pb2.NodeGetInfoResponse:
    """NodeGetInfo over the node plugin's socket, as kubelet calls it."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = csi_pb2_grpc.NodeStub(channel)
        info: csi_pb2.NodeGetInfoResponse = stub.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=30)
        return info


def register_node(
    kube: Kube,
    deployment: Deployment,
    node_name: str,
    driver_env: dict[str, str] | None = None,
    taint: bool = True,
) -> RegisteredNode:
    """Create Node `node_name` (tainted `<driver>/agent-not-ready` as a provisioning tool would), start
    the chart's node pod for it, and register the driver the way kubelet does: topology labels and the
    node-id annotation on the Node, the driver entry on CSINode."""
    node_body = {
        "metadata": {
            "name": node_name,
            "labels": {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux"},
            "annotations": {CONTROLLER_MANAGED_ATTACH: "true"},
        },
        "spec": {
            "taints": (
                [{"key": startup_taint_key(deployment.driver_name), "effect": "NoExecute"}] if taint else []
            )
        },
    }
    node = kube.create(nodes(), node_body)
    daemonset = find(deployment.objects, "DaemonSet", "-node")
    pod = start_pod(
        deployment,
        daemonset["spec"]["template"]["spec"],
        f"node-{node_name}",
        node_name=node_name,
        secrets={},
        extra_env=driver_env or {},
    )
    deployment.nodes[node_name] = pod
    wait_socket(pod.processes["ballast-plugin"], pod.host_dirs["plugin-dir"] / "csi.sock")
    info = node_info(deployment.node_endpoint(node_name))
    topology = dict(info.accessible_topology.segments)
    # kubelet: topology labels and the node-id annotation on the Node ...
    kube.patch(
        nodes(node_name),
        {
            "metadata": {
                "labels": topology,
                "annotations": {NODE_ID_ANNOTATION: json.dumps({deployment.driver_name: info.node_id})},
            }
        },
    )
    # ... and the driver on CSINode (owned by the Node, as kubelet makes it).
    kube.create(
        csi_nodes(),
        {
            "metadata": {
                "name": node_name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node["metadata"]["uid"]}
                ],
            },
            "spec": {
                "drivers": [
                    {
                        "name": deployment.driver_name,
                        "nodeID": info.node_id,
                        "topologyKeys": sorted(topology),
                        "allocatable": {"count": info.max_volumes_per_node},
                    }
                ]
            },
        },
    )
    return RegisteredNode(node_name, info.node_id, topology, info.max_volumes_per_node, pod)


def refresh_allocatable(kube: Kube, deployment: Deployment, node_name: str) -> int:
    """One tick of kubelet's allocatable refresh: NodeGetInfo again, CSINode's count updated if moved."""
    count = node_info(deployment.node_endpoint(node_name)).max_volumes_per_node
    csinode = kube.get(csi_nodes(node_name))
    for driver in csinode["spec"]["drivers"]:
        if driver["name"] == deployment.driver_name and driver.get("allocatable", {}).get("count") != count:
            driver["allocatable"] = {"count": count}
            kube.replace(csi_nodes(node_name), csinode)
    return count


def unregister_node(kube: Kube, deployment: Deployment, node_name: str) -> None:
    """Stop the node pod and delete the Node (CSINode goes with it, by owner reference or here)."""
    pod = deployment.nodes.pop(node_name, None)
    if pod is not None:
        for process in pod.processes.values():
            deployment.processes.stop(process)
    for path in (csi_nodes(node_name), nodes(node_name)):
        kube.delete(path)


def select_node(kube: Kube, namespace: str, claim: str, node_name: str) -> None:
    """The scheduler's write for a WaitForFirstConsumer claim: the node it picked for the pod."""
    kube.patch(pvcs(namespace, claim), {"metadata": {"annotations": {SELECTED_NODE: node_name}}}, MERGE_PATCH)


def has_taint(kube: Kube, node_name: str, key: str) -> bool:
    try:
        node = kube.get(nodes(node_name))
    except KubeError:
        return False
    return any(t["key"] == key for t in node.get("spec", {}).get("taints") or [])
