"""The moto proxy really makes moto slow and busy: held states, injected errors, canned answers, counts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import ZONE, make_client, run_instance


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[MotoProxy]:
    with running_proxy(moto_endpoint) as served:
        yield served


@pytest.fixture
def ec2(proxy: MotoProxy, account: str) -> Any:
    return make_client(proxy.endpoint, account)


def _volume(ec2: Any, volume_id: str) -> dict[str, Any]:
    (volume,) = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    return dict(volume)


def test_new_volume_reads_creating_for_the_held_polls(proxy: MotoProxy, ec2: Any) -> None:
    proxy.hold("creating", 2)
    volume_id = ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"]
    states = [_volume(ec2, volume_id)["State"] for _ in range(3)]
    assert states == ["creating", "creating", "available"]
    assert proxy.calls["DescribeVolumes"] == 3
    assert proxy.calls["CreateVolume"] == 1


def test_attach_and_detach_are_held(proxy: MotoProxy, ec2: Any) -> None:
    instance = run_instance(ec2)
    volume_id = ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"]
    proxy.hold("attaching", 1)
    proxy.hold("detaching", 1)
    ec2.attach_volume(VolumeId=volume_id, InstanceId=instance, Device="/dev/sdf")
    seen = [_volume(ec2, volume_id)["Attachments"][0]["State"] for _ in range(2)]
    assert seen == ["attaching", "attached"]

    ec2.detach_volume(VolumeId=volume_id, InstanceId=instance)
    held = _volume(ec2, volume_id)
    assert held["State"] == "in-use"
    assert held["Attachments"] == [
        {"VolumeId": volume_id, "InstanceId": instance, "Device": "/dev/sdf", "State": "detaching"}
    ]
    after = _volume(ec2, volume_id)
    assert (after["State"], after["Attachments"]) == ("available", [])


def test_modification_reads_optimizing(proxy: MotoProxy, ec2: Any) -> None:
    volume_id = ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"]
    proxy.hold("optimizing", 1)
    ec2.modify_volume(VolumeId=volume_id, Size=2)

    def state() -> str:
        mods = ec2.describe_volumes_modifications(VolumeIds=[volume_id])["VolumesModifications"]
        return str(mods[0]["ModificationState"])

    assert state() == "optimizing"
    assert state() != "optimizing"


def test_errors_for_a_number_of_calls(proxy: MotoProxy, ec2: Any) -> None:
    proxy.fail("DescribeVolumes", "RequestLimitExceeded", times=2)
    codes = []
    for _ in range(2):
        with pytest.raises(ClientError) as raised:
            ec2.describe_volumes()
        codes.append(
            (
                raised.value.response["Error"]["Code"],
                raised.value.response["ResponseMetadata"]["HTTPStatusCode"],
            )
        )
    assert codes == [("RequestLimitExceeded", 503)] * 2
    assert ec2.describe_volumes()["Volumes"] == []
    ec2.describe_availability_zones()  # another action is never refused
    assert (proxy.calls["DescribeVolumes"], proxy.refused["DescribeVolumes"]) == (3, 2)


def test_error_rate_is_repeatable_for_a_seed(moto_endpoint: str, account: str) -> None:
    def refusals() -> list[bool]:
        with running_proxy(moto_endpoint, seed=7) as proxy:
            proxy.fail("*", "RequestLimitExceeded", rate=0.3)
            client = make_client(proxy.endpoint, account)
            out = []
            for _ in range(60):
                try:
                    client.describe_volumes()
                    out.append(False)
                except ClientError:
                    out.append(True)
            assert proxy.refused["DescribeVolumes"] == sum(out)
            return out

    first = refusals()
    assert 5 <= sum(first) <= 35
    assert refusals() == first


def test_canned_answer_for_an_action_moto_lacks(proxy: MotoProxy, ec2: Any) -> None:
    proxy.answer(
        "DescribeVolumeStatus",
        '<DescribeVolumeStatusResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<volumeStatusSet><item><volumeId>vol-1</volumeId><availabilityZone>us-east-1a</availabilityZone>"
        "<volumeStatus><status>impaired</status><details><item><name>io-enabled</name>"
        "<status>failed</status></item></details></volumeStatus></item></volumeStatusSet>"
        "</DescribeVolumeStatusResponse>",
    )
    (status,) = ec2.describe_volume_status(VolumeIds=["vol-1"])["VolumeStatuses"]
    assert status["VolumeStatus"]["Status"] == "impaired"
    assert status["VolumeStatus"]["Details"] == [{"Name": "io-enabled", "Status": "failed"}]


def test_a_repeated_client_token_answers_the_first_volume(proxy: MotoProxy, ec2: Any) -> None:
    """As EC2 does (moto ignores ClientToken), and for concurrent calls too."""
    answers: list[str] = []

    def create() -> None:
        answers.append(ec2.create_volume(Size=1, AvailabilityZone=ZONE, ClientToken="same")["VolumeId"])

    threads = [threading.Thread(target=create) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other = ec2.create_volume(Size=1, AvailabilityZone=ZONE, ClientToken="other")["VolumeId"]
    assert len(answers) == 3 and len(set(answers)) == 1 and other not in answers
    assert len(ec2.describe_volumes()["Volumes"]) == 2


def test_describe_volumes_pages_by_max_results(proxy: MotoProxy, ec2: Any) -> None:
    made = {ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"] for _ in range(7)}
    first = ec2.describe_volumes(MaxResults=5)
    assert len(first["Volumes"]) == 5 and first["NextToken"]
    second = ec2.describe_volumes(MaxResults=5, NextToken=first["NextToken"])
    assert len(second["Volumes"]) == 2 and "NextToken" not in second
    assert {v["VolumeId"] for v in first["Volumes"] + second["Volumes"]} == made


def test_a_delayed_action_waits(proxy: MotoProxy, ec2: Any) -> None:
    proxy.delay("DescribeVolumes", 0.3)
    start = time.monotonic()
    ec2.describe_volumes()
    assert time.monotonic() - start >= 0.3
