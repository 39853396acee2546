"""Suite-wide helpers: locating external tools honestly (fail in CI, skip elsewhere)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi import logs

REPO = Path(__file__).resolve().parent.parent
TOOLS_BIN = REPO / ".tools" / "bin"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_tool(name: str) -> str:
    """Absolute path of `name` (searched in .tools/bin, then PATH).

    A missing tool fails the test when CI=true (CI must have it) and skips it elsewhere.
    """
    local = TOOLS_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found (run scripts/setup)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_root() -> None:
    """Loop devices and mounts need root; CI runs as root, so there a non-root run is a failure."""
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("this test needs root", pytrace=False)
        pytest.skip("needs root")


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """For tests that run `ballast-csi` in-process (csi.cli.main sets up logging on the root logger with
    the stream stderr is then, which pytest closes after the test): puts the root logger back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    own = {name: logging.getLogger(name).level for name in logs.OWN_LOGGERS}
    yield
    root.handlers = handlers
    root.setLevel(level)
    for name, was in own.items():
        logging.getLogger(name).setLevel(was)
