"""csi/programs.py: one program run to its end with a deadline, the exit awaited on a pidfd."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from csi import programs
from csi.mount import MountError, SubprocessRunner


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param("echo out; echo err >&2; exit 3", (3, "out\n", "err\n"), id="both-streams-and-status"),
        pytest.param("printf 'a\\377b'", (0, "a\ufffdb", ""), id="undecodable-byte-replaced"),
        pytest.param(
            "head -c 300000 /dev/zero | tr '\\0' o; head -c 300000 /dev/zero | tr '\\0' e >&2",
            (0, "o" * 300000, "e" * 300000),
            id="more-than-a-pipe-holds-on-both",
        ),
    ],
)
def test_output_and_status(script: str, expected: tuple[int, str, str]) -> None:
    assert programs.run(["/bin/sh", "-c", script], timeout=30) == expected


def test_the_exit_is_awaited_without_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program closes its output and only exits 0.3 s later: waiting for that exit must not sleep
    in steps (subprocess.run(timeout=...) does, from 1 ms up, which cost every run a millisecond)."""

    def polled(seconds: float) -> None:
        raise AssertionError(f"slept {seconds}s polling for the exit")

    monkeypatch.setattr(time, "sleep", polled)
    assert programs.run(["/bin/sh", "-c", "exec >&- 2>&-; exec /bin/sleep 0.3"], timeout=30) == (0, "", "")


def test_a_program_past_its_deadline_is_killed_and_reaped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        programs.run(["/bin/sh", "-c", f"echo $$ > {pid_file}; exec /bin/sleep 30"], timeout=0.3)
    with pytest.raises(ProcessLookupError):  # a zombie would still answer signal 0
        os.kill(int(pid_file.read_text()), 0)


def test_the_runner_names_the_program_that_ran_out_of_time() -> None:
    with pytest.raises(MountError, match=r"^sleep did not finish within 0.2s$"):
        SubprocessRunner()(["sleep", "30"], timeout=0.2)


def test_without_pidfds_the_standard_library_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfds(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    assert programs.run(["/bin/sh", "-c", "echo out; exit 4"], timeout=30) == (4, "out\n", "")
    with pytest.raises(subprocess.TimeoutExpired):
        programs.run(["/bin/sleep", "30"], timeout=0.2)
