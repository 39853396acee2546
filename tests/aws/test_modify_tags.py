"""A VolumeAttributesClass's tag changes on an existing EBS volume (csi/backends/aws/mutable.py): set with
templates over the claim's names, removed by key, only what differs sent, nothing sent when a template
cannot be rendered; and at creation the class's tags are the volume's first."""

from __future__ import annotations

from typing import Any

import pytest

from csi import keys
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.failures import InvalidParameterError
from tests.aws.conftest import record_calls

CLAIM = {keys.PVC_NAMESPACE: "team-blue", keys.PVC_NAME: "db", keys.PV_NAME: "pvc-42"}


def _tags(ec2: Any, vid: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0].get("Tags", [])}


@pytest.fixture
def vid(backend: AwsBackend) -> str:
    parameters = backend.validate_parameters({"tagSpecification_1": "stage=dev", "tagSpecification_2": "x=1"})
    return backend.create_volume("pvc-42", DiskOptions(size_bytes=GiB, parameters=parameters)).id


def _modify(backend: AwsBackend, vid: str, given: dict[str, str], metadata: dict[str, str]) -> None:
    backend.modify_volume(vid, backend.validate_mutable_parameters(given), metadata=metadata)


def test_a_class_sets_and_removes_tags_and_a_repeat_sends_nothing(
    backend: AwsBackend, ec2: Any, vid: str
) -> None:
    vac = {
        "tagSpecification_1": "stage=prod",
        "tagSpecification_2": 'owner={{ .PVCNamespace | field "-" 1 }}/{{ .PVCName }}',
        "tagDeletion_1": "x",
        "tagDeletion_2": "never-there",
    }
    _modify(backend, vid, vac, CLAIM)
    tags = _tags(ec2, vid)
    assert (tags["stage"], tags["owner"]) == ("prod", "blue/db")
    assert "x" not in tags and tags["CSIVolumeName"] == "pvc-42"
    sent = record_calls(backend.ec2.client, "CreateTags") + record_calls(backend.ec2.client, "DeleteTags")
    _modify(backend, vid, vac, CLAIM)
    assert sent == [], "the volume already has the class's tags"
    assert ec2.describe_volumes_modifications(VolumeIds=[vid])["VolumesModifications"] == []


def test_only_the_tags_that_differ_are_sent(backend: AwsBackend, vid: str) -> None:
    created = record_calls(backend.ec2.client, "CreateTags")
    _modify(backend, vid, {"tagSpecification_1": "stage=dev", "tagSpecification_2": "new=1"}, {})
    assert [[t["Key"] for t in call["Tags"]] for call in created] == [["new"]]


def test_tags_and_settings_change_together(backend: AwsBackend, ec2: Any, vid: str) -> None:
    _modify(backend, vid, {"type": "gp3", "throughput": "200", "tagSpecification_1": "tier=fast"}, CLAIM)
    volume = ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0]
    assert (volume["Throughput"], _tags(ec2, vid)["tier"]) == (200, "fast")


def test_a_template_the_claim_cannot_render_changes_nothing(backend: AwsBackend, ec2: Any, vid: str) -> None:
    vac = {"type": "gp2", "tagSpecification_1": 'dept={{ .PVCName | field "-" 3 }}', "tagDeletion_1": "x"}
    with pytest.raises(InvalidParameterError, match="tagSpecification_1: field"):
        _modify(backend, vid, vac, CLAIM)
    assert _tags(ec2, vid)["x"] == "1"
    assert ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0]["VolumeType"] == "gp3"


def test_settings_the_volume_cannot_take_change_no_tag(backend: AwsBackend, ec2: Any, vid: str) -> None:
    with pytest.raises(InvalidParameterError, match="no provisioned IOPS"):
        _modify(backend, vid, {"type": "gp2", "iops": "4000", "tagDeletion_1": "x"}, CLAIM)
    assert _tags(ec2, vid)["x"] == "1"


def test_at_creation_a_classes_tags_are_the_volumes_and_its_deletions_are_moot(
    backend: AwsBackend, ec2: Any
) -> None:
    mutable = backend.validate_mutable_parameters(
        {"tagSpecification_1": "claim={{ .PVCName }}", "tagDeletion_1": "stage"}
    )
    options = DiskOptions(
        size_bytes=GiB, parameters=backend.validate_parameters({}), mutable_parameters=mutable, metadata=CLAIM
    )
    disk = backend.create_volume("pvc-7", options)
    tags = _tags(ec2, disk.id)
    assert tags["claim"] == "db" and not any(k.startswith("tagDeletion") for k in tags)
