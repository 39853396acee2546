"""The CSIDriver fields newer Kubernetes reads, and the sidecar images equal to what tests/e2e runs."""

from __future__ import annotations

import pytest
import yaml

from tests.chart.render import Obj, only, render, run_helm
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


@pytest.mark.parametrize(("set_id", "limit"), [("aws", "25"), ("defaults", None)])
def test_attach_limit_reaches_the_node_plugin_and_the_controller(set_id: str, limit: str | None) -> None:
    """NodeGetInfo reports the limit; ControllerPublish refuses past the same limit."""
    objects = render(set_id)
    for kind in ("Deployment", "DaemonSet"):
        spec = only(objects, kind)["spec"]["template"]["spec"]
        plugin = next(c for c in spec["containers"] if c["name"] == "ballast-plugin")
        given = [a.split("=", 1)[1] for a in plugin["args"] if a.startswith("--max-volumes-per-node=")]
        assert given == ([limit] if limit else []), kind
