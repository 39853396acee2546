"""The harness maps container paths to host paths the way a container's mounts resolve them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.deploy import _remap

MOUNTS = [
    ("/tmp", Path("/srv/pod/tmp")),  # emptyDir
    ("/tmp/e2e-deploy/data", Path("/tmp/e2e-deploy/data")),  # hostPath at its own path, inside /tmp
    ("/csi", Path("/srv/pod/socket-dir")),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "--data-dir=/tmp/e2e-deploy/data", "--data-dir=/tmp/e2e-deploy/data", id="specific-mount-wins"
        ),
        pytest.param("--scratch=/tmp/x", "--scratch=/srv/pod/tmp/x", id="emptydir-remapped"),
        pytest.param("unix:///csi/csi.sock", "unix:///srv/pod/socket-dir/csi.sock", id="socket"),
        pytest.param("/tmpfoo/x", "/tmpfoo/x", id="prefix-is-not-a-mount"),
    ],
)
def test_remap(text: str, expected: str) -> None:
    assert _remap(text, MOUNTS) == expected
