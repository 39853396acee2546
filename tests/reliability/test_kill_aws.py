"""Kill the real driver (`--backend aws`, moto's EC2 server over HTTP) exactly at each aws crash point,
restart it, retry the request, and check that EC2 ends with the operation done exactly once: one volume
per name, one attachment per node, nothing left attached or undeleted.

moto finishes every state change at once, so the points between "EC2 accepted the request" and "EC2
reports it done" are reached with the request already applied; the retry must recognise it (by the
name tag and client token, by the attachment) rather than repeat it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.aws.clones import TAG_CLONE_SCRATCH
from tests.conformance.driver import Driver, start_driver
from tests.csiclient import CsiClient, connect
from tests.failpoint_names import in_code
from tests.motoserver import AMI, REGION, ZONE, running_moto
from tests.reliability.conftest import mount_cap, retry

pytestmark = pytest.mark.slow
GiB = 1024**3
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}


@dataclass
class Ec2World:
    """One moto server and its node instance, shared by the module's scenarios."""

    endpoint: str
    ec2: Any
    instance: str


@pytest.fixture(scope="module")
def moto() -> Iterator[Ec2World]:
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with running_moto() as endpoint:
            ec2 = boto3.session.Session().client("ec2", region_name=REGION, endpoint_url=endpoint)
            reservation = ec2.run_instances(
                ImageId=AMI,
                MinCount=1,
                MaxCount=1,
                InstanceType="m5.large",
                Placement={"AvailabilityZone": ZONE},
            )
            yield Ec2World(endpoint, ec2, reservation["Instances"][0]["InstanceId"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Run:
    """The driver processes of one scenario (all mode, aws backend) and what the scenario made."""

    moto: Ec2World
    workdir: Path
    name: str
    driver: Driver | None = None
    volume_id: str = ""
    source_id: str = ""  # the volume a clone scenario clones
    replies: list[Any] = field(default_factory=list)

    def start(self, failpoint: str = "") -> CsiClient:
        if self.driver is not None:
            self.driver.kill()
        env = {
            "BALLAST_FAILPOINTS": failpoint,
            "BALLAST_FAILPOINTS_RECORD": str(self.record),
        }
        self.driver = start_driver(
            self.workdir,
            "--backend", "aws",
            "--aws-endpoint-url", self.moto.endpoint,
            "--aws-region", REGION,
            "--zone", ZONE,
            node_id=self.moto.instance,
            env=env,
        )  # fmt: skip
        return connect(self.driver.endpoint)

    @property
    def record(self) -> Path:
        return self.workdir / "failpoints.record"

    def volumes(self) -> list[dict[str, Any]]:
        """The live EC2 volumes carrying this scenario's name tag."""
        found = self.moto.ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": [self.name]}])
        return [v for v in found["Volumes"] if v["State"] not in ("deleting", "deleted")]

    def scratch_snapshots(self) -> list[str]:
        """Snapshots tagged as the scratch of a clone named like this scenario (clones.py)."""
        found = self.moto.ec2.describe_snapshots(
            OwnerIds=["self"], Filters=[{"Name": f"tag:{TAG_CLONE_SCRATCH}", "Values": [self.name]}]
        )
        return [s["SnapshotId"] for s in found["Snapshots"]]

    def attachments(self) -> list[str]:
        (volume,) = self.moto.ec2.describe_volumes(VolumeIds=[self.volume_id])["Volumes"]
        return [a["InstanceId"] for a in volume.get("Attachments", []) if a.get("State") != "detached"]


def _create_req(r: Run) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=r.name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=GiB),
        volume_capabilities=[mount_cap()],
    )


def _clone_req(r: Run) -> csi_pb2.CreateVolumeRequest:
    request = _create_req(r)
    request.volume_content_source.volume.volume_id = r.source_id
    return request


def _publish_req(r: Run) -> csi_pb2.ControllerPublishVolumeRequest:
    return csi_pb2.ControllerPublishVolumeRequest(
        volume_id=r.volume_id, node_id=r.moto.instance, volume_capability=mount_cap()
    )


def _unpublish_req(r: Run) -> csi_pb2.ControllerUnpublishVolumeRequest:
    return csi_pb2.ControllerUnpublishVolumeRequest(volume_id=r.volume_id, node_id=r.moto.instance)


def _created(r: Run, c: CsiClient) -> None:
    r.volume_id = retry(c.controller.CreateVolume, _create_req(r)).volume.volume_id


def _source_created(r: Run, c: CsiClient) -> None:
    source = _create_req(r)
    source.name = f"{r.name}-source"
    r.source_id = retry(c.controller.CreateVolume, source).volume.volume_id


def _published(r: Run, c: CsiClient) -> None:
    _created(r, c)
    retry(c.controller.ControllerPublishVolume, _publish_req(r))


@dataclass(frozen=True)
class Scenario:
    prepare: Callable[[Run, CsiClient], None]
    service_method: str
    request: Callable[[Run], Any]
    check: Callable[[Run], None]


def _one_volume(r: Run) -> None:
    live = r.volumes()
    assert len(live) == 1, f"{len(live)} EC2 volumes named {r.name}"
    assert {reply.volume.volume_id for reply in r.replies} == {live[0]["VolumeId"]}
    assert live[0]["State"] == "available"
    r.volume_id = live[0]["VolumeId"]


def _cloned_without_scratch(r: Run) -> None:
    _one_volume(r)
    assert r.scratch_snapshots() == [], "the clone's scratch snapshot was left behind"


def _attached_once(r: Run) -> None:
    assert r.attachments() == [r.moto.instance]
    devices = {reply.publish_context["devicePath"] for reply in r.replies}
    assert len(devices) == 1, f"the retries answered different devices: {devices}"


def _detached(r: Run) -> None:
    assert r.attachments() == []


def _deleted(r: Run) -> None:
    assert r.volumes() == []
    r.volume_id = ""


CREATE = Scenario(lambda r, c: None, "CreateVolume", _create_req, _one_volume)
CLONE = Scenario(_source_created, "CreateVolume", _clone_req, _cloned_without_scratch)
ATTACH = Scenario(_created, "ControllerPublishVolume", _publish_req, _attached_once)
DETACH = Scenario(_published, "ControllerUnpublishVolume", _unpublish_req, _detached)
SCENARIOS = {
    "aws.create.requested": CREATE,
    "aws.create.available": CREATE,
    "aws.clone.snapshotted": CLONE,
    "aws.clone.restored": CLONE,
    "aws.attach.requested": ATTACH,
    "aws.attach.attached": ATTACH,
    "aws.detach.requested": DETACH,
    "aws.detach.detached": DETACH,
    "aws.delete.requested": Scenario(
        _created, "DeleteVolume", lambda r: csi_pb2.DeleteVolumeRequest(volume_id=r.volume_id), _deleted
    ),
}


def test_every_aws_failpoint_has_a_kill_scenario() -> None:
    assert {n for n in in_code() if n.startswith("aws.")} == set(SCENARIOS)


@pytest.mark.parametrize("step", list(SCENARIOS))
def test_killed_at_an_aws_step_then_restarted_the_retry_finishes_it_exactly_once(
    moto: Ec2World, tmp_path: Path, step: str
) -> None:
    scenario = SCENARIOS[step]
    r = Run(moto, tmp_path, name=f"pvc-{step.replace('.', '-')}")
    try:
        client = r.start()
        scenario.prepare(r, client)
        client.close()

        client = r.start(failpoint=step)
        assert r.driver is not None
        call = getattr(client.controller, scenario.service_method)
        with pytest.raises(grpc.RpcError) as cut:
            call(scenario.request(r), timeout=120)
        client.close()
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value.details()
        assert r.driver.proc.wait(10) == -signal.SIGKILL
        assert r.record.read_text().split() == [step, str(r.driver.proc.pid)]

        client = r.start()
        call = getattr(client.controller, scenario.service_method)
        r.replies = [retry(call, scenario.request(r)), retry(call, scenario.request(r))]
        scenario.check(r)
        if r.volume_id:  # take it down through the API
            retry(client.controller.ControllerUnpublishVolume, _unpublish_req(r))
            retry(client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=r.volume_id))
            assert r.volumes() == []
        if r.source_id:
            retry(client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=r.source_id))
        client.close()
    finally:
        if r.driver is not None:
            r.driver.stop()
