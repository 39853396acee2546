"""VolumeSnapshot -> VolumeSnapshotContent ready (snapshot-controller + csi-snapshotter) -> a claim
restored from it (external-provisioner)."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import AWS_CLUSTER_ID, AWS_EXTRA_TAGS, Bed
from tests.e2e.flows.helpers import (
    GiB,
    backend_volume,
    claim,
    create_claim,
    ec2_tags,
    unique,
    volume_handle,
    wait_bound,
    wait_ready,
)
from tests.e2e.kube import volume_snapshot_contents, volume_snapshots

pytestmark = pytest.mark.slow


def test_snapshot_becomes_ready_and_restores_into_a_new_claim(bed: Bed, namespace: str) -> None:
    source = unique("src")
    create_claim(bed, namespace, claim(source, "immediate", "2Gi"))
    _, source_pv = wait_bound(bed, namespace, source)

    snap = unique("snap")
    bed.kube.create(
        volume_snapshots(namespace),
        {
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": snap},
            "spec": {"volumeSnapshotClassName": "snapshots", "source": {"persistentVolumeClaimName": source}},
        },
    )
    ready = wait_ready(bed, volume_snapshots(namespace, snap), f"snapshot {snap}", 90)
    content = bed.kube.get(volume_snapshot_contents(ready["status"]["boundVolumeSnapshotContentName"]))
    assert content["spec"]["driver"] == bed.driver
    assert content["status"]["readyToUse"] is True
    assert content["status"]["restoreSize"] == 2 * GiB
    if bed.is_aws:  # the chart's sidecars pass the names the classes' tag templates read
        volume_tags = ec2_tags(bed, volume_id=volume_handle(source_pv))
        snapshot_tags = ec2_tags(bed, snapshot_id=content["status"]["snapshotHandle"])
        assert volume_tags["claim"] == f"{namespace}/{source}"
        assert snapshot_tags["snapshot"] == f"{namespace}/{snap}"
        for tags in (volume_tags, snapshot_tags):  # and the operator's, from chart values
            assert tags["kubernetes.io/cluster/" + AWS_CLUSTER_ID] == "owned"
            assert {k: tags[k] for k in AWS_EXTRA_TAGS} == AWS_EXTRA_TAGS

    restored = unique("restored")
    data_source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snap}
    create_claim(bed, namespace, claim(restored, "immediate", "2Gi", data_source=data_source))
    _, pv = wait_bound(bed, namespace, restored)
    assert volume_handle(pv) != volume_handle(source_pv)
    volume = backend_volume(bed, volume_handle(pv))
    assert volume is not None and volume.capacity_bytes == 2 * GiB
