"""Placeholders in tagSpecification_<n> values (csi/backends/aws/tagvalues.py): in volume tags filled from
the claim metadata the provisioner passes, and anything else between {{ and }} -- every action in a
snapshot tag -- refused, never written to a tag as text."""

from __future__ import annotations

from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws import params as P
from csi.backends.aws.tagvalues import NO_FIELDS, VOLUME_FIELDS, interpolate
from csi.backends.base import DiskOptions, GiB
from csi.failures import InvalidParameterError

CLAIM = {
    "csi.storage.k8s.io/pvc/namespace": "shop",
    "csi.storage.k8s.io/pvc/name": "data",
    "csi.storage.k8s.io/pv/name": "pvc-1234",
}


@pytest.mark.parametrize(
    ("value", "params", "rendered"),
    [
        pytest.param("{{ .PVCNamespace }}/{{ .PVCName }}", CLAIM, "shop/data", id="two-placeholders"),
        pytest.param("pv-{{.PVName}}", CLAIM, "pv-pvc-1234", id="no-spaces"),
        pytest.param("a  {{- .PVCName -}}  b", CLAIM, "adatab", id="trim-markers"),
        pytest.param("{{ .PVCName }}", {}, "", id="metadata-not-passed-is-empty"),
        pytest.param("plain } and }} text", CLAIM, "plain } and }} text", id="no-action"),
    ],
)
def test_placeholders_are_filled(value: str, params: dict[str, str], rendered: str) -> None:
    assert interpolate("tagSpecification_1", value, VOLUME_FIELDS, params) == rendered


@pytest.mark.parametrize(
    ("value", "fields", "message"),
    [
        pytest.param("{{ .PVCName | toUpper }}", VOLUME_FIELDS, "no functions", id="pipeline"),
        pytest.param('{{ field "-" 2 .PVCName }}', VOLUME_FIELDS, "not supported", id="function"),
        pytest.param("{{ .Namespace }}", VOLUME_FIELDS, r"\{\{ \.PVCName \}\}", id="unknown-field"),
        pytest.param("{{ .PVCName }", VOLUME_FIELDS, "never closed", id="unclosed"),
        pytest.param("a {{-.PVCName}}", VOLUME_FIELDS, "not supported", id="minus-without-space-no-trim"),
        pytest.param("{{ .PVCName }}", NO_FIELDS, "takes none", id="where-there-are-none"),
    ],
)
def test_other_actions_are_refused_naming_the_parameter(
    value: str, fields: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidParameterError, match=message) as raised:
        interpolate("tagSpecification_3", value, fields, CLAIM)
    assert "tagSpecification_3" in str(raised.value)


def test_a_storage_class_with_an_unsupported_action_is_refused_when_validated() -> None:
    with pytest.raises(InvalidParameterError, match="tagSpecification_1"):
        P.validate({"tagSpecification_1": "owner={{ .PVCName | toUpper }}"})


def test_a_volume_is_tagged_with_its_claim(backend: AwsBackend, ec2: Any) -> None:
    parameters = backend.validate_parameters(
        {"tagSpecification_1": "owner={{ .PVCNamespace }}/{{ .PVCName }}"}
    )
    options = DiskOptions(size_bytes=GiB, parameters=parameters, metadata=CLAIM)
    disk = backend.create_volume("pvc-1234", options)
    found = {t["Key"]: t["Value"] for t in ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"][0]["Tags"]}
    assert found["owner"] == "shop/data"
    assert found["kubernetes.io/created-for/pvc/namespace"] == "shop"


def test_the_claims_tags_are_not_held_against_a_volume_made_without_them(backend: AwsBackend) -> None:
    """A create retried across an upgrade: the volume an older driver made lacks the created-for tags."""
    first = backend.create_volume(
        "pvc-9", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    )
    again = backend.create_volume(
        "pvc-9", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}), metadata=CLAIM)
    )
    assert again.id == first.id


def test_a_snapshot_tag_with_a_placeholder_is_refused(backend: AwsBackend, ec2: Any) -> None:
    disk = backend.create_volume(
        "pvc-s", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    )
    with pytest.raises(InvalidParameterError, match=r"(?i)tagSpecification_1"):
        backend.create_snapshot(
            "snapcontent-1", disk.id, {"TagSpecification_1": "for={{ .VolumeSnapshotName }}"}
        )
    assert ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"] == []
