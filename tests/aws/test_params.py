"""EBS parameters, volume-type limits and handle normalisation (pure, no EC2)."""

from __future__ import annotations

import pytest

from csi.backends.aws import mutable
from csi.backends.aws import params as P
from csi.backends.aws.tagvalues import VOLUME_FIELDS
from csi.failures import InvalidParameterError, NotFoundError, OutOfRangeError


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({}, {"type": "gp3"}, id="gp3-default"),
        pytest.param({"type": "IO2", "iops": "5000"}, {"type": "io2", "iops": "5000"}, id="type-case"),
        pytest.param({"TYPE": "gp2"}, {"type": "gp2"}, id="key-case-insensitive"),
        pytest.param(
            {"type": "gp3", "iops": "4000", "throughput": "250"},
            {"type": "gp3", "iops": "4000", "throughput": "250"},
            id="gp3-iops-throughput",
        ),
        pytest.param(
            {"type": "io1", "iopsPerGB": "50", "allowautoiopspergbincrease": "true"},
            {"type": "io1", "iopsPerGB": "50", "allowAutoIOPSPerGBIncrease": "true"},
            id="in-tree-translation-spelling",
        ),
        pytest.param(
            {"encrypted": "True", "kmsKeyId": "arn:aws:kms:us-east-1:1:key/k"},
            {"type": "gp3", "encrypted": "true", "kmsKeyId": "arn:aws:kms:us-east-1:1:key/k"},
            id="encrypted-kms",
        ),
        pytest.param(
            {"tagSpecification_1": "team=storage", "tagSpecification_2": "empty="},
            {"type": "gp3", "tagSpecification_1": "team=storage", "tagSpecification_2": "empty="},
            id="tags",
        ),
        pytest.param({"fsType": "ext4"}, {"type": "gp3"}, id="legacy-fstype-dropped"),
        pytest.param({"blockSize": "4096"}, {"type": "gp3", "blockSize": "4096"}, id="format-key-passes"),
        pytest.param(
            {"csi.storage.k8s.io/pvc/name": "data"},
            {"type": "gp3", "csi.storage.k8s.io/pvc/name": "data"},
            id="k8s-key-passes",
        ),
        pytest.param({"type": "st1"}, {"type": "st1"}, id="st1"),
        pytest.param(
            {"kmsKeyId": "k"}, {"type": "gp3", "kmsKeyId": "k", "encrypted": "true"}, id="kms-encrypts"
        ),
        pytest.param({"type": "sc1"}, {"type": "sc1"}, id="sc1"),
        pytest.param({"type": "standard"}, {"type": "standard"}, id="standard"),
        pytest.param(
            {"VolumeInitializationRate": " 0200"},
            {"type": "gp3", "volumeInitializationRate": "200"},
            id="initialization-rate",
        ),
    ],
)
def test_validate_accepts(given: dict[str, str], expected: dict[str, str]) -> None:
    assert P.validate(given) == expected


@pytest.mark.parametrize(
    ("given", "names"),
    [
        pytest.param({"zone": "us-east-1a"}, "zone", id="unknown-key"),
        pytest.param({"type": "gp4"}, "type", id="unknown-type"),
        pytest.param({"iops": "3000", "iopsPerGB": "10"}, "mutually exclusive", id="iops-and-per-gb"),
        pytest.param({"type": "io2"}, "iops", id="io2-without-iops"),
        pytest.param({"iops": "lots"}, "iops", id="iops-not-a-number"),
        pytest.param({"throughput": "5000"}, "throughput", id="throughput-above-max"),
        pytest.param({"encrypted": "yes"}, "encrypted", id="bad-bool"),
        pytest.param({"kmsKeyId": "k", "encrypted": "false"}, "kmsKeyId", id="kms-but-not-encrypted"),
        pytest.param({"type": "st1", "iops": "lots"}, "iops", id="ignored-iops-still-a-number"),
        pytest.param({"tagSpecification_1": "novalue"}, "tagSpecification_1", id="tag-without-equals"),
        pytest.param({"tagSpecification_1": "aws:x=1"}, "reserved", id="tag-aws-prefix"),
        pytest.param({"tagSpecification_1": "CSIVolumeName=x"}, "reserved", id="tag-owned-by-driver"),
        pytest.param({"type": "gp3", "Type": "gp2"}, "twice", id="duplicate-key"),
        pytest.param({"volumeInitializationRate": "99"}, r"100\.\.300", id="initialization-rate-low"),
        pytest.param(
            {"volumeInitializationRate": "fast"}, "volumeInitializationRate", id="rate-not-a-number"
        ),
    ],
)
def test_validate_rejects_naming_the_problem(given: dict[str, str], names: str) -> None:
    with pytest.raises(InvalidParameterError, match=names):
        P.validate(given)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({"type": "io2", "iops": "3000"}, {"type": "io2", "iops": "3000"}, id="type-iops"),
        pytest.param({"Throughput": "300"}, {"throughput": "300"}, id="throughput"),
        pytest.param({"volumeType": "IO1", "iops": "100"}, {"type": "io1", "iops": "100"}, id="alias"),
        pytest.param({"type": "gp2", "volumetype": "io2"}, {"type": "gp2"}, id="type-wins-over-volumeType"),
        pytest.param(
            {"TagSpecification_1": "team = {{ .PVCNamespace }}", "tagdeletion_2": " old "},
            {"tagSpecification_1": "team = {{ .PVCNamespace }}", "tagDeletion_2": "old"},
            id="tag-changes",
        ),
    ],
)
def test_validate_mutable(given: dict[str, str], expected: dict[str, str]) -> None:
    assert mutable.validate(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        pytest.param({"encrypted": "true"}, id="immutable-key"),
        pytest.param({"type": "gp9"}, id="bad-type"),
        pytest.param({"iops": "-1"}, id="bad-iops"),
        pytest.param({"tagDeletion_1": " "}, id="deletion-of-no-key"),
        pytest.param({"tagDeletion_1": "CSIVolumeName"}, id="deletion-of-the-drivers-tag"),
        pytest.param({"tagDeletion_1": "aws:cloudformation:stack-id"}, id="deletion-of-an-aws-tag"),
        pytest.param({"tagSpecification_1": "a={{ .PVCName | printf }}"}, id="template-go-refuses"),
        pytest.param({"tagSpecification_1": "a=1", "tagDeletion_1": "a"}, id="set-and-deleted"),
        pytest.param({"tagDeletion_1": "a", "TagDeletion_1": "b"}, id="given-twice"),
        pytest.param({"volumeType": "gp9"}, id="bad-type-by-alias"),
        pytest.param({"volumeType": "gp2", "VolumeType": "io2"}, id="alias-given-twice"),
    ],
)
def test_validate_mutable_rejects(given: dict[str, str]) -> None:
    with pytest.raises(InvalidParameterError, match=r"tag|twice|gp9|iops|encrypted"):
        mutable.validate(given)


@pytest.mark.parametrize(
    ("handle", "expected"),
    [
        pytest.param("vol-0123456789abcdef0", "vol-0123456789abcdef0", id="plain"),
        pytest.param("aws://us-west-2a/vol-0123", "vol-0123", id="in-tree-with-zone"),
        pytest.param("aws:///vol-0123", "vol-0123", id="in-tree-without-zone"),
        pytest.param("aws://z/vol-%41bc", "vol-Abc", id="percent-decoded"),
    ],
)
def test_volume_handles_normalise(handle: str, expected: str) -> None:
    assert P.volume_id(handle) == expected


@pytest.mark.parametrize(
    "handle",
    [
        pytest.param("aws://vol-0123", id="id-in-host"),
        pytest.param("aws://us-west-2a/0123", id="no-vol-prefix"),
        pytest.param("some-id", id="foreign"),
        pytest.param("", id="empty"),
        pytest.param("vol-01/../x", id="path"),
    ],
)
def test_foreign_handles_are_not_found(handle: str) -> None:
    with pytest.raises(NotFoundError):
        P.volume_id(handle)


@pytest.mark.parametrize(
    ("params", "size", "expected"),
    [
        pytest.param({"type": "io1", "iopsPerGB": "10"}, 20, 200, id="per-gb"),
        pytest.param({"type": "io1", "iopsPerGB": "50"}, 2000, 64000, id="capped-at-type-max"),
        pytest.param(
            {"type": "io1", "iopsPerGB": "1", "allowAutoIOPSPerGBIncrease": "true"}, 10, 100, id="raised"
        ),
        pytest.param({"type": "gp3", "iops": "5000"}, 100, 5000, id="explicit"),
        pytest.param({"type": "gp3"}, 100, None, id="none"),
    ],
)
def test_provisioned_iops(params: dict[str, str], size: int, expected: int | None) -> None:
    assert P.provisioned_iops(params, size) == expected


def test_iops_below_minimum_without_auto_increase_is_rejected() -> None:
    with pytest.raises(InvalidParameterError, match="allowAutoIOPSPerGBIncrease"):
        P.provisioned_iops({"type": "io1", "iopsPerGB": "1"}, 10)


@pytest.mark.parametrize(
    ("kind", "size"),
    [
        pytest.param("st1", 100, id="st1-below-125"),
        pytest.param("standard", 2048, id="standard-above-1TiB"),
        pytest.param("io2", 2, id="io2-below-4"),
        pytest.param("gp3", 65537, id="gp3-above-64TiB"),
        pytest.param("gp2", 16385, id="gp2-above-16TiB"),
    ],
)
def test_size_outside_type_limits_is_out_of_range(kind: str, size: int) -> None:
    with pytest.raises(OutOfRangeError, match=kind):
        P.create_arguments({"type": kind, "iops": "100"} if kind == "io2" else {"type": kind}, size)


def test_gp3_takes_what_ebs_has_allowed_since_september_2025() -> None:
    """64 TiB, 80,000 IOPS, 2,000 MiB/s: a stale table would refuse the size and throughput, and cap
    the IOPS below what the user asked for without an error."""
    params = P.validate({"type": "gp3", "iops": "80000", "throughput": "2000"})
    assert P.create_arguments(params, 65536) == {
        "VolumeType": "gp3", "Size": 65536, "Iops": 80000, "Throughput": 2000
    }  # fmt: skip
    with pytest.raises(InvalidParameterError, match=r"125\.\.2000 MiB/s"):
        P.validate({"type": "gp3", "throughput": "2001"})


@pytest.mark.parametrize(
    ("size_bytes", "gib"),
    [
        pytest.param(1, 1, id="one-byte"),
        pytest.param(1024**3, 1, id="exact"),
        pytest.param(1024**3 + 1, 2, id="rounded-up"),
        pytest.param(0, 1, id="zero"),
    ],
)
def test_sizes_round_up_to_gib(size_bytes: int, gib: int) -> None:
    assert P.gib(size_bytes) == gib


def test_the_claim_gives_the_in_tree_era_tags() -> None:
    metadata = {"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pv/name": "pv-1"}
    assert P.created_for_tags(metadata) == {
        "kubernetes.io/created-for/pvc/name": "data",
        "kubernetes.io/created-for/pv/name": "pv-1",
    }
    assert P.spec_tags({"tagSpecification_1": "team = storage"}, VOLUME_FIELDS, metadata) == {
        "team": "storage"
    }


@pytest.mark.parametrize(
    ("given", "expected", "ignored"),
    [
        pytest.param({"type": "gp2", "iops": "3000"}, {"type": "gp2"}, "iops", id="iops-on-gp2"),
        pytest.param(
            {"type": "sc1", "iopsPerGB": "10"}, {"type": "sc1"}, "iopsPerGB", id="iops-per-gb-on-sc1"
        ),
        pytest.param(
            {"type": "gp2", "throughput": "200"}, {"type": "gp2"}, "throughput", id="throughput-on-gp2"
        ),
        pytest.param(
            {"type": "io1", "iops": "100", "throughput": "200"},
            {"type": "io1", "iops": "100"},
            "throughput",
            id="throughput-on-io1",
        ),
    ],
)
def test_what_the_ebs_driver_ignores_is_left_out_with_a_warning(
    given: dict[str, str], expected: dict[str, str], ignored: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The EBS CSI driver sends IOPS only for the types that provision them and a throughput only for
    gp3: its classes that name one elsewhere work here too, the setting left out and said so."""
    with caplog.at_level("WARNING", logger="ballast.aws"):
        assert P.validate(given) == expected
    assert [r.getMessage().split(" is ignored")[0] for r in caplog.records] == [f"parameter {ignored}"]
