"""The chart and the driver agree: every rendered driver command line parses with csi.config."""

from __future__ import annotations

import json

import pytest

from csi.config import build_parser, parse_args
from shim.gates import GATES
from tests.chart.render import CHART, containers, only, render, resolved_args, values_of


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_rendered_driver_args_parse(set_id: str, kind: str) -> None:
    plugin = containers(only(render(set_id), kind))["ballast-plugin"]
    config, _ = parse_args(resolved_args(plugin))
    values = values_of(set_id)
    assert config.server.mode == ("controller" if kind == "Deployment" else "node")
    assert config.server.endpoint == "unix:///csi/csi.sock"
    assert config.backend.name == values["backend"]["name"]
    assert config.server.log_format == values["driver"]["logFormat"]
    if kind == "DaemonSet":
        assert config.node.kubelet_dir == values["node"]["kubeletPath"]
        assert config.node.allowed_path_prefixes == tuple(values["node"]["allowedPathPrefixes"])
    if values["backend"]["name"] == "local":
        assert config.backend.data_dir == values["backend"]["local"]["dataDir"]
    aws = values["backend"]["aws"]
    assert config.backend.aws_describe_batch_window == float(aws["describeBatchWindow"] or 0)
    assert config.backend.aws_extra_tags == aws.get("extraTags", {})
    assert config.backend.aws_k8s_tag_cluster_id == aws.get("k8sTagClusterId", "")
    assert config.backend.aws_warn_on_invalid_tag is aws.get("warnOnInvalidTag", False)


def test_every_rendered_driver_flag_exists() -> None:
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    for set_id in ("defaults", "aws", "local-tuned", "metrics", "migration"):
        for kind in ("Deployment", "DaemonSet"):
            for arg in resolved_args(containers(only(render(set_id), kind))["ballast-plugin"]):
                assert arg.split("=", 1)[0] in known, (set_id, kind, arg)


def test_values_schema_lists_exactly_the_migration_gates() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    gates = schema["properties"]["migration"]["properties"]["featureGates"]["propertyNames"]["enum"]
    assert sorted(gates) == sorted(g.name for g in GATES)
