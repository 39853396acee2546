"""One Backend contract, three implementations: the shared fake, the local backend on a temporary data
dir, and the aws backend against moto's EC2 server over real HTTP (through the moto proxy, which answers
DescribeVolumeStatus, an action moto lacks, with no status events). Each test of the suite runs against
every `subject`; what a backend does not offer is skipped through its capability flags."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.devices import DeviceFinder
from csi.backends.aws.ec2 import Backoff
from csi.backends.base import Backend, GiB, MiB
from csi.backends.local import LocalBackend
from tests.fakes import FakeBackend
from tests.motoproxy import running_proxy
from tests.motoserver import ZONE, make_client, moto_for_tests, run_instance

NO_STATUS_EVENTS = (
    '<DescribeVolumeStatusResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>motoproxy</requestId><volumeStatusSet/></DescribeVolumeStatusResponse>"
)


@dataclass
class Subject:
    """A backend under test and what the suite needs to know to exercise it."""

    backend: Backend
    unit: int  # a size the backend allocates exactly (its granularity)
    node: str  # a node volumes can be attached to
    unknown_volume: str  # well-formed, but no such volume
    unknown_snapshot: str
    other_node: str = ""  # a second attachable node, when the backend has more than one
    malformed: list[str] = field(default_factory=lambda: ["", "../../etc/passwd", "x" * 200])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_for_tests() as endpoint, running_proxy(endpoint) as proxy:
        proxy.answer("DescribeVolumeStatus", NO_STATUS_EVENTS)
        yield proxy.endpoint


def _fake() -> Subject:
    backend = FakeBackend(node_id="node-1")
    backend.nodes.add("node-2")
    return Subject(backend, MiB, "node-1", "fv-999999", "fs-999999", other_node="node-2")


def _local(tmp: Path) -> Subject:
    backend = LocalBackend.open(str(tmp / "data"), node_id="node-1")
    return Subject(backend, MiB, "node-1", "lv-" + "0" * 32, "ls-" + "0" * 32)


def _aws(endpoint: str) -> Subject:
    client = make_client(endpoint, f"{random.randrange(10**11, 10**12)}")  # a fresh moto account
    nodes = [run_instance(client), run_instance(client)]
    backend = AwsBackend(
        client,
        zone=ZONE,
        node_id=nodes[0],
        imds=None,
        modify_window=0.05,
        backoff=Backoff(attempts=4, initial=0.001, maximum=0.005),
        wait_timeout=10.0,
        device_finder=DeviceFinder(root="/nonexistent", timeout=0, udev_lookup=lambda s: None),
    )
    return Subject(
        backend, GiB, nodes[0], "vol-0123456789abcdef0", "snap-0123456789abcdef0", other_node=nodes[1]
    )


@pytest.fixture(params=["fake", "local", "aws"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "fake":
        made = _fake()
    elif request.param == "local":
        made = _local(tmp_path)
    else:
        made = _aws(request.getfixturevalue("moto_endpoint"))
    yield made
    made.backend.close()
