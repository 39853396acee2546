"""NOTES.txt: what `helm install` prints, rendered through a ConfigMap in a temporary copy of the chart."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.render import CHART, RENDER_KUBE_VERSION, VALUE_SETS, helm_bin

PREVIEW = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-preview
data:
  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}
"""


def render_notes(values: dict[str, Any], tmp_path: Path) -> str:
    """NOTES.txt as `helm install` would print it for `values` (helm template never renders it)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes-preview.yaml").write_text(PREVIEW)
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    argv = [helm_bin(), "template", "rel", str(chart), "-n", "storage", "--kube-version", RENDER_KUBE_VERSION]
    argv += ["-f", str(tmp_path / "values.yaml"), "--show-only", "templates/zz-notes-preview.yaml"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    notes: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return notes


def test_notes_give_the_migration_order_and_rollback(tmp_path: Path) -> None:
    notes = render_notes(VALUE_SETS["defaults"], tmp_path)
    steps = [
        notes.index(s) for s in ("1. Install the driver", "3. Enable the migration controller", "4. Follow")
    ]
    assert steps == sorted(steps)
    assert "In-tree migration is OFF" in notes and "no migration controller runs" in notes
    assert "--set migration.enabled=true" in notes and "helm upgrade rel <chart> -n storage" in notes
    rollback = notes[notes.index("Rolling back") :]
    assert "migration.featureGates.CSIMigrationAWS=false" in rollback
    assert "recorded in-tree original" in rollback
    # Nothing may promise the retired driver-side gates or node drains.
    assert "drain" not in notes and "driver containers run with" not in notes


AWS_GATES = "CSIMigration=true,CSIMigrationAWS=true,InTreePluginAWSUnregister=false"


@pytest.mark.parametrize(
    ("set_id", "gates"),
    [
        pytest.param("migration", [AWS_GATES], id="aws-migration-on"),
        pytest.param("local-tuned", [], id="local-migration-off"),
    ],
)
def test_notes_show_the_gates_in_force(set_id: str, gates: list[str], tmp_path: Path) -> None:
    notes = render_notes(VALUE_SETS[set_id], tmp_path)
    assert re.findall(r"--feature-gates=(\S+)", notes) == gates
    assert "this release registers" not in notes
    if gates:
        assert "deploy/rel-ballast-csi-migration" in notes and "2 replicas" in notes


def test_notes_warn_when_migrating_to_a_driver_kubernetes_does_not_target(tmp_path: Path) -> None:
    notes = render_notes({"migration": {"enabled": True}}, tmp_path)
    assert 'this release registers "local.csi.ballast.dev"' in notes
    assert "single-node clusters" in notes
