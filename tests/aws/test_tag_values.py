"""tagSpecification_<n> values as Go templates (csi/backends/aws/tagvalues.py): rendered over the
claim's names in volume tags and the VolumeSnapshot's in snapshot tags, with the EBS CSI driver's
functions; anything else between {{ and }} refused naming the parameter, never written to a tag as
text."""

from __future__ import annotations

from typing import Any

import pytest

from csi import keys
from csi.backends.aws import AwsBackend
from csi.backends.aws import params as P
from csi.backends.aws.tagvalues import SNAPSHOT_FIELDS, VOLUME_FIELDS, parse
from csi.backends.base import DiskOptions, GiB
from csi.failures import InvalidParameterError

CLAIM = {keys.PVC_NAMESPACE: "ns-prod-abcdef", keys.PVC_NAME: "data", keys.PV_NAME: "pvc-1234"}
VOLUMESNAPSHOT = {
    keys.VOLUMESNAPSHOT_NAMESPACE: "shop",
    keys.VOLUMESNAPSHOT_NAME: "nightly",
    keys.VOLUMESNAPSHOT_CONTENT_NAME: "snapcontent-77",
}


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        pytest.param("{{ .PVCNamespace }}/{{ .PVCName }}", "ns-prod-abcdef/data", id="two-fields"),
        pytest.param("pv-{{.PVName}}", "pv-pvc-1234", id="no-spaces"),
        pytest.param("a  {{- .PVCName -}}  b", "adatab", id="trim-markers"),
        pytest.param("plain } and }} text", "plain } and }} text", id="no-action"),
        pytest.param('{{ .PVCNamespace | contains "prod" }}', "true", id="contains"),
        pytest.param('{{ .PVCName | contains "prod" }}', "false", id="contains-not"),
        pytest.param('{{ .PVCNamespace | field "-" 2 | toUpper }}', "ABCDEF", id="field-then-toUpper"),
        pytest.param('{{ toUpper (field "-" 1 .PVCNamespace) }}', "PROD", id="parenthesised"),
        pytest.param("{{ .PVCNamespace | substring 0 4 }}", "ns-p", id="substring"),
        pytest.param("{{ .PVCName | substring -1 2 }}", "da", id="substring-from-start"),
        pytest.param("{{ .PVCName | substring 1 99 }}", "ata", id="substring-to-end"),
        pytest.param('{{ index "-" .PVCNamespace }},{{ lastIndex "-" .PVCNamespace }}', "2,7", id="index"),
        pytest.param('{{ "MiXed" | toLower }}', "mixed", id="toLower-of-a-string"),
        pytest.param('{{ field "" 1 "héllo" }}', "é", id="field-of-empty-delim-splits-characters"),
        pytest.param('{{ "a\\x41\\u00e9\\t" }}{{ `r\\n` }}', "aAé\tr\\n", id="string-literals"),
        pytest.param("{{ 0x10 }} {{ 010 }} {{ -3 }} {{ true }}", "16 8 -3 true", id="constants"),
        pytest.param('{{ "}}" }}', "}}", id="close-inside-a-string"),
        pytest.param("x {{- /* note */ -}} y{{/* another */}}", "xy", id="comments"),
    ],
)
def test_templates_are_rendered_as_go_renders_them(value: str, rendered: str) -> None:
    assert parse("tagSpecification_1", value, VOLUME_FIELDS).render(CLAIM) == rendered


def test_a_field_the_sidecar_did_not_pass_is_empty() -> None:
    assert parse("tagSpecification_1", "[{{ .PVCName | toUpper }}]", VOLUME_FIELDS).render({}) == "[]"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param('{{ .PVCName | printf "%s" }}', "function 'printf' is not supported", id="go-builtin"),
        pytest.param("{{ .PVCName | html }}", "function 'html' is not supported", id="disabled-in-ebs"),
        pytest.param("{{ if .PVCName }}x{{ end }}", "no control actions", id="control-action"),
        pytest.param("{{ $x := 1 }}", "variables are not supported", id="variable"),
        pytest.param('{{ .PVCName | toUpper "x" }}', r"toUpper takes 1 argument\(s\), got 2", id="arity"),
        pytest.param('{{ field "-" "2" .PVCName }}', "argument 2 of field must be a number", id="type"),
        pytest.param(
            "{{ .PVCName | contains .PVName | toUpper }}",
            "must be a string, not a true/false",
            id="type-of-a-piped-value",
        ),
        pytest.param("{{ .PVCName | .PVName }}", "after '|' is not a function", id="operand-after-pipe"),
        pytest.param('{{ .PVCName "x" }}', "takes no arguments", id="argument-to-a-field"),
        pytest.param(
            "{{ .Namespace }}",
            r"no field \.Namespace; the fields here are \.PVCNamespace",
            id="unknown-field",
        ),
        pytest.param("{{ .VolumeSnapshotName }}", "no field", id="a-snapshot-field-in-a-volume-tag"),
        pytest.param("{{ .PVCName", "never closed", id="unclosed"),
        pytest.param("{{ (toUpper .PVCName }}", r"'\(' is never closed", id="unclosed-parenthesis"),
        pytest.param("{{ }}", "empty", id="empty-action"),
        pytest.param('{{ "\\q" }}', "escape Go does not know", id="bad-escape"),
        pytest.param("{{ .PVCName-}}", "needs a space before it", id="trim-without-space"),
        pytest.param("{{ 3.5 }}", "whole", id="fraction"),
        pytest.param("{{ /* note */ }}", "unexpected '/'", id="comment-not-at-the-brace"),
    ],
)
def test_what_go_would_refuse_or_this_subset_lacks_is_refused_naming_the_parameter(
    value: str, message: str
) -> None:
    with pytest.raises(InvalidParameterError, match=message) as raised:
        parse("tagSpecification_3", value, VOLUME_FIELDS).render(CLAIM)
    assert "tagSpecification_3" in str(raised.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param('{{ .PVCNamespace | field "-" 3 }}', "has 3 piece", id="field-past-the-last"),
        pytest.param('{{ .PVCNamespace | field "-" -1 }}', "has 3 piece", id="field-negative-not-the-last"),
        pytest.param("{{ .PVCName | substring 3 1 }}", "out of range", id="substring-reversed"),
        pytest.param('{{ "é" | substring 0 1 }}', "cuts a character", id="substring-inside-a-character"),
    ],
)
def test_what_only_the_data_makes_wrong_is_refused_when_rendered(value: str, message: str) -> None:
    P.validate({"tagSpecification_1": f"k={value}"})  # the class is fine: its claims may fit
    with pytest.raises(InvalidParameterError, match=message):
        parse("tagSpecification_1", value, VOLUME_FIELDS).render(CLAIM)


def test_a_storage_class_with_a_template_go_would_refuse_is_refused_when_validated() -> None:
    with pytest.raises(InvalidParameterError, match="tagSpecification_1"):
        P.validate({"tagSpecification_1": "owner={{ .PVCName | toUpper 1 }}"})


def _tags(record: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in record.get("Tags", [])}


def test_a_volume_is_tagged_with_its_claim(backend: AwsBackend, ec2: Any) -> None:
    parameters = backend.validate_parameters(
        {
            "tagSpecification_1": "owner={{ .PVCNamespace }}/{{ .PVCName }}",
            "tagSpecification_2": 'billing={{ .PVCNamespace | field "-" 2 | toUpper }}',
        }
    )
    disk = backend.create_volume(
        "pvc-1234", DiskOptions(size_bytes=GiB, parameters=parameters, metadata=CLAIM)
    )
    found = _tags(ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"][0])
    assert (found["owner"], found["billing"]) == ("ns-prod-abcdef/data", "ABCDEF")
    assert found["kubernetes.io/created-for/pvc/namespace"] == "ns-prod-abcdef"


def test_a_claim_its_template_cannot_render_makes_no_volume(backend: AwsBackend, ec2: Any) -> None:
    parameters = backend.validate_parameters({"tagSpecification_1": 'tier={{ .PVCName | field "-" 1 }}'})
    with pytest.raises(InvalidParameterError, match="tagSpecification_1: field"):
        backend.create_volume("pvc-x", DiskOptions(size_bytes=GiB, parameters=parameters, metadata=CLAIM))
    assert ec2.describe_volumes()["Volumes"] == []


def test_the_claims_tags_are_not_held_against_a_volume_made_without_them(backend: AwsBackend) -> None:
    """A create retried across an upgrade: the volume an older driver made lacks the created-for tags."""
    first = backend.create_volume(
        "pvc-9", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    )
    again = backend.create_volume(
        "pvc-9", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}), metadata=CLAIM)
    )
    assert again.id == first.id


@pytest.fixture
def disk_id(backend: AwsBackend) -> str:
    return backend.create_volume(
        "pvc-s", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    ).id


def test_a_snapshot_is_tagged_with_its_volumesnapshot(backend: AwsBackend, ec2: Any, disk_id: str) -> None:
    parameters = {
        "tagSpecification_1": "for={{ .VolumeSnapshotNamespace }}/{{ .VolumeSnapshotName }}",
        "TagSpecification_2": "content={{ .VolumeSnapshotContentName | toUpper }}",
    }
    snap = backend.create_snapshot("snapcontent-77", disk_id, parameters, metadata=VOLUMESNAPSHOT)
    found = _tags(ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0])
    assert (found["for"], found["content"]) == ("shop/nightly", "SNAPCONTENT-77")


def test_a_snapshot_without_the_sidecars_names_gets_empty_values(
    backend: AwsBackend, ec2: Any, disk_id: str
) -> None:
    snap = backend.create_snapshot(
        "snapcontent-1", disk_id, {"tagSpecification_1": "for={{ .VolumeSnapshotName }}"}
    )
    assert _tags(ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0])["for"] == ""


def test_a_snapshot_tag_with_a_claim_field_is_refused(backend: AwsBackend, ec2: Any, disk_id: str) -> None:
    with pytest.raises(InvalidParameterError, match=r"tagSpecification_1: there is no field \.PVCName"):
        backend.create_snapshot(
            "snapcontent-1", disk_id, {"TagSpecification_1": "for={{ .PVCName }}"}, metadata=VOLUMESNAPSHOT
        )
    assert ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"] == []


def test_the_fields_are_the_ebs_drivers() -> None:
    assert sorted(VOLUME_FIELDS) == ["PVCName", "PVCNamespace", "PVName"]
    assert sorted(SNAPSHOT_FIELDS) == [
        "VolumeSnapshotContentName",
        "VolumeSnapshotName",
        "VolumeSnapshotNamespace",
    ]
