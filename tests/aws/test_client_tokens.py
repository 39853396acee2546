"""Burned client tokens, through the moto proxy's injected EC2 errors. EC2 keeps the token of a volume
that failed to create for hours and answers it with IdempotentParameterMismatch; like the EBS CSI
driver, CreateVolume then moves on to the next token derived from the name, unless a live volume has
the name: that volume answers (ALREADY_EXISTS when made with other arguments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.volumes import MAX_CLIENT_TOKENS, client_token
from csi.backends.base import ContentSource, DiskOptions, SourceKind
from csi.errors import status_for
from csi.failures import AlreadyExistsError, TransientError
from tests.aws.conftest import _Http, inject_responses, record_calls
from tests.aws.test_volumes import opts
from tests.motoproxy import MotoProxy

MISMATCH = "IdempotentParameterMismatch"


def named(ec2: Any, name: str) -> list[str]:
    found = ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": [name]}])["Volumes"]
    return [v["VolumeId"] for v in found]


def tokens_of(calls: list[dict[str, Any]]) -> list[str]:
    return [c["ClientToken"] for c in calls]


def empty(backend: AwsBackend) -> DiskOptions:
    return opts(backend, 2)


def restored(backend: AwsBackend) -> DiskOptions:
    source = backend.create_volume("pvc-source", opts(backend, 2))
    snap = backend.create_snapshot("snap-source", source.id, {})
    return opts(backend, 2, source=ContentSource(SourceKind.SNAPSHOT, snap.id))


def cloned(backend: AwsBackend) -> DiskOptions:
    source = backend.create_volume("pvc-source", opts(backend, 2))
    return opts(backend, 2, source=ContentSource(SourceKind.VOLUME, source.id))


@pytest.mark.parametrize("burned", [1, 3], ids=["one-burned", "three-burned"])
@pytest.mark.parametrize("make_options", [empty, restored, cloned], ids=["empty", "restore", "clone"])
def test_a_burned_token_without_a_live_volume_moves_on_to_the_next(
    slow: AwsBackend,
    proxy: MotoProxy,
    ec2: Any,
    make_options: Callable[[AwsBackend], DiskOptions],
    burned: int,
) -> None:
    options = make_options(slow)
    calls = record_calls(slow.ec2.client, "CreateVolume")
    proxy.fail("CreateVolume", MISMATCH, times=burned)
    disk = slow.create_volume("pvc-burned", options)
    assert tokens_of(calls) == [client_token("pvc-burned", n) for n in range(burned + 1)]
    assert named(ec2, "pvc-burned") == [disk.id]


@pytest.mark.parametrize(
    ("theirs", "problem"),
    [
        pytest.param({}, None, id="same-arguments-answer"),
        pytest.param({"parameters": {"type": "gp2"}}, "type gp2", id="other-arguments-already-exist"),
        pytest.param({"parameters": {"iops": "4000"}}, "iops 4000", id="other-iops-already-exist"),
    ],
)
def test_a_mismatch_while_a_live_volume_has_the_name_is_answered_by_that_volume(
    make_backend: Callable[..., AwsBackend],
    slow: AwsBackend,
    proxy: MotoProxy,
    ec2: Any,
    theirs: dict[str, Any],
    problem: str | None,
) -> None:
    """Another controller made the volume after this one's name lookup (answered empty here) and before
    its CreateVolume, which EC2 refuses: the token is not burned, and no second volume is made."""
    other = make_backend().create_volume("pvc-race", opts(slow, 10, **theirs))
    calls = record_calls(slow.ec2.client, "CreateVolume")
    inject_responses(slow.ec2.client, "DescribeVolumes", [{"Volumes": []}])
    proxy.fail("CreateVolume", MISMATCH, times=1)
    if problem is None:
        assert slow.create_volume("pvc-race", opts(slow, 10)).id == other.id
    else:
        with pytest.raises(AlreadyExistsError, match=f"{other.id} with different {problem}"):
            slow.create_volume("pvc-race", opts(slow, 10))
    assert tokens_of(calls) == [client_token("pvc-race")]
    assert named(ec2, "pvc-race") == [other.id]


def test_when_every_token_is_burned_the_answer_is_unavailable(
    slow: AwsBackend, proxy: MotoProxy, ec2: Any
) -> None:
    proxy.fail("CreateVolume", MISMATCH, times=MAX_CLIENT_TOKENS)
    with pytest.raises(TransientError, match="burned") as raised:
        slow.create_volume("pvc-stuck", opts(slow, 2))
    assert status_for(raised.value)[0] is grpc.StatusCode.UNAVAILABLE
    assert named(ec2, "pvc-stuck") == []
    assert slow.create_volume("pvc-stuck", opts(slow, 2)).name == "pvc-stuck"


def unlisted_once(client: Any) -> list[str]:
    """The first DescribeVolumes that names one volume by id answers as EC2 may right after creating it:
    InvalidVolume.NotFound (by id), or no volume (by a volume-id filter, as the batched lookup asks)."""
    fired: list[str] = []

    def hook(params: dict[str, Any], **kwargs: Any) -> Any:
        body = params.get("body") or {}
        if fired:
            return None
        if "VolumeId.1" in body:
            fired.append("by-id")
            error = {
                "Code": "InvalidVolume.NotFound",
                "Message": f"The volume '{body['VolumeId.1']}' does not exist.",
            }
            return _Http(400), {"Error": error, "ResponseMetadata": {}}
        if body.get("Filter.1.Name") == "volume-id":
            fired.append("by-filter")
            return _Http(200), {"Volumes": [], "ResponseMetadata": {}}
        return None

    client.meta.events.register("before-call.ec2.DescribeVolumes", hook)
    return fired


@pytest.mark.parametrize("batch_window", [0.0, 0.05], ids=["by-id", "batched"])
def test_a_new_volume_ec2_does_not_list_yet_is_waited_for_not_made_again(
    make_backend: Callable[..., AwsBackend], ec2: Any, batch_window: float
) -> None:
    """EC2's API is eventually consistent: a volume it has just created may not be listed for a moment.
    That is no burned token: taken for one, a second volume was made under the next token and a retry
    was answered with the other volume."""
    backend = make_backend(describe_batch_window=batch_window)
    calls = record_calls(backend.ec2.client, "CreateVolume")
    unlisted = unlisted_once(backend.ec2.client)
    disk = backend.create_volume("pvc-lag", empty(backend))
    assert unlisted, "the lag was never seen"
    assert tokens_of(calls) == [client_token("pvc-lag", 0)]
    assert named(ec2, "pvc-lag") == [disk.id]
    assert backend.create_volume("pvc-lag", empty(backend)).id == disk.id
