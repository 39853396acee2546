"""The CSIDriver fields newer Kubernetes reads, and the sidecar images equal to what tests/e2e runs and
to what docs/configuration.md says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.chart.render import CHART, Obj, only, render, run_helm
from tests.conftest import REPO
from tests.e2e.tools import versions


def render_for(kube_version: str, values: Obj | None = None) -> list[Obj]:
    result = run_helm(["template", "ballast", "--kube-version", kube_version], values or {})
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize(
    "kube_version, period",
    [("1.32.0", None), ("1.33.0", 60), ("1.37.2", 60)],
    ids=["1.32-field-unknown", "1.33", "1.37"],
)
def test_allocatable_update_period_is_set_where_the_api_knows_it(
    kube_version: str, period: int | None
) -> None:
    spec = only(render_for(kube_version), "CSIDriver")["spec"]
    assert spec.get("nodeAllocatableUpdatePeriodSeconds") == period
    assert spec["seLinuxMount"] is True


def test_allocatable_update_period_follows_the_value_and_null_leaves_it_out() -> None:
    tuned = {"csiDriver": {"nodeAllocatableUpdatePeriodSeconds": 15}}
    assert only(render_for("1.37.2", tuned), "CSIDriver")["spec"]["nodeAllocatableUpdatePeriodSeconds"] == 15
    off = {"csiDriver": {"nodeAllocatableUpdatePeriodSeconds": None}}
    assert "nodeAllocatableUpdatePeriodSeconds" not in only(render_for("1.37.2", off), "CSIDriver")["spec"]


def test_schema_refuses_an_update_period_kubernetes_would_refuse() -> None:
    result = run_helm(["template", "ballast"], {"csiDriver": {"nodeAllocatableUpdatePeriodSeconds": 5}})
    assert result.returncode != 0
    assert "nodeAllocatableUpdatePeriodSeconds" in result.stderr


# chart container -> the pin in scripts/k8s-versions.env of the binary tests/e2e runs in its place
PINNED = {
    "csi-provisioner": "CSI_PROVISIONER_VERSION",
    "csi-attacher": "CSI_ATTACHER_VERSION",
    "csi-resizer": "CSI_RESIZER_VERSION",
    "csi-snapshotter": "CSI_SNAPSHOTTER_VERSION",
}


@pytest.mark.parametrize("container", sorted(PINNED))
def test_sidecar_image_is_the_version_the_test_bed_runs(container: str) -> None:
    deployment = only(render("defaults"), "Deployment")
    images = {c["name"]: c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images[container].rsplit(":", 1)[1] == versions()[PINNED[container]]


def image_paths(values: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the values that hold an image (repository + tag): "" is the driver's own."""
    if isinstance(values, dict):
        image = values.get("image")
        if isinstance(image, dict) and "tag" in image:
            yield prefix.rstrip(".")
        for key, value in values.items():
            yield from image_paths(value, f"{prefix}{key}.")


CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
IMAGE_PATHS = sorted(image_paths(CHART_VALUES))
# A row of the values tables: `<path>.image.tag` named in its first cell, then its default as
# [`repository:tag`], [`tag`] or [""] (empty).
DEFAULT = re.compile(r'\[(?:`(?P<ref>[^`]*)`|"")\]')


def documented_image(path: str) -> tuple[str | None, str]:
    """(repository or None, tag) that docs/configuration.md gives as the default of `<path>.image.tag`."""
    key = f"`{path}.image.tag`" if path else "`image.tag`"
    rows = [
        line
        for line in (REPO / "docs" / "configuration.md").read_text().splitlines()
        if line.startswith("|") and key in line.split("|")[1]
    ]
    assert len(rows) == 1, f"docs/configuration.md: {len(rows)} rows document {key}"
    found = DEFAULT.search(rows[0].split(key, 1)[1])
    assert found is not None, f"docs/configuration.md: no default given for {key}: {rows[0]}"
    ref = found["ref"] or ""
    repository, colon, tag = ref.rpartition(":")
    return (repository, tag) if colon and "/" in repository else (None, ref)


@pytest.mark.parametrize("path", IMAGE_PATHS, ids=[p or "driver" for p in IMAGE_PATHS])
def test_documented_image_default_is_the_values_default(path: str) -> None:
    """Every image tag docs/configuration.md states equals values.yaml's (and so, for the sidecars the
    test bed runs, the pin above); where it spells the whole reference, the repository too."""
    image = CHART_VALUES
    for key in filter(None, path.split(".")):
        image = image[key]
    image = image["image"]
    repository, tag = documented_image(path)
    assert tag == image["tag"]
    if repository is not None:
        assert repository == image["repository"]


def test_no_other_image_tag_is_named_in_the_docs() -> None:
    """A version anywhere in docs/configuration.md is the default of the image its row documents."""
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
        for version in re.findall(r"(?<![\w.])v\d+\.\d+\.\d+\b", line):
            keys = re.findall(r"`([\w.]*)image\.tag`", line.split("|")[1] if line.startswith("|") else "")
            assert keys, f"docs/configuration.md names {version} outside an image row: {line}"
            assert version == documented_image(keys[0].rstrip("."))[1], line


def test_the_docs_check_covers_every_pinned_sidecar() -> None:
    assert {"sidecars." + c.removeprefix("csi-") for c in PINNED} <= set(IMAGE_PATHS)


@pytest.mark.parametrize(("set_id", "limit"), [("aws", "25"), ("defaults", None)])
def test_attach_limit_reaches_the_node_plugin_and_the_controller(set_id: str, limit: str | None) -> None:
    """NodeGetInfo reports the limit; ControllerPublish refuses past the same limit."""
    objects = render(set_id)
    for kind in ("Deployment", "DaemonSet"):
        spec = only(objects, kind)["spec"]["template"]["spec"]
        plugin = next(c for c in spec["containers"] if c["name"] == "ballast-plugin")
        given = [a.split("=", 1)[1] for a in plugin["args"] if a.startswith("--max-volumes-per-node=")]
        assert given == ([limit] if limit else []), kind
