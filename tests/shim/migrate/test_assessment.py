"""The engine's assessment of a PV before it takes any step: PVs whose new form or journal would not fit
Kubernetes' annotation limit are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.cli import build_parser
from shim.migrate import kube
from shim.migrate.actor import Actor, build
from shim.migrate.engine import ANNOTATIONS_LIMIT, SKIPPED, Outcome, annotations_size
from shim.migrate.journal import CONVERT, Journal
from shim.migrate.metrics import Metrics
from shim.migrate.options import check
from shim.migrate.usage import LiveClaims, UsageFrom
from tests.shim.fake_kube_api import FakeKubeAPI
from tests.shim.migrate.samples import sample_pv

Obj = dict[str, Any]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[kube.KubeClient, Path]]:
    """A client of a fake API server, and its kubeconfig."""
    with FakeKubeAPI({}) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        client = kube.connect(str(kubeconfig))
        yield client, kubeconfig
        client.close()


@pytest.fixture
def actor(cluster: tuple[kube.KubeClient, Path]) -> Actor:
    """A dry-run actor (Events are only logged) in a cluster where nothing uses any PV."""
    client, kubeconfig = cluster
    args = build_parser().parse_args(["apply", "--kubeconfig", str(kubeconfig), "--dry-run"])
    check(args)
    usage = UsageFrom(lambda: [], lambda namespace: [])
    return build(args, client, Metrics("test", "test"), LiveClaims(client), usage)


def with_annotation(size: int) -> Obj:
    pv = sample_pv("aws-ebs", name="pv-1")
    pv["metadata"]["uid"] = "pv-uid-1"
    pv["status"] = {"phase": "Available"}
    pv["metadata"]["annotations"]["example.com/blob"] = "x" * size
    return pv


@pytest.mark.parametrize(
    ("size", "fragment"),
    [
        pytest.param(100_000, "its journal (the record of the PV and the PV to create) would", id="journal"),
        pytest.param(140_000, "the new PV would carry", id="new-pv"),
    ],
)
def test_a_pv_too_large_to_convert_is_skipped_not_failed(actor: Actor, size: int, fragment: str) -> None:
    outcome = actor.engine.assess(with_annotation(size), CONVERT)
    assert isinstance(outcome, Outcome)
    assert outcome.result == SKIPPED
    assert outcome.message.startswith(f"too-large: {fragment}")
    assert f"Kubernetes allows {ANNOTATIONS_LIMIT}" in outcome.message
    skips = actor.metrics.registry.get_sample_value("ballast_migrate_skips_total", {"reason": "too-large"})
    assert skips == 1
    journal = actor.engine.assess(with_annotation(60_000), CONVERT)  # room for both: no skip
    assert isinstance(journal, Journal)
    assert annotations_size(journal.target["metadata"]["annotations"]) < ANNOTATIONS_LIMIT
    assert len(journal.to_json()) < ANNOTATIONS_LIMIT


def test_annotation_size_counts_keys_and_values_in_utf8_bytes() -> None:
    assert annotations_size({"a/b": "é" * 10, "c": ""}) == 3 + 20 + 1
    assert annotations_size(json.loads('{"k": "\\ud83d\\ude00"}')) == 1 + 4
