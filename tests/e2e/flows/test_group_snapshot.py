"""VolumeGroupSnapshot -> one CreateVolumeGroupSnapshot for every claim its selector picks
(snapshot-controller + csi-snapshotter) -> member VolumeSnapshots a claim restores from; and, on the aws
backend, which takes none, the reason on the object."""

from __future__ import annotations

import grpc
import pytest

from csi._proto import csi_pb2
from tests.csiclient import client
from tests.e2e.flows.conftest import GROUP_CLASS, Bed
from tests.e2e.flows.helpers import (
    GiB,
    backend_volume,
    claim,
    create_claim,
    unique,
    volume_handle,
    wait_bound,
    wait_ready,
)
from tests.e2e.kube import (
    Obj,
    volume_group_snapshot_classes,
    volume_group_snapshot_contents,
    volume_group_snapshots,
    volume_snapshot_contents,
    volume_snapshots,
)

pytestmark = pytest.mark.slow
READY_TIMEOUT = 120


def _labelled_claims(bed: Bed, namespace: str, label: dict[str, str], count: int) -> list[str]:
    """`count` bound claims carrying `label`; returns their volume handles."""
    handles = []
    for _ in range(count):
        name = unique("member")
        body = claim(name, "immediate")
        body["metadata"]["labels"] = label
        create_claim(bed, namespace, body)
        handles.append(volume_handle(wait_bound(bed, namespace, name)[1]))
    return handles


def _group_snapshot(bed: Bed, namespace: str, label: dict[str, str], class_name: str) -> str:
    name = unique("group")
    bed.kube.create(
        volume_group_snapshots(namespace),
        {
            "apiVersion": "groupsnapshot.storage.k8s.io/v1",
            "kind": "VolumeGroupSnapshot",
            "metadata": {"name": name},
            "spec": {
                "volumeGroupSnapshotClassName": class_name,
                "source": {"selector": {"matchLabels": label}},
            },
        },
    )
    return name


def _backend_group(bed: Bed, group_id: str) -> csi_pb2.VolumeGroupSnapshot | None:
    """The group as the driver reports it (GetVolumeGroupSnapshot), or None when it does not exist."""
    with client(bed.deployment.controller_endpoint) as csi:
        try:
            request = csi_pb2.GetVolumeGroupSnapshotRequest(group_snapshot_id=group_id)
            found: csi_pb2.VolumeGroupSnapshot = csi.group.GetVolumeGroupSnapshot(
                request, timeout=30
            ).group_snapshot
            return found
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise


def _members(bed: Bed, namespace: str, group: Obj) -> list[Obj]:
    """The VolumeSnapshots the snapshot-controller made for the group (owned by it)."""
    uid = group["metadata"]["uid"]
    return [
        s
        for s in bed.kube.items(volume_snapshots(namespace))
        if any(o["uid"] == uid for o in s["metadata"].get("ownerReferences", []))
    ]


def test_group_snapshot_of_the_claims_a_selector_picks(bed: Bed, namespace: str) -> None:
    """The local backend takes it and a member restores; the aws backend says why it cannot."""
    if bed.is_aws:
        _aws_says_why_it_cannot(bed, namespace)
    else:
        _taken_and_a_member_restores(bed, namespace)


def _taken_and_a_member_restores(bed: Bed, namespace: str) -> None:
    label = {"app": unique("db")}
    handles = _labelled_claims(bed, namespace, label, 2)
    create_claim(bed, namespace, claim(unique("other"), "immediate"))  # not selected
    name = _group_snapshot(bed, namespace, label, GROUP_CLASS)

    group = wait_ready(bed, volume_group_snapshots(namespace, name), f"group snapshot {name}", READY_TIMEOUT)
    content = bed.kube.get(
        volume_group_snapshot_contents(group["status"]["boundVolumeGroupSnapshotContentName"])
    )
    assert content["spec"]["driver"] == bed.driver
    infos = content["status"]["volumeSnapshotInfoList"]
    assert sorted(i["volumeHandle"] for i in infos) == sorted(handles)
    group_id = content["status"]["volumeGroupSnapshotHandle"]
    taken = _backend_group(bed, group_id)
    assert taken is not None and taken.ready_to_use
    assert {s.source_volume_id: s.snapshot_id for s in taken.snapshots} == {
        i["volumeHandle"]: i["snapshotHandle"] for i in infos
    }
    assert {s.group_snapshot_id for s in taken.snapshots} == {group_id}

    members = _members(bed, namespace, group)
    assert len(members) == 2
    for member in members:
        member_name = member["metadata"]["name"]
        ready = wait_ready(
            bed, volume_snapshots(namespace, member_name), f"member {member_name}", READY_TIMEOUT
        )
        assert ready["status"]["volumeGroupSnapshotName"] == name
        bound = bed.kube.get(volume_snapshot_contents(ready["status"]["boundVolumeSnapshotContentName"]))
        assert bound["status"]["snapshotHandle"] in {s.snapshot_id for s in taken.snapshots}

    restored = unique("restored")
    source = {
        "apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot",
        "name": members[0]["metadata"]["name"],
    }
    create_claim(bed, namespace, claim(restored, "immediate", data_source=source))
    _, pv = wait_bound(bed, namespace, restored)
    assert volume_handle(pv) not in handles
    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == GiB

    bed.kube.delete(volume_group_snapshots(namespace, name))
    bed.kube.wait_gone(volume_group_snapshots(namespace, name), READY_TIMEOUT, f"group snapshot {name} to go")
    bed.kube.wait_gone(
        volume_group_snapshot_contents(content["metadata"]["name"]), READY_TIMEOUT, "its content to go"
    )
    assert _backend_group(bed, group_id) is None  # deletionPolicy Delete: gone from the backend too


def _aws_says_why_it_cannot(bed: Bed, namespace: str) -> None:
    class_name = unique("groups")
    bed.kube.create(
        volume_group_snapshot_classes(),
        {
            "apiVersion": "groupsnapshot.storage.k8s.io/v1",
            "kind": "VolumeGroupSnapshotClass",
            "metadata": {"name": class_name},
            "driver": bed.driver,
            "deletionPolicy": "Delete",
        },
    )
    try:
        label = {"app": unique("db")}
        handles = _labelled_claims(bed, namespace, label, 2)
        name = _group_snapshot(bed, namespace, label, class_name)
        group = bed.kube.wait(
            volume_group_snapshots(namespace, name),
            lambda g: bool(g.get("status", {}).get("error", {}).get("message")),
            READY_TIMEOUT,
            f"group snapshot {name} to report an error",
        )
        assert "CreateVolumeGroupSnapshot is not supported" in group["status"]["error"]["message"]
        assert not group["status"].get("readyToUse")
        snapshots = bed.ec2.describe_snapshots(Filters=[{"Name": "volume-id", "Values": handles}])[
            "Snapshots"
        ]
        assert snapshots == []
        bed.kube.delete(volume_group_snapshots(namespace, name))
        bed.kube.wait_gone(
            volume_group_snapshots(namespace, name), READY_TIMEOUT, f"group snapshot {name} to go"
        )
    finally:
        bed.kube.delete(volume_group_snapshot_classes(class_name))
