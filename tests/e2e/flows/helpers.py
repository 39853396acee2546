"""Objects the flows create, and the backend's view of a volume (over the driver's own gRPC socket,
and for aws straight from moto's EC2 API)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import grpc

from csi._proto import csi_pb2
from tests.csiclient import client
from tests.e2e.flows.conftest import Bed
from tests.e2e.kube import Obj, phase_is, pvcs, pvs

GiB = 1024**3
BIND_TIMEOUT = 90


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def claim(
    name: str,
    storage_class: str,
    size: str = "1Gi",
    data_source: Obj | None = None,
    attributes_class: str = "",
) -> Obj:
    spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "resources": {"requests": {"storage": size}},
    }
    if data_source:
        spec["dataSource"] = data_source
    if attributes_class:
        spec["volumeAttributesClassName"] = attributes_class
    return {"metadata": {"name": name}, "spec": spec}


def create_claim(tb: Bed, namespace: str, body: Obj) -> None:
    tb.kube.create(pvcs(namespace), body)


def wait_bound(tb: Bed, namespace: str, name: str) -> tuple[Obj, Obj]:
    """Wait until the claim is Bound; returns (claim, its PV)."""
    pvc = tb.kube.wait(pvcs(namespace, name), phase_is("Bound"), BIND_TIMEOUT, f"claim {name} to bind")
    pv = tb.kube.get(pvs(pvc["spec"]["volumeName"]))
    return pvc, pv


def wait_ready(tb: Bed, path: str, what: str, timeout: float = 120) -> Obj:
    """Wait until the (group) snapshot at `path` reports status.readyToUse; returns it."""
    return tb.kube.wait(
        path, lambda s: bool(s.get("status", {}).get("readyToUse")), timeout, f"{what} to be ready"
    )


@dataclass
class BackendVolume:
    volume_id: str
    capacity_bytes: int
    published_nodes: list[str]


def backend_volume(tb: Bed, volume_id: str) -> BackendVolume | None:
    """The volume as the backend reports it (ControllerGetVolume), or None when it does not exist."""
    with client(tb.deployment.controller_endpoint) as csi:
        try:
            resp = csi.controller.ControllerGetVolume(
                csi_pb2.ControllerGetVolumeRequest(volume_id=volume_id), timeout=30
            )
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    found = BackendVolume(
        resp.volume.volume_id, resp.volume.capacity_bytes, list(resp.status.published_node_ids)
    )
    if tb.is_aws:
        _check_against_ec2(tb, found)
    return found


def _check_against_ec2(tb: Bed, volume: BackendVolume) -> None:
    """For aws, the same facts straight from EC2 (moto): size and attachments agree with the driver."""
    described: Any = tb.ec2.describe_volumes(VolumeIds=[volume.volume_id])["Volumes"][0]
    assert described["Size"] * GiB == volume.capacity_bytes, described
    attached = sorted(a["InstanceId"] for a in described.get("Attachments", []) if a["State"] == "attached")
    assert attached == sorted(volume.published_nodes), (described, volume)


def ec2_tags(tb: Bed, *, volume_id: str = "", snapshot_id: str = "") -> dict[str, str]:
    """The tags moto holds for one EBS volume or snapshot (aws flavor)."""
    if volume_id:
        (item,) = tb.ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    else:
        (item,) = tb.ec2.describe_snapshots(SnapshotIds=[snapshot_id])["Snapshots"]
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def volume_handle(pv: Obj) -> str:
    """The CSI handle of a PV (or, for an in-tree aws-ebs PV, the EBS volume id)."""
    spec = pv["spec"]
    if "csi" in spec:
        return str(spec["csi"]["volumeHandle"])
    return str(spec["awsElasticBlockStore"]["volumeID"]).rsplit("/", 1)[-1]


def affinity_terms(pv: Obj) -> list[dict[str, list[str]]]:
    """The PV's required node affinity as [{key: values}] per term."""
    terms = pv["spec"].get("nodeAffinity", {}).get("required", {}).get("nodeSelectorTerms", [])
    return [{e["key"]: e["values"] for e in t.get("matchExpressions", [])} for t in terms]


def assert_pinned_to(pv: Obj, topology: dict[str, str]) -> None:
    """Every node-affinity term of the PV requires each of the node's topology segments."""
    terms = affinity_terms(pv)
    assert terms, f"PV {pv['metadata']['name']} has no node affinity"
    for term in terms:
        for key, value in topology.items():
            assert term.get(key) == [value], f"term {term} does not pin {key}={value}"
