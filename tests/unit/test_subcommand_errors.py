"""The subcommands refuse bad input in one line, never with a traceback: out-of-range numbers exit 2
naming the flag (they would not fit the request's protobuf field), an unusable state database exits 1
with recover-state's advice."""

from __future__ import annotations

from pathlib import Path

import pytest

from csi.cli import main
from csi.config import parse_args

pytestmark = pytest.mark.usefixtures("restore_root_logging")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        pytest.param("--max-results", "3000000000", id="max-results-over-int32"),
        pytest.param("--max-results", "-1", id="max-results-negative"),
        pytest.param("--starting-offset", str(2**64), id="starting-offset-over-int64"),
        pytest.param("--starting-offset", "-4096", id="starting-offset-negative"),
        pytest.param("--endpoint", "garbage", id="endpoint-not-a-url"),
        pytest.param("--endpoint", "unix://relative.sock", id="endpoint-relative"),
        pytest.param("--timeout", "-1", id="timeout-negative"),
        pytest.param("--timeout", "nan", id="timeout-nan"),
    ],
)
def test_snapshot_diff_refuses_values_its_request_cannot_carry(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["snapshot-diff", "s-1", "s-2", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        pytest.param("--max-results", str(2**31 - 1), 2**31 - 1, id="max-results-int32-max"),
        pytest.param("--starting-offset", str(2**63 - 1), 2**63 - 1, id="starting-offset-int64-max"),
        pytest.param(
            "--endpoint", "unix:///run/csi/socket.sock", "unix:///run/csi/socket.sock", id="endpoint"
        ),
    ],
)
def test_snapshot_diff_takes_the_whole_range(flag: str, value: str, expected: object) -> None:
    _, ns = parse_args(["snapshot-diff", "s-1", "s-2", flag, value])
    assert getattr(ns, {"--endpoint": "diff_endpoint"}.get(flag, flag[2:].replace("-", "_"))) == expected


def test_snapshot_diff_without_endpoint_uses_the_main_one() -> None:
    config, ns = parse_args(["--endpoint", "unix:///x/csi.sock", "snapshot-diff", "s-1", "s-2"])
    assert ns.diff_endpoint == "" and config.server.endpoint == "unix:///x/csi.sock"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"garbage\n", id="not-a-database"),
        pytest.param(b"SQLite format 3\x00" + b"\xff" * 4080, id="corrupt-header"),
    ],
)
def test_clear_health_on_an_unusable_state_database_is_one_line_with_the_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    (tmp_path / "state.db").write_bytes(content)
    assert main(["clear-health", "--data-dir", str(tmp_path), "lv-" + "0" * 32]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ballast-csi: state database {tmp_path / 'state.db'} is unusable (")
    assert f"ballast-csi recover-state --data-dir {tmp_path}" in err
    assert (tmp_path / "state.db").read_bytes() == content, "the database is left as it was"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param('{"token": 1}', id="a-value-not-a-string"),  # protobuf would raise TypeError on it
        pytest.param('["token"]', id="not-an-object"),
        pytest.param("token=abc", id="not-json"),
        pytest.param(None, id="missing"),
    ],
)
def test_snapshot_diff_with_an_unusable_secrets_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    """Exit 2, as for any bad flag, before anything is sent; 1 would say a stream failed."""
    secrets = tmp_path / "secrets.json"
    if content is not None:
        secrets.write_text(content)
    argv = ["snapshot-diff", "s-1", "s-2", "--endpoint", f"unix://{tmp_path}/none.sock"]
    assert main([*argv, "--secrets-file", str(secrets)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("ballast-csi: --secrets-file: "), err
