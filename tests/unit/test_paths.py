"""csi/paths.py: only absolute, normalised paths strictly under an allowed root pass."""

from __future__ import annotations

import pytest

from csi.failures import InvalidParameterError
from csi.paths import check_path

ROOTS = ("/var/lib/kubelet", "/srv/csi")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/var/lib/kubelet/pods/uid/volumes/x/mount", id="kubelet-pod-path"),
        pytest.param("/srv/csi/staging", id="extra-prefix"),
        pytest.param("/var/lib/kubelet/plugins/a b/globalmount", id="space-in-name"),
    ],
)
def test_accepted(path: str) -> None:
    assert check_path(path, "target_path", ROOTS) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        pytest.param("", "required", id="empty"),
        pytest.param("var/lib/kubelet/x", "absolute", id="relative"),
        pytest.param("some/path", "absolute", id="relative-short"),
        pytest.param("/var/lib/kubelet/../../etc", "'..'", id="dotdot"),
        pytest.param("/var/lib/kubelet/x/..", "'..'", id="trailing-dotdot"),
        pytest.param("/var/lib/kubelet/./x", "normalised", id="dot"),
        pytest.param("/var/lib/kubelet//x", "normalised", id="double-slash"),
        pytest.param("/var/lib/kubelet/x/", "normalised", id="trailing-slash"),
        pytest.param("/etc/passwd", "outside", id="outside-roots"),
        pytest.param("/var/lib/kubelet", "outside", id="root-itself"),
        pytest.param("/var/lib/kubeletx/y", "outside", id="sibling-prefix"),
        pytest.param("/var/lib/kubelet/x\n", "control", id="newline"),
        pytest.param("/var/lib/kubelet/x\x00y", "control", id="nul"),
        pytest.param("/var/lib/kubelet/" + "a" * 5000, "longer", id="too-long"),
    ],
)
def test_rejected(path: str, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        check_path(path, "target_path", ROOTS)
