"""Command line: defaults, environment fallbacks, and bad flags exiting 2 with a message naming the flag."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from csi.config import build_parser, parse_args
from csi.envflags import EnvDefault


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CSI_ENDPOINT", "CSI_NODE_ID", "BALLAST_DATA_DIR", "BALLAST_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    config, ns = parse_args([])
    assert ns.command is None
    assert config.server.mode == "all"
    assert config.backend.name == "local"
    assert config.backend.driver_name == "local.csi.ballast.dev"
    assert config.backend.data_dir == "/var/lib/ballast"
    assert config.backend.zone == "local"
    assert config.node.node_id  # the host name
    assert config.node.allowed_roots == ("/var/lib/kubelet",)


@pytest.mark.parametrize(
    ("env", "argv", "attr", "expected"),
    [
        pytest.param(
            {"CSI_ENDPOINT": "unix:///tmp/x.sock"},
            [],
            "server.endpoint",
            "unix:///tmp/x.sock",
            id="endpoint-env",
        ),
        pytest.param(
            {"CSI_ENDPOINT": "unix:///tmp/x.sock"},
            ["--endpoint", "unix:///tmp/y.sock"],
            "server.endpoint",
            "unix:///tmp/y.sock",
            id="flag-beats-env",
        ),
        pytest.param({"CSI_NODE_ID": "node-7"}, [], "node.node_id", "node-7", id="node-id-env"),
        pytest.param(
            {}, ["--backend", "aws"], "backend.driver_name", "ebs.csi.aws.com", id="aws-driver-name"
        ),
        pytest.param(
            {},
            ["--backend", "aws", "--driver-name", "x.example.com"],
            "backend.driver_name",
            "x.example.com",
            id="driver-name-override",
        ),
        pytest.param({}, ["--capacity", "10Gi"], "backend.capacity_bytes", 10 * 1024**3, id="capacity-size"),
        pytest.param({"BALLAST_WORKERS": "4"}, [], "server.workers", 4, id="workers-env"),
        pytest.param({"BALLAST_MODE": "node"}, [], "server.mode", "node", id="mode-env"),
        pytest.param({"BALLAST_MODE": ""}, [], "server.mode", "all", id="empty-env-counts-as-unset"),
        pytest.param({"BALLAST_LOG_FORMAT": "json"}, [], "server.log_format", "json", id="log-format-env"),
        pytest.param({"BALLAST_LOG_LEVEL": "debug"}, [], "server.log_level", "debug", id="log-level-env"),
        pytest.param(
            {"BALLAST_SNAPSHOT_METADATA_BLOCK_TYPE": "fixed"},
            [],
            "server.snapshot_metadata_block_type",
            "fixed",
            id="block-type-env",
        ),
        pytest.param(
            {"BALLAST_SNAPSHOT_METADATA_BLOCK_SIZE": "4Ki"},
            [],
            "server.snapshot_metadata_block_size",
            4096,
            id="block-size-env-through-its-type",
        ),
        pytest.param(
            {"BALLAST_ALLOWED_PATH_PREFIXES": "/srv/a::/srv/b"},
            [],
            "node.allowed_path_prefixes",
            ("/srv/a", "/srv/b"),
            id="path-prefixes-env-colon-separated",
        ),
        pytest.param(
            {"BALLAST_MODE": "node"},
            ["--mode", "controller"],
            "server.mode",
            "controller",
            id="mode-flag-beats-env",
        ),
        pytest.param(
            {"BALLAST_MODE": "bogus"},
            ["--mode", "node"],
            "server.mode",
            "node",
            id="flag-beats-bad-env-unread",
        ),
        pytest.param(
            {"BALLAST_ALLOWED_PATH_PREFIXES": "/env/a"},
            ["--allowed-path-prefix=/flag/b"],
            "node.allowed_path_prefixes",
            ("/flag/b",),
            id="path-prefix-flag-replaces-env-list",
        ),
        pytest.param(
            {},
            ["--allowed-path-prefix", "/srv/a", "--allowed-path-prefix", "/srv/b"],
            "node.allowed_roots",
            ("/var/lib/kubelet", "/srv/a", "/srv/b"),
            id="path-prefixes",
        ),
        pytest.param(
            {},
            ["--endpoint", "tcp://127.0.0.1:10000"],
            "server.endpoint",
            "tcp://127.0.0.1:10000",
            id="tcp-loopback",
        ),
        pytest.param(
            {},
            ["--endpoint", "tcp://[::1]:10000"],
            "server.endpoint",
            "tcp://[::1]:10000",
            id="tcp-loopback-v6",
        ),
        pytest.param({}, ["--zone", "us-east-1a"], "backend.zone", "us-east-1a", id="zone"),
        pytest.param({"AWS_REGION": "eu-west-1"}, [], "backend.aws_region", "eu-west-1", id="aws-region-env"),
        pytest.param(
            {},
            ["--aws-endpoint-url", "http://[::1]:5000"],
            "backend.aws_endpoint_url",
            "http://[::1]:5000",
            id="aws-endpoint-v6",
        ),
        pytest.param(
            {},
            ["--max-volumes-per-node", "2147483647"],
            "node.max_volumes_per_node",
            2147483647,
            id="max-volumes-csinode-int32-max",
        ),
        pytest.param({"BALLAST_REGION": "eu_west.1"}, [], "backend.region", "eu_west.1", id="region-env"),
    ],
)
def test_values(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], attr: str, expected: object
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config, _ = parse_args(argv)
    group, name = attr.split(".")
    assert getattr(getattr(config, group), name) == expected


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(["--mode", "both"], "--mode", id="bad-mode"),
        pytest.param(["--endpoint", "/tmp/x.sock"], "--endpoint", id="endpoint-no-scheme"),
        pytest.param(["--endpoint", "tcp://10.0.0.1:9000"], "--endpoint", id="tcp-not-loopback"),
        pytest.param(["--endpoint", "tcp://127.0.0.1:99999"], "--endpoint", id="tcp-port-out-of-range"),
        pytest.param(["--endpoint", "tcp://127.0.0.1"], "--endpoint", id="tcp-no-port"),
        pytest.param(["--endpoint", "unix://run/csi.sock"], "--endpoint", id="unix-relative-path"),
        pytest.param(["--data-dir", "var/lib/ballast"], "--data-dir", id="relative-data-dir"),
        pytest.param(["--zone", ""], "--zone", id="empty-zone"),
        pytest.param(["--zone", "zone a"], "--zone", id="zone-with-space"),
        pytest.param(["--zone", "z" * 64], "--zone", id="zone-over-63"),
        pytest.param(["--region", "-eu"], "--region", id="region-leading-dash"),
        pytest.param(["--workers", "0"], "--workers", id="zero-workers"),
        pytest.param(["--capacity", "lots"], "--capacity", id="bad-capacity"),
        # The migration gates belong to `ballast-migrate controller`; the driver has none.
        pytest.param(["--feature-gates=CSIMigration=true"], "--feature-gates", id="no-feature-gates"),
        pytest.param(["--kubelet-dir", "var/lib/kubelet"], "--kubelet-dir", id="relative-kubelet-dir"),
        pytest.param(["--allowed-path-prefix", "/srv/../etc"], "--allowed-path-prefix", id="dotdot-prefix"),
        pytest.param(["--max-volumes-per-node", "-1"], "--max-volumes-per-node", id="negative-max"),
        pytest.param(
            ["--max-volumes-per-node", "2147483648"], "--max-volumes-per-node", id="max-over-csinode-int32"
        ),
        pytest.param(
            ["--max-volumes-per-node", "99999999999999999999"], "--max-volumes-per-node", id="max-over-int64"
        ),
        pytest.param(["--no-such-flag"], "--no-such-flag", id="unknown-flag"),
        pytest.param(["--aws-region", "us east 1"], "--aws-region", id="aws-region-space"),
        pytest.param(["--aws-region=-us-east-1"], "--aws-region", id="aws-region-leading-dash"),
        pytest.param(["--aws-endpoint-url", "ec2.local"], "--aws-endpoint-url", id="aws-endpoint-no-scheme"),
        pytest.param(["--aws-endpoint-url", "ftp://ec2.local"], "--aws-endpoint-url", id="aws-endpoint-ftp"),
        pytest.param(["--aws-endpoint-url", "http://[::1"], "--aws-endpoint-url", id="aws-endpoint-bad-v6"),
        pytest.param(
            ["--aws-endpoint-url", "http://h:99999"], "--aws-endpoint-url", id="aws-endpoint-bad-port"
        ),
        pytest.param(["--metrics-address", "localhost"], "--metrics-address", id="metrics-address-no-port"),
        pytest.param(["--metrics-address", ":99999"], "--metrics-address", id="metrics-port-out-of-range"),
        pytest.param(["--driver-name", "Bad_Name"], "--driver-name", id="driver-name-underscore"),
        pytest.param(["--driver-name", "a" * 64], "--driver-name", id="driver-name-over-63"),
        pytest.param(["--driver-name", "-ebs.csi"], "--driver-name", id="driver-name-leading-dash"),
        pytest.param(["--node-id", "n" * 129], "--node-id", id="node-id-over-128-bytes"),
        pytest.param(["--node-id", "node\x01"], "--node-id", id="node-id-control-char"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    ("var", "value", "flag"),
    [
        pytest.param("BALLAST_MODE", "bogus", "--mode", id="mode-not-a-choice"),
        pytest.param("BALLAST_LOG_FORMAT", "xml", "--log-format", id="log-format-not-a-choice"),
        pytest.param("BALLAST_LOG_LEVEL", "trace", "--log-level", id="log-level-not-a-choice"),
        pytest.param(
            "BALLAST_SNAPSHOT_METADATA_BLOCK_TYPE",
            "foo",
            "--snapshot-metadata-block-type",
            id="block-type-not-a-choice",
        ),
        pytest.param("BALLAST_WORKERS", "many", "--workers", id="workers-not-a-number"),
        pytest.param("CSI_ENDPOINT", "/tmp/x.sock", "--endpoint", id="endpoint-no-scheme"),
        pytest.param("BALLAST_ZONE", "zone/a", "--zone", id="zone-with-slash"),
        pytest.param("BALLAST_DATA_DIR", "data", "--data-dir", id="relative-data-dir"),
        pytest.param("BALLAST_BACKEND", "nosuch", "--backend", id="unknown-backend"),
        pytest.param("BALLAST_CAPACITY", "lots", "--capacity", id="capacity-not-a-size"),
        pytest.param(
            "BALLAST_AWS_DESCRIBE_BATCH_WINDOW",
            "2",
            "--aws-describe-batch-window",
            id="batch-window-too-long",
        ),
        pytest.param("BALLAST_AWS_EXTRA_TAGS", "team", "--aws-extra-tags", id="extra-tag-without-value"),
        pytest.param("BALLAST_AWS_EXTRA_TAGS", "a=1,a=2", "--aws-extra-tags", id="extra-tag-twice"),
        pytest.param(
            "BALLAST_SNAPSHOT_METADATA_BLOCK_SIZE",
            "3Ki",
            "--snapshot-metadata-block-size",
            id="block-size-odd",
        ),
        pytest.param("BALLAST_MAX_VOLUMES_PER_NODE", "-1", "--max-volumes-per-node", id="negative-max"),
        pytest.param(
            "BALLAST_MAX_VOLUMES_PER_NODE",
            "99999999999999999999",
            "--max-volumes-per-node",
            id="max-over-int64",
        ),
        pytest.param("BALLAST_KUBELET_DIR", "var/lib/kubelet", "--kubelet-dir", id="relative-kubelet-dir"),
        pytest.param(
            "BALLAST_ALLOWED_PATH_PREFIXES", "/srv/a:srv/b", "--allowed-path-prefix", id="one-relative-prefix"
        ),
        pytest.param("BALLAST_FORMAT_CONCURRENCY", "0", "--format-concurrency", id="zero-format-concurrency"),
        pytest.param("BALLAST_METRICS_ADDRESS", "9808", "--metrics-address", id="metrics-address-no-colon"),
        pytest.param("BALLAST_DRIVER_NAME", "my driver", "--driver-name", id="driver-name-space"),
        pytest.param("CSI_NODE_ID", "x" * 200, "--node-id", id="node-id-too-long"),
        pytest.param("AWS_REGION", "us/east", "--aws-region", id="aws-region-slash"),
        pytest.param(
            "AWS_ENDPOINT_URL_EC2", "localhost:5000", "--aws-endpoint-url", id="aws-endpoint-no-scheme"
        ),
    ],
)
def test_bad_env_value_exits_2_naming_flag_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], var: str, value: str, flag: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and f"environment variable {var}" in err


def test_every_env_fallback_in_the_help_is_an_env_default() -> None:
    """A flag whose help names a variable reads it through EnvDefault (checked like the flag) only."""
    named = {}
    for action in build_parser()._actions:
        found = re.findall(r"\[([A-Z][A-Z0-9_]+)[,\]]", action.help or "")
        if found:
            named[found[0]] = action.default
    assert len(named) >= 20
    assert {
        var: type(d).__name__ for var, d in named.items() if not (isinstance(d, EnvDefault) and d.var == var)
    } == {}


def test_help_documents_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "csi", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flags = [
        opt for action in build_parser()._actions for opt in action.option_strings if opt.startswith("--")
    ]
    assert len(flags) >= 20
    for flag in flags:
        assert flag in out, f"{flag} missing from --help"
    for action in build_parser()._actions:
        if action.option_strings:
            assert action.help, f"{action.option_strings} has no help text"


def test_version_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "csi", "--version"], capture_output=True, text=True, check=True
    )
    from importlib.metadata import version

    assert done.stdout.strip() == f"ballast-csi {version('ballast-csi')}"
