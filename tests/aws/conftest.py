"""AWS backend fixtures: one moto EC2 server per session on 127.0.0.1, reset before each test, and boto3
clients pointed at it over real HTTP with dummy credentials."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from csi.backends.aws import AwsBackend
from csi.backends.aws.devices import DeviceFinder
from csi.backends.aws.ec2 import Backoff
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, connect
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import ZONE, make_client, moto_for_tests, run_instance

OTHER_ZONE = "us-east-1b"


@contextlib.contextmanager
def serving(backend: AwsBackend, socket: str, *flags: str) -> Iterator[CsiClient]:
    """The real driver over `backend` on the unix socket `socket` (in ZONE, with `flags`), and a client
    of it; both stopped on exit."""
    config, _ = parse_args(["--backend", "aws", "--endpoint", f"unix://{socket}", "--zone", ZONE, *flags])
    driver = Driver(config, backend=backend)
    driver.start()
    client = connect(socket)
    try:
        yield client
    finally:
        client.close()
        driver.stop(grace=1)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_for_tests() as endpoint:
        yield endpoint


@pytest.fixture
def account() -> str:
    """A fresh 12-digit account id: moto keeps separate state per account, so every test starts empty
    without resetting the shared server."""
    return f"{random.randrange(10**11, 10**12)}"


@pytest.fixture
def ec2(moto_endpoint: str, account: str) -> Any:
    """A plain client for arranging and inspecting state behind the backend's back."""
    return make_client(moto_endpoint, account)


@pytest.fixture
def make_backend(moto_endpoint: str, account: str) -> Iterator[Callable[..., AwsBackend]]:
    made: list[AwsBackend] = []

    def build(**overrides: Any) -> AwsBackend:
        options: dict[str, Any] = {
            "zone": ZONE,
            "node_id": "i-0123456789abcdef0",
            "max_volumes": 0,
            "imds": None,
            "modify_window": 0.05,
            "backoff": Backoff(attempts=4, initial=0.001, maximum=0.005),
            "wait_timeout": 5.0,
            "device_finder": DeviceFinder(root="/nonexistent", timeout=0, udev_lookup=lambda s: None),
        }
        options.update(overrides)
        client = options.pop("client", None) or make_client(moto_endpoint, account)
        backend = AwsBackend(client, **options)
        made.append(backend)
        return backend

    yield build
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend: Callable[..., AwsBackend]) -> AwsBackend:
    return make_backend()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[MotoProxy]:
    """tests/motoproxy.py in front of the session's moto server, for one test."""
    with running_proxy(moto_endpoint, seed=7) as served:
        yield served


@pytest.fixture
def slow(make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str) -> AwsBackend:
    """The backend talking to EC2 through the proxy."""
    return make_backend(client=make_client(proxy.endpoint, account))


@pytest.fixture
def instance(ec2: Any) -> str:
    """A running instance in ZONE (the node)."""
    return run_instance(ec2)


class _Http:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}


def inject_errors(
    client: Any, operation: str, codes: list[str], status: int = 503, message: str = ""
) -> list[str]:
    """Make the next len(codes) calls of `operation` (CamelCase) fail with these EC2 error codes before
    they leave the client; later calls reach moto. Returns the list, which empties as errors are used."""

    def fail(**kwargs: Any) -> Any:
        if not codes:
            return None
        code = codes.pop(0)
        error = {"Code": code, "Message": message or f"injected {code}"}
        return _Http(status), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}

    client.meta.events.register(f"before-call.ec2.{operation}", fail)
    return codes


def lose_answers(client: Any, operation: str, times: int, status: int = 0, code: str = "") -> list[None]:
    """The next `times` calls of `operation` (CamelCase) reach moto and take effect, then their answer is
    lost on the way back: a connection error after the request was served, or with `status`, an HTTP
    error in its place (a gateway's bare 502/504, whose code botocore makes the status, or EC2's `code`).
    Returns the list, which empties as answers are lost."""
    left: list[None] = [None] * times

    def lose(http_response: Any, parsed: dict[str, Any], **kwargs: Any) -> None:
        if not left:
            return
        left.pop()
        if not status:
            raise EndpointConnectionError(endpoint_url="injected: answer lost")
        http_response.status_code = status
        error = {"Code": code or str(status), "Message": f"injected {code or status} after the work was done"}
        parsed.clear()
        parsed.update({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}})

    client.meta.events.register(f"after-call.ec2.{operation}", lose)
    return left


def inject_responses(client: Any, operation: str, responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answer the next len(responses) calls of `operation` with these parsed responses (HTTP 200)."""

    def answer(**kwargs: Any) -> Any:
        return (_Http(200), responses.pop(0)) if responses else None

    client.meta.events.register(f"before-call.ec2.{operation}", answer)
    return responses


def record_calls(client: Any, operation: str) -> list[dict[str, Any]]:
    """Parameters of every `operation` call the client makes from now on (after validation)."""
    seen: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **kwargs: Any) -> None:
        seen.append(dict(params))

    client.meta.events.register(f"provide-client-params.ec2.{operation}", record)
    return seen
