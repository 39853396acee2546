"""Node placement: IMDSv2 over real HTTP (a fake metadata server on 127.0.0.1) and overrides."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.devices import INSTANCE_STORE_MODEL, DeviceFinder
from csi.backends.aws.metadata import (
    DEFAULT_LIMIT,
    TOKEN_MARGIN,
    TOKEN_TTL,
    XEN_LIMIT,
    Imds,
    attach_limit,
    free_attach_slots,
    resolve_placement,
)
from csi.backends.base import DiskOptions, GiB
from csi.failures import FailedPreconditionError, LimitExceededError
from tests.motoserver import AMI, ZONE

TOKEN = "token-123"
METADATA = {
    "instance-id": "i-0abc1234def567890",
    "placement/availability-zone": "eu-west-1b",
    "instance-type": "m7i.large",
}


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2: PUT /latest/api/token, then GETs that must carry the token of the current `generation`
    (a new generation: every token handed out before has expired)."""

    requests: list[str] = []
    generation = 0

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        self.requests.append("PUT " + self.path)
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(200, f"{TOKEN}-{FakeImds.generation}")
        else:
            self._reply(400, "")

    def do_GET(self) -> None:
        self.requests.append("GET " + self.path)
        if self.headers.get("X-aws-ec2-metadata-token") != f"{TOKEN}-{FakeImds.generation}":
            self._reply(401, "")
            return
        value = METADATA.get(self.path.removeprefix("/latest/meta-data/"))
        self._reply(200 if value else 404, value or "")

    def _reply(self, code: int, body: str) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def imds() -> Iterator[Imds]:
    FakeImds.requests, FakeImds.generation = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Imds(f"http://127.0.0.1:{server.server_address[1]}", timeout=2)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_everything_from_imdsv2(imds: Imds) -> None:
    placement = resolve_placement(imds, node_id="ip-10-0-0-1", zone="local", max_volumes=0, env={})
    assert (placement.node_id, placement.zone, placement.max_volumes) == (
        "i-0abc1234def567890",
        "eu-west-1b",
        31,  # an m7i.large: 32 dedicated slots, one of them the root volume's
    )
    assert FakeImds.requests.count("PUT /latest/api/token") == 1  # one session token, reused


def test_overrides_win_and_skip_metadata(imds: Imds) -> None:
    placement = resolve_placement(
        imds, node_id="i-0123456789abcdef0", zone="us-east-1c", max_volumes=7, env={}
    )
    assert (placement.node_id, placement.zone, placement.max_volumes) == (
        "i-0123456789abcdef0",
        "us-east-1c",
        7,
    )
    assert FakeImds.requests == []


def test_zone_from_environment(imds: Imds) -> None:
    placement = resolve_placement(
        imds,
        node_id="i-0123456789abcdef0",
        zone="local",
        max_volumes=3,
        env={"AWS_AVAILABILITY_ZONE": "us-west-2d"},
    )
    assert placement.zone == "us-west-2d"


def test_no_metadata_and_no_zone_override_fails_with_advice() -> None:
    unreachable = Imds("http://127.0.0.1:9", timeout=0.5)
    with pytest.raises(FailedPreconditionError, match="AWS_AVAILABILITY_ZONE"):
        resolve_placement(unreachable, node_id="i-0123456789abcdef0", zone="local", max_volumes=0, env={})


def test_no_metadata_keeps_a_given_node_id_and_default_limit() -> None:
    placement = resolve_placement(None, node_id="node-a", zone="us-east-1a", max_volumes=0, env={})
    assert (placement.node_id, placement.max_volumes) == ("node-a", DEFAULT_LIMIT)


@pytest.mark.parametrize(
    ("instance_type", "limit"),
    [
        pytest.param("m5.large", DEFAULT_LIMIT, id="shared-nitro"),
        pytest.param("m7i.2xlarge", 31, id="dedicated-small"),
        pytest.param("c7i.12xlarge", 31, id="dedicated-12xlarge"),
        pytest.param("r7i.16xlarge", 47, id="dedicated-16xlarge"),
        pytest.param("m7a.24xlarge", 63, id="dedicated-24xlarge"),
        pytest.param("m7a.32xlarge", 87, id="dedicated-32xlarge"),
        pytest.param("m7i.48xlarge", 127, id="dedicated-48xlarge"),
        pytest.param("m7i.metal-24xl", 38, id="dedicated-metal-24xl"),
        pytest.param("r7i.metal-48xl", 78, id="dedicated-metal-48xl"),
        pytest.param("m8g.new-size", 31, id="dedicated-unknown-size-smallest"),
        pytest.param("t2.micro", XEN_LIMIT, id="xen"),
        pytest.param("zz9.huge", DEFAULT_LIMIT, id="unknown"),
    ],
)
def test_attach_limit_by_instance_type(instance_type: str, limit: int) -> None:
    assert attach_limit(instance_type) == limit


THREE_ENIS = "0a:00/\n0a:01/\n0a:02/"


@pytest.mark.parametrize(
    ("instance_type", "mappings", "macs", "expected"),
    [
        pytest.param("m5.large", "ami\nroot", "0a:00/", DEFAULT_LIMIT, id="nitro-one-interface"),
        pytest.param(
            "m5.large", "ami\nebs1\nroot", "0a:00/\n0a:01/\n0a:02/", DEFAULT_LIMIT - 3, id="nitro-shared"
        ),
        pytest.param("m7i.large", "ami\nroot", "0a:00/\n0a:01/", 31, id="dedicated-ignores-enis"),
        pytest.param("t2.micro", "ami\nebs1\nebs2\nroot", "0a:00/\n0a:01/", XEN_LIMIT - 2, id="xen"),
    ],
)
def test_free_attach_slots(
    imds: Imds, monkeypatch: pytest.MonkeyPatch, instance_type: str, mappings: str, macs: str, expected: int
) -> None:
    monkeypatch.setitem(METADATA, "block-device-mapping/", mappings)
    monkeypatch.setitem(METADATA, "network/interfaces/macs/", macs)
    assert free_attach_slots(imds, instance_type) == expected


def test_node_limit_is_recomputed_on_every_call(
    imds: Imds, monkeypatch: pytest.MonkeyPatch, make_backend: Callable[..., AwsBackend]
) -> None:
    """NodeGetInfo reads the backend's node identity on every call: an interface attached since (a CNI
    plugin adding one) takes a slot, and the next answer says so."""
    monkeypatch.setitem(METADATA, "instance-type", "m5.large")
    monkeypatch.setitem(METADATA, "block-device-mapping/", "ami\nroot")
    monkeypatch.setitem(METADATA, "network/interfaces/macs/", "0a:00/")
    backend = make_backend(imds=imds, zone="us-east-1a")
    assert backend.node_identity().max_volumes == DEFAULT_LIMIT
    monkeypatch.setitem(METADATA, "network/interfaces/macs/", "0a:00/\n0a:01/")
    assert backend.node_identity().max_volumes == DEFAULT_LIMIT - 1


def nvme_controllers(root: Path, *models: str) -> DeviceFinder:
    """A fake node whose NVMe controllers report these models in sysfs."""
    for i, model in enumerate(models):
        (root / f"sys/class/nvme/nvme{i}").mkdir(parents=True)
        (root / f"sys/class/nvme/nvme{i}/model").write_text(model.ljust(40) + "\n")  # sysfs pads it
    return DeviceFinder(root=str(root), timeout=0, udev_lookup=lambda s: None)


def test_the_node_counts_its_nvme_instance_store_volumes(tmp_path: Path) -> None:
    ebs = "Amazon Elastic Block Store"
    finder = nvme_controllers(tmp_path, ebs, INSTANCE_STORE_MODEL, ebs, INSTANCE_STORE_MODEL)
    assert finder.instance_stores() == 2
    assert DeviceFinder(root=str(tmp_path / "none")).instance_stores() == 0


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [
        pytest.param("m5d.large", DEFAULT_LIMIT - 2, id="shared-limit-loses-a-slot-per-store"),
        pytest.param("m7i.large", 31, id="dedicated-limit-keeps-them"),
    ],
)
def test_instance_store_volumes_take_slots_where_the_limit_is_shared(
    imds: Imds,
    monkeypatch: pytest.MonkeyPatch,
    make_backend: Callable[..., AwsBackend],
    tmp_path: Path,
    instance_type: str,
    expected: int,
) -> None:
    """AWS: on Nitro types without a dedicated EBS limit, NVMe instance store volumes share the 28
    slots with EBS volumes and network interfaces; NodeGetInfo must not promise their slots."""
    monkeypatch.setitem(METADATA, "instance-type", instance_type)
    monkeypatch.setitem(METADATA, "block-device-mapping/", "ami\nroot")
    monkeypatch.setitem(METADATA, "network/interfaces/macs/", "0a:00/")
    finder = nvme_controllers(tmp_path, INSTANCE_STORE_MODEL, INSTANCE_STORE_MODEL)
    backend = make_backend(imds=imds, zone="us-east-1a", device_finder=finder)
    assert backend.node_identity().max_volumes == expected


def test_configured_limit_is_not_recomputed(imds: Imds, make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend(imds=imds, zone="us-east-1a", max_volumes=9)
    assert backend.node_identity().max_volumes == 9
    assert not any("network" in r for r in FakeImds.requests)


def test_a_token_imds_no_longer_takes_is_renewed(imds: Imds) -> None:
    """IMDS refuses an expired session token with 401: a new one is fetched and the read succeeds."""
    assert imds.get("instance-type") == "m7i.large"
    FakeImds.generation += 1  # every token handed out so far has expired
    assert imds.get("instance-type") == "m7i.large"
    assert FakeImds.requests.count("PUT /latest/api/token") == 2


def test_a_token_is_renewed_before_it_expires(imds: Imds) -> None:
    now = [1000.0]
    imds._clock = lambda: now[0]
    imds.get("instance-type")
    now[0] += TOKEN_TTL - TOKEN_MARGIN - 1
    imds.get("instance-type")
    assert FakeImds.requests.count("PUT /latest/api/token") == 1, "still fresh: reused"
    now[0] += 2
    imds.get("instance-type")
    assert FakeImds.requests.count("PUT /latest/api/token") == 2, "near its end: renewed first"
    assert [r for r in FakeImds.requests if r.startswith("GET")] == [
        "GET /latest/meta-data/instance-type"
    ] * 3


@pytest.mark.parametrize(
    ("limit", "launched"),
    [
        pytest.param(4, 2, id="two-volumes-mapped-at-launch"),
        pytest.param(3, 0, id="none-mapped-at-launch"),
    ],
)
def test_an_override_is_reported_as_the_publishes_the_controller_allows(
    imds: Imds,
    monkeypatch: pytest.MonkeyPatch,
    make_backend: Callable[..., AwsBackend],
    ec2: Any,
    limit: int,
    launched: int,
) -> None:
    """--max-volumes-per-node N on node and controller: the controller counts the volumes mapped at
    launch against N, so NodeGetInfo reports N minus them, and every publish the scheduler allows for
    that figure is made; one more is RESOURCE_EXHAUSTED."""
    mappings = [
        {"DeviceName": f"/dev/sd{chr(ord('f') + i)}", "Ebs": {"VolumeSize": 1}} for i in range(launched)
    ]
    reservation = ec2.run_instances(
        ImageId=AMI,
        MinCount=1,
        MaxCount=1,
        InstanceType="m5.large",
        Placement={"AvailabilityZone": ZONE},
        BlockDeviceMappings=mappings,
    )
    instance = reservation["Instances"][0]["InstanceId"]
    ebs = "".join(f"ebs{i + 1}\n" for i in range(launched))
    monkeypatch.setitem(METADATA, "block-device-mapping/", f"ami\n{ebs}root")
    node = make_backend(imds=imds, node_id=instance, zone=ZONE, max_volumes=limit, controller=False)
    controller = make_backend(max_volumes=limit)
    reported = node.node_identity().max_volumes
    assert reported == limit - launched
    made = [controller.create_volume(f"pvc-{i}", DiskOptions(size_bytes=GiB)).id for i in range(reported + 1)]
    for vid in made[:reported]:
        controller.attach(vid, instance, False)
    with pytest.raises(LimitExceededError):
        controller.attach(made[-1], instance, False)
