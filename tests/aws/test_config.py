"""Building the aws backend from flags and environment, and keeping boto3 out of other backends."""

from __future__ import annotations

import subprocess
import sys

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.ec2 import Backoff, Ec2
from csi.backends.base import DiskOptions, GiB
from csi.config import parse_args
from csi.failures import FailedPreconditionError, InvalidParameterError, TransientError
from csi.server import build_backend
from tests.conftest import REPO
from tests.motoserver import REGION, ZONE, make_client


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


def test_flags_build_a_backend_on_the_configured_endpoint(moto_endpoint: str, aws_env: None) -> None:
    config, _ = parse_args(
        [
            "--backend", "aws",
            "--aws-region", REGION,
            "--aws-endpoint-url", moto_endpoint,
            "--zone", ZONE,
            "--node-id", "i-0123456789abcdef0",
            "--max-volumes-per-node", "5",
        ]
    )  # fmt: skip
    backend = build_backend(config)
    try:
        assert isinstance(backend, AwsBackend)
        assert config.backend.driver_name == "ebs.csi.aws.com"
        assert backend.probe() is True
        disk = backend.create_volume("pvc-config", DiskOptions(size_bytes=GiB, parameters={"type": "gp3"}))
        assert disk.topology["topology.ebs.csi.aws.com/zone"] == ZONE
        identity = backend.node_identity()
        assert (identity.node_id, identity.max_volumes) == ("i-0123456789abcdef0", 5)
        backend.delete_volume(disk.id)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("argv", "env", "made"),
    [
        pytest.param([], "", False, id="default-strict"),
        pytest.param(["--aws-warn-on-invalid-tag"], "", True, id="bare-flag"),
        pytest.param([], "true", True, id="environment"),
        pytest.param(["--aws-warn-on-invalid-tag=false"], "true", False, id="flag-wins"),
    ],
)
def test_warn_on_invalid_tag_reaches_the_backend(
    moto_endpoint: str, aws_env: None, monkeypatch: pytest.MonkeyPatch, argv: list[str], env: str, made: bool
) -> None:
    monkeypatch.setenv("BALLAST_AWS_WARN_ON_INVALID_TAG", env)
    base = ["--backend", "aws", "--aws-region", REGION, "--aws-endpoint-url", moto_endpoint, "--zone", ZONE]
    config, _ = parse_args([*base, *argv])
    backend = build_backend(config)
    try:
        bad = {"tagSpecification_1": "o={{ .Nope }}"}
        if made:
            parameters = backend.validate_parameters(bad)
            disk = backend.create_volume("pvc-warn", DiskOptions(size_bytes=GiB, parameters=parameters))
            backend.delete_volume(disk.id)
        else:
            with pytest.raises(InvalidParameterError, match="no field"):
                backend.validate_parameters(bad)
    finally:
        backend.close()


def test_a_controller_without_region_fails_with_advice(aws_env: None) -> None:
    config, _ = parse_args(["--backend", "aws", "--mode", "controller"])
    with pytest.raises(FailedPreconditionError, match="--aws-region"):
        build_backend(config)


def test_a_node_needs_no_region(aws_env: None) -> None:
    config, _ = parse_args(
        ["--backend", "aws", "--mode", "node", "--zone", ZONE, "--node-id", "i-0123456789abcdef0"]
    )
    backend = build_backend(config)
    try:
        assert backend.probe() is True
        assert backend.node_identity().topology["topology.kubernetes.io/zone"] == ZONE
    finally:
        backend.close()


def test_unreachable_endpoint_is_retried_then_transient(account: str) -> None:
    naps: list[float] = []
    ec2 = Ec2(make_client("http://127.0.0.1:9", account), Backoff(attempts=3), sleep=naps.append)
    with pytest.raises(TransientError, match="unreachable"):
        ec2.call("describe_volumes")
    assert len(naps) == 2


def test_boto3_is_imported_only_by_the_aws_backend() -> None:
    probe = (
        "import sys\n"
        "import csi.server, csi.backends, csi.backends.local, csi.controller, csi.node\n"
        "print('boto3' in sys.modules, 'botocore' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False"]
