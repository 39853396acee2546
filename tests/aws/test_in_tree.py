"""A volume from the in-tree `kubernetes.io/aws-ebs` era, translated by the shim, is published and
unpublished by the driver (real gRPC server, aws backend, moto EC2) under the same EBS volume id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from csi._proto import csi_pb2
from csi.backends.aws import AwsBackend
from csi.backends.aws.devices import DeviceFinder
from shim import Translator
from tests.aws.conftest import serving
from tests.csiclient import CsiClient
from tests.motoserver import ZONE

AM = csi_pb2.VolumeCapability.AccessMode


def in_tree_volume(ec2: Any) -> str:
    """A volume as the in-tree plugin made it: no CSI tags, only the kubernetes.io ones."""
    tags = [
        {"Key": "KubernetesCluster", "Value": "legacy"},
        {"Key": "kubernetes.io/created-for/pv/name", "Value": "pv-legacy"},
        {"Key": "kubernetes.io/created-for/pvc/name", "Value": "data"},
    ]
    created = ec2.create_volume(
        Size=5,
        AvailabilityZone=ZONE,
        VolumeType="gp2",
        TagSpecifications=[{"ResourceType": "volume", "Tags": tags}],
    )
    return str(created["VolumeId"])


def in_tree_pv(volume_id: str, partition: int = 0, read_only: bool = False) -> dict[str, Any]:
    source: dict[str, Any] = {"volumeID": f"aws://{ZONE}/{volume_id}", "fsType": "ext4"}
    if partition:
        source["partition"] = partition
    if read_only:
        source["readOnly"] = True
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "pv-legacy", "labels": {"topology.kubernetes.io/zone": ZONE}},
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "awsElasticBlockStore": source,
        },
    }


@pytest.fixture
def grpc_driver(
    make_backend: Callable[..., AwsBackend], instance: str, tmp_path: Path
) -> Iterator[tuple[CsiClient, AwsBackend]]:
    """The real driver (gRPC on a unix socket) over the aws backend; stopped even when the test fails."""
    backend = make_backend(node_id=instance)
    with serving(backend, f"{tmp_path}/csi.sock", "--node-id", instance) as client:
        yield client, backend


def attachments(ec2: Any, volume_id: str) -> list[tuple[str, str, str]]:
    volume = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    return [(a["VolumeId"], a["InstanceId"], a["Device"]) for a in volume.get("Attachments", [])]


def test_translated_in_tree_pv_is_published_and_unpublished_with_the_same_id(
    grpc_driver: tuple[CsiClient, AwsBackend], ec2: Any, instance: str
) -> None:
    client, backend = grpc_driver
    volume_id = in_tree_volume(ec2)
    pv = Translator().translate_in_tree_pv_to_csi(in_tree_pv(volume_id, partition=1))
    csi = pv["spec"]["csi"]
    assert (csi["driver"], csi["volumeHandle"]) == ("ebs.csi.aws.com", volume_id)
    affinity = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert affinity["key"] in backend.capabilities.topology_keys and affinity["values"] == [ZONE]

    capability = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=csi["fsType"]),
        access_mode=AM(mode=AM.SINGLE_NODE_WRITER),
    )
    published = client.controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=csi["volumeHandle"],
            node_id=instance,
            volume_capability=capability,
            readonly=bool(csi.get("readOnly", False)),
            volume_context=csi["volumeAttributes"],
        )
    )
    device = published.publish_context["devicePath"]
    assert attachments(ec2, volume_id) == [(volume_id, instance, device)]

    listed = client.controller.ListVolumes(csi_pb2.ListVolumesRequest())
    entry = next(e for e in listed.entries if e.volume.volume_id == volume_id)
    assert list(entry.status.published_node_ids) == [instance]
    got = client.controller.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=volume_id))
    assert got.volume.accessible_topology[0].segments[affinity["key"]] == ZONE

    client.controller.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=csi["volumeHandle"], node_id=instance)
    )
    assert attachments(ec2, volume_id) == []


@pytest.mark.parametrize(
    "handle",
    [
        pytest.param("aws://{zone}/{vid}", id="in-tree-with-zone"),
        pytest.param("aws:///{vid}", id="in-tree-without-zone"),
    ],
)
def test_untranslated_in_tree_handles_address_the_same_volume(
    grpc_driver: tuple[CsiClient, AwsBackend], ec2: Any, instance: str, handle: str
) -> None:
    client, _ = grpc_driver
    volume_id = in_tree_volume(ec2)
    legacy = handle.format(zone=ZONE, vid=volume_id)
    capability = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
    )
    client.controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=legacy, node_id=instance, volume_capability=capability
        )
    )
    assert [a[:2] for a in attachments(ec2, volume_id)] == [(volume_id, instance)]
    client.controller.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=volume_id, node_id=instance)
    )
    assert attachments(ec2, volume_id) == []


def test_node_finds_the_translated_volume_by_its_serial(
    make_backend: Callable[..., AwsBackend], ec2: Any, instance: str, tmp_path: Path
) -> None:
    volume_id = in_tree_volume(ec2)
    csi = Translator().translate_in_tree_pv_to_csi(in_tree_pv(volume_id))["spec"]["csi"]
    (tmp_path / "dev/disk/by-id").mkdir(parents=True)
    (tmp_path / "dev/nvme1n1").write_text("")
    serial = volume_id.replace("-", "", 1)
    (tmp_path / f"dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{serial}").symlink_to("../../nvme1n1")
    (tmp_path / "sys/class/block/nvme1n1/device").mkdir(parents=True)
    (tmp_path / "sys/class/block/nvme1n1/device/serial").write_text(serial)
    finder = DeviceFinder(root=str(tmp_path), timeout=0, udev_lookup=lambda s: None)
    backend = make_backend(node_id=instance, device_finder=finder)
    context = backend.attach(csi["volumeHandle"], instance, False)
    assert backend.resolve_device(csi["volumeHandle"], context) == "/dev/nvme1n1"
    assert csi["volumeAttributes"] == {"partition": "0"}
