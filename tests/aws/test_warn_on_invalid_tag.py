"""--aws-warn-on-invalid-tag (the EBS CSI driver's --warn-on-invalid-tag): a class's tagSpecification_<n>
whose key is reserved or whose template cannot be rendered is left off with a warning naming the
parameter, and the volume, snapshot or tag change goes ahead without it; without the flag each is
INVALID_ARGUMENT before anything is made. A value without `key=` is refused either way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from csi import keys
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.failures import InvalidParameterError

CLAIM = {keys.PVC_NAMESPACE: "shop", keys.PVC_NAME: "data", keys.PV_NAME: "pvc-1"}
GOOD = {"tagSpecification_1": "team=storage"}

BAD_TAGS = [
    pytest.param("CSIVolumeName=x", "reserved", id="reserved-key"),
    pytest.param("aws:owner=x", "reserved", id="aws-key"),
    pytest.param("o={{ .Namespace }}", "no field", id="unknown-field"),
    pytest.param("o={{ printf .PVCName }}", "not supported", id="go-function"),
    pytest.param('o={{ .PVCName | field "-" 3 }}', "piece", id="render-fails-for-this-claim"),
]


def _tags(record: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in record.get("Tags", [])}


@pytest.fixture
def lenient(make_backend: Callable[..., AwsBackend]) -> AwsBackend:
    return make_backend(warn_on_invalid_tag=True)


def _create(backend: AwsBackend, bad: str) -> str:
    parameters = backend.validate_parameters({**GOOD, "tagSpecification_2": bad})
    return backend.create_volume(
        "pvc-1", DiskOptions(size_bytes=GiB, parameters=parameters, metadata=CLAIM)
    ).id


@pytest.mark.parametrize(("bad", "why"), BAD_TAGS)
def test_strict_refuses_and_makes_nothing(backend: AwsBackend, ec2: Any, bad: str, why: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"tagSpecification_2: .*{why}"):
        _create(backend, bad)
    assert ec2.describe_volumes()["Volumes"] == []


@pytest.mark.parametrize(("bad", "why"), BAD_TAGS)
def test_lenient_leaves_the_tag_off_and_warns(
    lenient: AwsBackend, ec2: Any, caplog: pytest.LogCaptureFixture, bad: str, why: str
) -> None:
    vid = _create(lenient, bad)
    tags = _tags(ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0])
    assert tags["team"] == "storage"
    assert "o" not in tags and "aws:owner" not in tags
    assert tags["CSIVolumeName"] == "pvc-1"  # the driver's own, not the class's "x"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "tagSpecification_2" in warnings[0] and why in warnings[0]


def test_a_retry_with_a_left_off_tag_is_the_same_volume(lenient: AwsBackend) -> None:
    bad = 'o={{ .PVCName | toUpper | field "-" 3 }}'
    assert _create(lenient, bad) == _create(lenient, bad)


@pytest.mark.parametrize("warn", [False, True], ids=["strict", "lenient"])
def test_a_value_without_key_is_refused_either_way(
    make_backend: Callable[..., AwsBackend], warn: bool
) -> None:
    backend = make_backend(warn_on_invalid_tag=warn)
    with pytest.raises(InvalidParameterError, match="tagSpecification_2: expected key=value"):
        backend.validate_parameters({**GOOD, "tagSpecification_2": "just-a-value"})


def test_lenient_snapshot_leaves_the_tag_off(lenient: AwsBackend, ec2: Any) -> None:
    vid = _create(lenient, "ok=1")
    parameters = {"tagSpecification_1": "for={{ .PVCName }}", "tagSpecification_2": "kept=yes"}
    snap = lenient.create_snapshot("snapcontent-1", vid, parameters)
    tags = _tags(ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0])
    assert tags["kept"] == "yes" and "for" not in tags


def test_lenient_class_change_applies_the_rest(lenient: AwsBackend, ec2: Any) -> None:
    vid = _create(lenient, "stage=dev")
    given = {
        "tagSpecification_1": "stage=prod",
        "tagSpecification_2": "o={{ .Nope }}",
        "tagDeletion_1": "team",
    }
    lenient.modify_volume(vid, lenient.validate_mutable_parameters(given), metadata=CLAIM)
    tags = _tags(ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0])
    assert tags["stage"] == "prod" and "o" not in tags and "team" not in tags


def test_strict_class_change_is_refused(backend: AwsBackend) -> None:
    with pytest.raises(InvalidParameterError, match="tagSpecification_2"):
        backend.validate_mutable_parameters({"tagSpecification_2": "o={{ .Nope }}"})
