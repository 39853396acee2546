"""Attachments under concurrency and EC2 refusals, against moto through tests/motoproxy.py: concurrent
publishes to one node never pass its attach limit (the attaches in flight in this process are counted),
yet attaches of different volumes still overlap at EC2; a DetachVolume that EC2 refuses fails at once
instead of being waited on, while the answers that mean "already detached" are no error."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.failures import DriverError, FailedPreconditionError, NotFoundError
from tests.motoproxy import MotoProxy
from tests.motoserver import make_client

ATTACH_DELAY = 0.5  # every AttachVolume is held this long: all racers count before any reaches EC2


def volume(backend: AwsBackend, name: str) -> str:
    return backend.create_volume(name, DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})).id


def outcome(call: Callable[[], object]) -> str:
    """ "ok", or the name of the driver error the call raised."""
    try:
        call()
    except DriverError as exc:
        return type(exc).__name__
    return "ok"


def on_instance(ec2: Any, instance: str) -> list[str]:
    """The volumes EC2 reports attached to the instance (its root excluded)."""
    (reservation,) = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
    (found,) = reservation["Instances"]
    root = found.get("RootDeviceName", "")
    return [m["Ebs"]["VolumeId"] for m in found.get("BlockDeviceMappings", []) if m["DeviceName"] != root]


def attached_to(ec2: Any, vid: str) -> list[str]:
    (found,) = ec2.describe_volumes(VolumeIds=[vid])["Volumes"]
    return [a["InstanceId"] for a in found.get("Attachments", []) if a.get("State") != "detached"]


# ---------------------------------------------------------------- the attach limit under concurrency


@pytest.mark.parametrize(
    ("limit", "attached", "racing", "winners"),
    [
        pytest.param(2, 1, 3, 1, id="limit-2-one-attached-three-racing-one-fits"),
        pytest.param(2, 0, 3, 2, id="limit-2-none-attached-three-racing-two-fit"),
        pytest.param(4, 0, 3, 3, id="limit-4-three-racing-all-fit-and-overlap"),
    ],
)
def test_concurrent_publishes_to_one_node_never_pass_its_attach_limit(
    make_backend: Callable[..., AwsBackend],
    proxy: MotoProxy,
    account: str,
    ec2: Any,
    instance: str,
    limit: int,
    attached: int,
    racing: int,
    winners: int,
) -> None:
    backend = make_backend(client=make_client(proxy.endpoint, account), max_volumes=limit)
    vols = [volume(backend, f"pvc-{i}") for i in range(attached + racing + 1)]
    before, racers, spare = vols[:attached], vols[attached:-1], vols[-1]
    for vid in before:
        backend.attach(vid, instance, False)
    proxy.delay("AttachVolume", ATTACH_DELAY)
    with ThreadPoolExecutor(racing) as pool:
        outcomes = list(pool.map(lambda v: outcome(lambda: backend.attach(v, instance, False)), racers))
    assert sorted(outcomes) == sorted(["ok"] * winners + ["LimitExceededError"] * (racing - winners))
    assert len(on_instance(ec2, instance)) == attached + winners
    assert proxy.peak["AttachVolume"] == winners, "the attaches that fit overlap at EC2"

    # every reservation was given back, a failed attach's too: one slot freed is one attach possible
    backend.detach(next(v for v, o in zip(racers, outcomes, strict=True) if o == "ok"), instance)
    proxy.fail("AttachVolume", "IncorrectInstanceState", times=1)
    assert outcome(lambda: backend.attach(spare, instance, False)) == "FailedPreconditionError"
    assert outcome(lambda: backend.attach(spare, instance, False)) == "ok"
    assert len(on_instance(ec2, instance)) == attached + winners


@pytest.mark.parametrize(
    ("limit", "second"),
    [
        pytest.param(2, "ok", id="limit-2-the-attach-in-flight-takes-one-slot-not-two"),
        pytest.param(1, "LimitExceededError", id="limit-1-it-takes-the-only-slot"),
    ],
)
def test_an_attach_in_flight_that_ec2_already_reports_is_counted_once(
    make_backend: Callable[..., AwsBackend], instance: str, limit: int, second: str
) -> None:
    """The first attach has reached EC2, which already lists it on the instance, and is still waiting
    for `attached` (its slot still held here) when a second publish to the node arrives: counted twice,
    the second would get RESOURCE_EXHAUSTED one slot early."""
    backend = make_backend(max_volumes=limit)
    first, other = volume(backend, "pvc-first"), volume(backend, "pvc-second")
    events = backend.ec2.client.meta.events
    outcomes: list[str] = []

    def meanwhile(**kwargs: Any) -> None:
        events.unregister("after-call.ec2.AttachVolume", meanwhile)  # the first AttachVolume only
        with ThreadPoolExecutor(1) as pool:
            outcomes.append(pool.submit(outcome, lambda: backend.attach(other, instance, False)).result())

    events.register("after-call.ec2.AttachVolume", meanwhile)
    backend.attach(first, instance, False)
    assert outcomes == [second]


# ---------------------------------------------------------------- DetachVolume answers


def detached_meanwhile(ec2: Any, vid: str, instance: str) -> None:
    ec2.detach_volume(VolumeId=vid, InstanceId=instance)


def deleted_meanwhile(ec2: Any, vid: str, instance: str) -> None:
    ec2.detach_volume(VolumeId=vid, InstanceId=instance)
    ec2.delete_volume(VolumeId=vid)


@pytest.mark.parametrize(
    ("code", "meanwhile", "error", "still_attached"),
    [
        pytest.param("UnauthorizedOperation", None, FailedPreconditionError, True, id="unauthorized-fails"),
        pytest.param("AuthFailure", None, FailedPreconditionError, True, id="auth-failure-fails"),
        pytest.param(
            "IncorrectInstanceState", None, FailedPreconditionError, True, id="instance-state-fails"
        ),
        pytest.param("OptInRequired", None, FailedPreconditionError, True, id="opt-in-required-fails"),
        pytest.param("IncorrectState", detached_meanwhile, None, False, id="incorrect-state-is-detached"),
        pytest.param(
            "InvalidAttachment.NotFound", detached_meanwhile, None, False, id="no-attachment-is-detached"
        ),
        pytest.param(
            "InvalidVolume.NotFound", deleted_meanwhile, NotFoundError, False, id="no-volume-is-not-found"
        ),
    ],
)
def test_detach_volume_answers(
    slow: AwsBackend,
    proxy: MotoProxy,
    ec2: Any,
    instance: str,
    code: str,
    meanwhile: Callable[[Any, str, str], None] | None,
    error: type[Exception] | None,
    still_attached: bool,
) -> None:
    """A refusal is raised at once (no wait for a detach EC2 never started) and the volume stays
    attached; the answers that mean the attachment is gone (what happened meanwhile, behind the
    driver's back) end the unpublish, like the AWS EBS CSI driver's DetachDisk."""
    vid = volume(slow, "pvc-detach")
    slow.attach(vid, instance, False)
    if meanwhile is not None:
        hook = meanwhile
        slow.ec2.client.meta.events.register(
            "before-call.ec2.DetachVolume", lambda **_: hook(ec2, vid, instance)
        )
    proxy.reset()
    proxy.fail("DetachVolume", code, times=1)
    if error is None:
        slow.detach(vid, instance)
    else:
        with pytest.raises(error):
            slow.detach(vid, instance)
    if still_attached:
        assert proxy.calls["DescribeVolumes"] == 1, "it waited for a detach that EC2 refused"
        assert attached_to(ec2, vid) == [instance]
        slow.detach(vid, instance)  # the CO's retry
    if error is not NotFoundError:
        assert attached_to(ec2, vid) == []
