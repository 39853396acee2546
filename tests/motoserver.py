"""moto's EC2 server on 127.0.0.1 over real HTTP, and boto3 clients for it, shared by the aws backend
tests, the Backend contract suite and csi-sanity."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from moto import server as moto_server

REGION = "us-east-1"
ZONE = "us-east-1a"
AMI = "ami-03cf127a"  # moto does not check image ids


@contextmanager
def running_moto() -> Iterator[str]:
    """Start a moto server on a free port; yields its endpoint URL and stops it afterwards.

    Set MOTO_EC2_LOAD_DEFAULT_AMIS=false first: without its ~1300 built-in images moto sets up an
    account in milliseconds instead of a second."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def moto_for_tests() -> Iterator[str]:
    """running_moto with MOTO_EC2_LOAD_DEFAULT_AMIS=false while it runs (restored afterwards)."""
    saved = os.environ.get("MOTO_EC2_LOAD_DEFAULT_AMIS")
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    try:
        with running_moto() as endpoint:
            yield endpoint
    finally:
        if saved is None:
            os.environ.pop("MOTO_EC2_LOAD_DEFAULT_AMIS", None)
        else:
            os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = saved


_SESSION: list[Any] = []


def make_client(endpoint: str, account: str, service: str = "ec2") -> Any:
    """A boto3 client (EC2 unless `service` says otherwise, e.g. "ebs") for moto over HTTP, dummy
    credentials, requests tagged with `account`. Clients share one boto3 session so each service model
    is loaded once."""
    if not _SESSION:
        _SESSION.append(boto3.session.Session())
    client = _SESSION[0].client(
        service,
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"total_max_attempts": 1}),
    )

    def tag_account(request: Any, **kwargs: Any) -> None:
        request.headers["x-moto-account-id"] = account

    client.meta.events.register(f"before-sign.{service}", tag_account)
    return client


def run_instance(ec2: Any, zone: str = ZONE, instance_type: str = "m5.large") -> str:
    reservation = ec2.run_instances(
        ImageId=AMI,
        MinCount=1,
        MaxCount=1,
        InstanceType=instance_type,
        Placement={"AvailabilityZone": zone},
    )
    return str(reservation["Instances"][0]["InstanceId"])
