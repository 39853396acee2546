"""The entry point holds the cyclic collector off during start-up only (csi/__main__.py)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi import server


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_importing_the_entry_point_holds_collection_off() -> None:
    assert _python("import gc, csi.__main__; print(gc.isenabled())") == "False"


def test_subcommands_run_with_collection_on(tmp_path: Path) -> None:
    code = (
        "import gc, csi.__main__ as m;"
        f"m.main(['recover-state', '--data-dir', {str(tmp_path / 'd')!r}]);"
        "print(gc.isenabled())"
    )
    assert _python(code).splitlines()[-1] == "True"


@pytest.fixture
def collector_state() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


def test_serving_freezes_start_up_objects_and_turns_collection_back_on(collector_state: None) -> None:
    gc.disable()
    server._settle_collector()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
