"""Where the test bed's binaries live: etcd from Debian, the rest built by scripts/k8s-tools.

scripts/k8s-tools caches each component under
``${BALLAST_CACHE:-~/.cache/ballast}/k8s/<component>/<version>/`` (bin/, and crd/ for the two snapshot
components), with the versions pinned in scripts/k8s-versions.env. A missing binary fails the test in CI
and skips it elsewhere, like every other tool (tests/conftest.require_tool).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, in_ci, require_tool

VERSIONS_FILE = REPO / "scripts" / "k8s-versions.env"

# binary -> (component directory in the cache, key of its version in k8s-versions.env)
_BINARIES: dict[str, tuple[str, str]] = {
    "kube-apiserver": ("kubernetes", "KUBERNETES_VERSION"),
    "kube-controller-manager": ("kubernetes", "KUBERNETES_VERSION"),
    "csi-provisioner": ("external-provisioner", "CSI_PROVISIONER_VERSION"),
    "csi-attacher": ("external-attacher", "CSI_ATTACHER_VERSION"),
    "csi-resizer": ("external-resizer", "CSI_RESIZER_VERSION"),
    "csi-snapshotter": ("external-snapshotter", "CSI_SNAPSHOTTER_VERSION"),
    "snapshot-controller": ("external-snapshotter", "CSI_SNAPSHOTTER_VERSION"),
    "csi-snapshot-metadata": ("external-snapshot-metadata", "CSI_SNAPSHOT_METADATA_VERSION"),
    "snapshot-metadata-lister": ("external-snapshot-metadata", "CSI_SNAPSHOT_METADATA_VERSION"),
}


@functools.cache
def versions() -> dict[str, str]:
    """The pins of scripts/k8s-versions.env (KEY=VALUE lines; # comments)."""
    pins: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def cache_root() -> Path:
    """Root of the build cache (outside the repository)."""
    base = os.environ.get("BALLAST_CACHE") or str(Path.home() / ".cache" / "ballast")
    return Path(base) / "k8s"


def component_dir(component: str, version_key: str) -> Path:
    return cache_root() / component / versions()[version_key]


def _missing(what: str) -> None:
    message = f"{what} not built (run scripts/k8s-tools)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def k8s_binary(name: str) -> Path:
    """Absolute path of a built Kubernetes binary (see _BINARIES); fails in CI, skips elsewhere."""
    component, key = _BINARIES[name]
    path = component_dir(component, key) / "bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        _missing(f"{name} {versions()[key]} ({path})")
    return path


def snapshot_crds() -> list[Path]:
    """The VolumeSnapshot and VolumeGroupSnapshot CRD manifests of the snapshotter's client module."""
    crd_dir = component_dir("external-snapshotter", "CSI_SNAPSHOTTER_VERSION") / "crd"
    files = []
    for group in ("snapshot.storage.k8s.io", "groupsnapshot.storage.k8s.io"):
        found = sorted(crd_dir.glob(f"{group}_*.yaml"))
        if not found:
            _missing(f"{group} CRDs ({crd_dir})")
        files += found
    return files


def etcd_binary() -> Path:
    """etcd from Debian's etcd-server package."""
    return Path(require_tool("etcd"))
