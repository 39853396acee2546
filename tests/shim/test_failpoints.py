"""Failpoints: parsing, and a real process killed exactly at the armed hit with the kill recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shim.failpoints import FailpointSpecError, parse
from tests.conftest import REPO

CHILD = """
import sys
from shim import failpoints
failpoints.validate_environment()
for i in range(1, 6):
    print(i, flush=True)
    failpoints.hit("step.a")
    failpoints.hit("step.b")
print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("", {}, id="empty"),
        pytest.param("a", {"a": 1}, id="one"),
        pytest.param(" a , b@3 ,", {"a": 1, "b": 3}, id="counts-and-spaces"),
    ],
)
def test_parse(spec: str, expected: dict[str, int]) -> None:
    assert parse(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param("@2", "no failpoint name", id="no-name"),
        pytest.param("a@x", "not a whole number", id="bad-count"),
        pytest.param("a@0", "1 or more", id="zero-count"),
    ],
)
def test_parse_refuses(spec: str, fragment: str) -> None:
    with pytest.raises(FailpointSpecError, match=fragment):
        parse(spec)


def _run(spec: str | None, record: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BALLAST_FAILPOINTS")}
    if spec is not None:
        env["BALLAST_FAILPOINTS"] = spec
        env["BALLAST_FAILPOINTS_RECORD"] = str(record)
    return subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("spec", "printed", "recorded"),
    [
        pytest.param(None, ["1", "2", "3", "4", "5", "done"], None, id="unarmed-runs-through"),
        pytest.param("step.b", ["1"], "step.b", id="first-hit"),
        pytest.param("step.a@3", ["1", "2", "3"], "step.a", id="third-hit"),
        pytest.param("other", ["1", "2", "3", "4", "5", "done"], None, id="unrelated-name"),
    ],
)
def test_kill_lands_exactly_at_the_armed_hit(
    tmp_path: Path, spec: str | None, printed: list[str], recorded: str | None
) -> None:
    record = tmp_path / "record"
    done = _run(spec, record)
    assert done.stdout.split() == printed
    if recorded is None:
        assert done.returncode == 0
        assert not record.exists()
    else:
        assert done.returncode == -signal.SIGKILL
        name, pid = record.read_text().split()
        assert name == recorded
        assert int(pid) > 0


def test_malformed_spec_stops_the_process(tmp_path: Path) -> None:
    done = _run("a@0", tmp_path / "record")
    assert done.returncode == 1
    assert "BALLAST_FAILPOINTS" in done.stderr
