"""csi-sanity against the real driver with `--backend aws`, pointed at moto's EC2 server over HTTP.

There is no instance metadata here, so the node id (a moto instance), the zone and the region come from
flags. Controller and identity specs run; node specs need real EBS devices and are covered by
tests/aws/test_devices.py on a fake device tree. Specs not run are listed in conftest.SKIPPED_SPECS.
moto lacks DescribeVolumeStatus, which the volume health specs reach: the driver talks to moto through
the moto proxy, which answers it with EC2's answer for volumes without status events (an empty set).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.conformance.conftest import run_sanity, write_yaml_map
from tests.conformance.driver import running_driver
from tests.conftest import require_tool
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import running_moto

pytestmark = pytest.mark.slow

REGION = "us-east-1"
ZONE = "us-east-1a"
CONTROLLER_FOCUS = (r"\[Controller Server\]", r"Identity Service")
MUTABLE_PARAMETERS = {"iops": "4000", "throughput": "250"}
MAX_VOLUMES_PER_NODE = "3"
# Specs that cannot apply to EBS, beyond conftest.SKIPPED_SPECS: regex -> reason.
AWS_SKIPPED_SPECS = {
    r"GetCapacity": (
        "EBS has no capacity pool to report, so GET_CAPACITY is not advertised (nor by the AWS EBS driver)"
    ),
}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture
def moto_ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private moto server (its own state) for one sanity run; the driver inherits the env."""
    for name, value in {
        **CREDENTIALS,
        "AWS_EC2_METADATA_DISABLED": "true",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    with running_moto() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EBS", endpoint)  # the EBS direct API client of the driver
        yield endpoint


NO_STATUS_EVENTS = (
    '<DescribeVolumeStatusResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>motoproxy</requestId><volumeStatusSet/></DescribeVolumeStatusResponse>"
)


@pytest.fixture
def proxy(moto_ec2: str) -> Iterator[MotoProxy]:
    """The driver's EC2 endpoint: moto behind the proxy that answers DescribeVolumeStatus."""
    with running_proxy(moto_ec2) as proxy:
        proxy.answer("DescribeVolumeStatus", NO_STATUS_EVENTS)
        yield proxy


def test_controller_and_identity_specs_against_moto(
    sanity_dir: Path, moto_ec2: str, proxy: MotoProxy
) -> None:
    require_tool("csi-sanity")
    ec2 = boto3.session.Session().client("ec2", region_name=REGION, endpoint_url=moto_ec2)
    node = ec2.run_instances(
        ImageId="ami-03cf127a",
        MinCount=1,
        MaxCount=1,
        InstanceType="m5.large",
        Placement={"AvailabilityZone": ZONE},
    )["Instances"][0]["InstanceId"]
    mutable = write_yaml_map(sanity_dir / "mutable.yaml", MUTABLE_PARAMETERS)
    args = (
        "--backend", "aws",
        "--aws-endpoint-url", proxy.endpoint,
        "--aws-region", REGION,
        "--zone", ZONE,
        "--max-volumes-per-node", MAX_VOLUMES_PER_NODE,
    )  # fmt: skip
    with running_driver(sanity_dir, *args, node_id=node) as driver:
        result = run_sanity(
            driver,
            sanity_dir,
            focus=CONTROLLER_FOCUS,
            skip=tuple(AWS_SKIPPED_SPECS),
            flags=[f"-csi.testvolumemutableparameters={mutable}", "-csi.testnodevolumeattachlimit"],
        )
    assert result.passed, f"no spec ran:\n{result.output[-4000:]}"
    assert not result.failed, result.summary() + "\n" + driver.log.read_text()[-3000:]
    assert not result.self_skipped(), "specs skipped themselves:\n" + "\n".join(
        f"{k}: {v}" for k, v in result.self_skipped().items()
    )
    assert result.returncode == 0, result.output[-4000:]
    print(result.summary().splitlines()[0])
    ran = "\n".join(result.passed)
    for feature in (
        "ModifyVolume",
        "CreateSnapshot",
        "ExpandVolume",
        "ListVolumes",
        "ControllerPublishVolume",
        "ControllerGetVolumeHealth",
        "ControllerListVolumeHealth",
    ):
        assert feature in ran, f"no {feature} spec passed; is the capability advertised?"
    left = ec2.describe_volumes(Filters=[{"Name": "tag-key", "Values": ["CSIVolumeName"]}])["Volumes"]
    assert left == [], f"sanity left volumes behind: {[v['VolumeId'] for v in left]}"
    assert driver.proc.returncode == 0, f"driver did not stop cleanly:\n{driver.log.read_text()[-4000:]}"
    assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
    assert proxy.calls["DescribeVolumeStatus"] >= 2, "the health specs reached EBS status checks"
