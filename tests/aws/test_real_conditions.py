"""The aws backend against EC2 as it behaves, not as moto does: through tests/motoproxy.py, volumes stay
`creating`, attachments `attaching`/`detaching` and modifications `optimizing` for several polls, calls
are throttled, DescribeVolumes answers in pages, and a repeated client token returns the first volume.

Checked: every waiter waits the states out (and gives up as UNAVAILABLE after its timeout, leaving a
retry to find the same volume); throttling is retried with capped backoff, counted, and exported as
ballast_backend_retries_total; listings follow NextToken with MaxResults; two driver processes racing
CreateVolume for one name end with one EC2 volume.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from csi import failures
from csi._proto import csi_pb2
from csi.backends import base
from csi.backends.aws import AwsBackend
from csi.backends.aws.ec2 import Backoff
from csi.config import parse_args
from csi.server import Driver
from tests.conformance.driver import start_driver
from tests.csiclient import connect
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import REGION, ZONE, make_client, run_instance

GiB = base.GiB
DEFAULT_ACCOUNT = "123456789012"  # what a driver process without the account header talks to
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)


def opts(size_gib: int = 1) -> base.DiskOptions:
    return base.DiskOptions(size_bytes=size_gib * GiB, parameters={"type": "gp3"})


def named(ec2: Any, name: str) -> list[dict[str, Any]]:
    found = ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": [name]}])["Volumes"]
    return [v for v in found if v["State"] not in ("deleting", "deleted")]


# ---------------------------------------------------------------------------- waiters


def test_create_waits_while_the_volume_is_creating(slow: AwsBackend, proxy: MotoProxy, ec2: Any) -> None:
    proxy.hold("creating", 4)
    disk = slow.create_volume("pvc-creating", opts())
    assert [v["VolumeId"] for v in named(ec2, "pvc-creating")] == [disk.id]
    # one lookup by name, four polls reading `creating`, one reading `available`
    assert proxy.calls["DescribeVolumes"] == 6 and proxy.calls["CreateVolume"] == 1


def test_a_create_that_outlasts_the_wait_is_unavailable_and_its_retry_finds_the_volume(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, ec2: Any
) -> None:
    impatient = make_backend(client=make_client(proxy.endpoint, account), wait_timeout=0.2)
    proxy.hold("creating", 1000)
    with pytest.raises(failures.TransientError, match="timed out waiting"):
        impatient.create_volume("pvc-slow", opts())
    proxy.reset()  # EC2 finishes creating it
    disk = impatient.create_volume("pvc-slow", opts())
    assert [v["VolumeId"] for v in named(ec2, "pvc-slow")] == [disk.id]
    assert proxy.calls["CreateVolume"] == 0, "the retry made a second volume instead of finding the first"


def test_attach_and_detach_wait_for_ec2_to_finish(
    slow: AwsBackend, proxy: MotoProxy, ec2: Any, instance: str
) -> None:
    disk = slow.create_volume("pvc-attach", opts())
    proxy.reset()
    proxy.hold("attaching", 3)
    context = slow.attach(disk.id, instance, False)
    assert context["devicePath"].startswith("/dev/")
    (volume,) = ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"]
    assert [(a["InstanceId"], a["State"]) for a in volume["Attachments"]] == [(instance, "attached")]
    assert proxy.calls["DescribeVolumes"] >= 1 + 4, "attach returned before EC2 reported it attached"
    proxy.reset()
    proxy.hold("detaching", 3)
    slow.detach(disk.id, instance)
    (volume,) = ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"]
    assert volume["Attachments"] == []
    assert proxy.calls["DescribeVolumes"] >= 1 + 4, "detach returned before EC2 reported it detached"


def test_expand_returns_once_the_modification_is_optimizing(
    slow: AwsBackend, proxy: MotoProxy, ec2: Any
) -> None:
    """EC2 reports a resize `optimizing` for a long time after the new size is usable; the expand must
    return then (the node can grow the filesystem), not wait for `completed`."""
    disk = slow.create_volume("pvc-grow", opts())
    proxy.reset()
    proxy.hold("optimizing", 50)
    assert slow.expand_volume(disk.id, 3 * GiB) == 3 * GiB
    # one look for a modification in flight before, one for this one after
    assert proxy.calls["ModifyVolume"] == 1 and proxy.calls["DescribeVolumesModifications"] == 2
    (volume,) = ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"]
    assert volume["Size"] == 3


# ---------------------------------------------------------------------------- throttling


def test_throttling_is_retried_with_capped_backoff_and_counted(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, ec2: Any
) -> None:
    naps: list[float] = []
    backend = make_backend(
        client=make_client(proxy.endpoint, account),
        backoff=Backoff(attempts=5, initial=0.01, maximum=0.04),
        sleep=naps.append,
    )
    proxy.fail("CreateVolume", "RequestLimitExceeded", times=3)
    disk = backend.create_volume("pvc-throttled", opts())
    assert [v["VolumeId"] for v in named(ec2, "pvc-throttled")] == [disk.id]
    assert proxy.refused["CreateVolume"] == 3 and proxy.calls["CreateVolume"] == 4
    assert backend.retries() == {"create_volume": 3}
    backoff = [n for n in naps if n <= 0.04]
    assert len(backoff) >= 3, f"three back-off pauses expected, slept {naps}"


def test_a_whole_life_under_random_throttling_ends_with_nothing_left(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, ec2: Any, instance: str
) -> None:
    backend = make_backend(
        client=make_client(proxy.endpoint, account), backoff=Backoff(attempts=8, initial=0.001, maximum=0.004)
    )
    proxy.fail("*", "RequestLimitExceeded", rate=0.25)  # a seeded quarter of all calls
    disk = backend.create_volume("pvc-busy", opts())
    backend.attach(disk.id, instance, False)
    assert backend.expand_volume(disk.id, 2 * GiB) == 2 * GiB
    backend.detach(disk.id, instance)
    backend.delete_volume(disk.id)
    assert sum(proxy.refused.values()) > 5, "the proxy throttled almost nothing"
    assert sum(backend.retries().values()) == sum(proxy.refused.values())
    assert named(ec2, "pvc-busy") == []


# ---------------------------------------------------------------------------- pagination


def test_listings_page_by_max_results(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, ec2: Any
) -> None:
    paged = make_backend(client=make_client(proxy.endpoint, account), page_size=5)
    made = sorted(paged.create_volume(f"pvc-page-{i}", opts()).id for i in range(12))
    proxy.reset()
    assert sorted(d.id for d in paged.list_volumes().items) == made
    # one query per listed tag key: 12 volumes are 3 pages of 5, the in-tree tag key has one empty page
    assert proxy.calls["DescribeVolumes"] == 4
    proxy.reset()
    assert paged.create_volume("pvc-page-7", opts()).id in made  # found by name, not made again
    assert proxy.calls["CreateVolume"] == 0


def test_the_proxy_refuses_paging_ec2_refuses(proxy: MotoProxy, account: str) -> None:
    """Guard for the test above: MaxResults outside 5..500 or beside VolumeIds fails as in EC2, so a
    backend that paged wrongly could not pass."""
    client = make_client(proxy.endpoint, account)
    for params in ({"MaxResults": 4}, {"MaxResults": 5, "VolumeIds": ["vol-0123456789abcdef0"]}):
        with pytest.raises(Exception, match="InvalidParameter"):
            client.describe_volumes(**params)


# ---------------------------------------------------------------------------- the retry counter on /metrics


def test_retries_are_exported_as_a_prometheus_counter(tmp_path: Path, proxy: MotoProxy, account: str) -> None:
    config, _ = parse_args(
        ["--endpoint", f"unix://{tmp_path}/csi.sock", "--backend", "aws", "--zone", ZONE, "--node-id", "i-1",
         "--metrics-address", "127.0.0.1:0"]
    )  # fmt: skip
    backend = AwsBackend(
        make_client(proxy.endpoint, account),
        zone=ZONE,
        backoff=Backoff(attempts=4, initial=0.001, maximum=0.002),
    )
    driver = Driver(config, backend=backend)
    driver.start()
    client = connect(f"{tmp_path}/csi.sock")
    try:
        proxy.fail("CreateVolume", "RequestLimitExceeded", times=2)
        proxy.fail("DescribeVolumes", "Throttling", times=1)
        client.controller.CreateVolume(
            csi_pb2.CreateVolumeRequest(name="pvc-metrics", volume_capabilities=[CAP]), timeout=60
        )
        assert driver.metrics is not None
        url = f"http://127.0.0.1:{driver.metrics.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        client.close()
        driver.stop(grace=1)
    counted = {
        s.labels["operation"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ballast_backend_retries_total"
    }
    assert counted == {"create_volume": 2.0, "describe_volumes": 1.0}


# ---------------------------------------------------------------------------- two driver processes


def test_two_driver_processes_racing_one_name_make_one_volume(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both processes look the name up while neither has created it (the proxy holds the lookups until
    both are in flight), so both call CreateVolume: the name's client token makes EC2 (here the proxy,
    as EC2 does) answer both with one volume."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    ec2 = make_client(moto_endpoint, DEFAULT_ACCOUNT)
    instance = run_instance(ec2)
    name = f"pvc-race-{tmp_path.name}"
    with running_proxy(moto_endpoint) as proxy:
        args = (
            "--backend",
            "aws",
            "--aws-endpoint-url",
            proxy.endpoint,
            "--aws-region",
            REGION,
            "--zone",
            ZONE,
        )
        drivers = [start_driver(tmp_path / f"driver-{i}", *args, node_id=instance) for i in range(2)]
        try:
            proxy.delay("DescribeVolumes", 0.5)
            replies: list[Any] = [None, None]
            errors: list[grpc.RpcError] = []
            clients = [connect(d.endpoint) for d in drivers]
            request = csi_pb2.CreateVolumeRequest(
                name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=GiB), volume_capabilities=[CAP]
            )
            futures = [c.controller.CreateVolume.future(request, timeout=120) for c in clients]
            for i, future in enumerate(futures):
                try:
                    replies[i] = future.result()
                except grpc.RpcError as err:
                    errors.append(err)
            for c in clients:
                c.close()
        finally:
            for d in drivers:
                d.stop()
        assert not errors, errors
        assert proxy.calls["CreateVolume"] == 2, (
            "the race did not happen: one process found the other's volume"
        )
    ids = {r.volume.volume_id for r in replies}
    assert len(ids) == 1, f"the two processes answered different volumes: {ids}"
    assert [v["VolumeId"] for v in named(ec2, name)] == list(ids)
    ec2.delete_volume(VolumeId=ids.pop())
