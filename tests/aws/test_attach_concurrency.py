"""Attachments under EC2 refusals, against moto through tests/motoproxy.py: a DetachVolume that EC2
refuses fails at once instead of being waited on, while the answers that mean "already detached" are no
error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.failures import FailedPreconditionError, NotFoundError
from tests.motoproxy import MotoProxy


def volume(backend: AwsBackend, name: str) -> str:
    return backend.create_volume(name, DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})).id


def attached_to(ec2: Any, vid: str) -> list[str]:
    (found,) = ec2.describe_volumes(VolumeIds=[vid])["Volumes"]
    return [a["InstanceId"] for a in found.get("Attachments", []) if a.get("State") != "detached"]


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
