"""`ballast-migrate controller | apply | rollback | status`: flags, their checks, exit code 2 on bad input.

What the commands do to a cluster is tested on a real API server in tests/e2e/migration.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from shim.cli import build_parser, main
from shim.migrate import options
from tests.conftest import REPO
from tests.test_docs import flags, subparsers

MIGRATE_COMMANDS = ("controller", "apply", "rollback", "status")
NOT_A_KUBECONFIG = "not a kubeconfig (expected a YAML mapping of clusters, users and contexts)"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def closed_port_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig pointing at a local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {insecure-skip-tls-verify: true, "
        f"server: 'https://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        pytest.param(
            ["controller", "--workers", "0"],
            "--workers: must be a whole number from 1 to 256",
            id="workers-0",
        ),
        pytest.param(["controller", "--workers", "ten"], "--workers", id="workers-word"),
        pytest.param(
            ["controller", "--leader-elect=maybe"], "--leader-elect: invalid boolean 'maybe'", id="le-maybe"
        ),
        pytest.param(
            ["controller", "--feature-gates", "CSIMigrationNope=true"], "'CSIMigrationNope'", id="gate"
        ),
        pytest.param(
            ["controller", "--feature-gates", "CSIMigrationAWS=yes"], "invalid boolean 'yes'", id="gate-val"
        ),
        pytest.param(["controller", "--lock-duration", "30"], "not a duration: '30'", id="duration-no-unit"),
        pytest.param(["controller", "--resync-period", "0s"], "longer than 0", id="duration-zero"),
        pytest.param(["controller", "--metrics-address", "localhost"], "host:port", id="metrics-no-port"),
        pytest.param(["controller", "--metrics-address", ":99999"], "host:port", id="metrics-bad-port"),
        pytest.param(["controller", "--log-format", "xml"], "invalid choice: 'xml'", id="log-format"),
        pytest.param(
            ["controller", "--convert-in-use"], "unrecognized arguments: --convert-in-use", id="no-such"
        ),
        pytest.param(["apply", "--plugin", "rbd"], "unknown plugin 'rbd'", id="unknown-plugin"),
        pytest.param(["rollback", "-o", "yaml"], "invalid choice: 'yaml'", id="output"),
        pytest.param(["status", "--workers", "3"], "unrecognized arguments", id="status-no-workers"),
        pytest.param(
            ["controller", "--kubeconfig", "/nonexistent/kc"], "--kubeconfig: no such file", id="no-kc"
        ),
        pytest.param(
            ["controller", "--leader-elect-renew-deadline", "20s"],
            "shorter than --leader-elect-lease-duration",
            id="renew-after-lease",
        ),
        pytest.param(
            ["controller", "--leader-elect-retry-period", "10s"],
            "shorter than --leader-elect-renew-deadline",
            id="retry-after-renew",
        ),
        pytest.param(
            ["apply", "--lock-duration", "1s"], "--lock-duration must be at least 2s", id="short-lock"
        ),
        pytest.param(
            ["status", "--namespace", "Bad_NS"],
            "--namespace: 'Bad_NS' is not a valid namespace name",
            id="namespace-invalid",
        ),
        pytest.param(
            ["apply", "--namespace", "n" * 64], "is not a valid namespace name", id="namespace-too-long"
        ),
        pytest.param(["controller", "--namespace=ns-"], "'ns-' is not a valid namespace", id="ns-dash"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert fragment in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["apply", "rollback", "status", "controller"])
def test_an_unreachable_cluster_is_bad_input(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--kubeconfig", str(closed_port_kubeconfig(tmp_path))]
    if (
        command == "controller"
    ):  # the controller keeps retrying a cluster it cannot reach: check its set-up only
        argv += [
            "--leader-elect-lease-duration",
            "2s",
        ]  # fails the cross-flag check: proves check() runs first
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "Traceback" not in err
    if command != "controller":
        assert "cannot use the cluster" in err and "cannot reach the API server" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"clusters: [", "cannot use it: while parsing a flow node", id="malformed-yaml"),
        pytest.param(b"root:x:0:0:root:/root:/bin/sh\nbin:x:1:1::/:/bin/no\n", NOT_A_KUBECONFIG, id="passwd"),
        pytest.param(b"- a\n- b\n", NOT_A_KUBECONFIG, id="a-list"),
        pytest.param(b"clusters: 5\ncontexts: x\n", NOT_A_KUBECONFIG, id="wrong-types"),
        pytest.param(b"\x7fELF\x02\x01\x01\xd0\xff", NOT_A_KUBECONFIG, id="binary"),
    ],
)
def test_a_file_that_is_no_usable_kubeconfig_is_bad_input(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "kc"
    bad.write_bytes(content)
    code, _, err = run(["status", "--kubeconfig", str(bad)], capsys)
    assert code == 2
    assert err.startswith(f"ballast-migrate: {bad}: {message}")
    assert "object" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], True, id="default"),
        pytest.param(["--leader-elect"], True, id="bare"),
        pytest.param(["--leader-elect=false"], False, id="false"),
        pytest.param(["--leader-elect=0"], False, id="go-zero"),
        pytest.param(["--leader-elect", "true"], True, id="spaced"),
    ],
)
def test_leader_election_is_on_unless_turned_off(argv: list[str], expected: bool) -> None:
    args = build_parser().parse_args(["controller", *argv])
    assert args.leader_elect is expected
    assert args.workers == 10


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("2m", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), ("1.5s", 1.5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert options.duration(text) == seconds


def test_plugins_by_short_or_full_name() -> None:
    assert options.plugin("aws-ebs") == "kubernetes.io/aws-ebs"
    assert options.plugin("kubernetes.io/portworx-volume") == options.plugin("portworx")
    assert options.plugin("vsphere") == "kubernetes.io/vsphere-volume"


def test_default_identity_is_the_pod_name_with_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "ballast-migration-7d9f-abcde")
    assert options.default_identity("controller") == f"ballast-migration-7d9f-abcde_{options.version()}"
    one_shot = options.default_identity("apply")
    assert re.fullmatch(rf"apply-ballast-migration-7d9f-abcde-\d+_{re.escape(options.version())}", one_shot)


def test_namespace_defaults_to_the_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "storage")
    args = build_parser().parse_args(["status"])
    options.check(args)
    assert args.namespace == "storage"


def test_every_migration_flag_is_documented() -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    commands = subparsers(build_parser())
    missing = {
        (command, flag)
        for command in MIGRATE_COMMANDS
        for flag in flags(commands[command])
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
    }
    assert missing == set()
