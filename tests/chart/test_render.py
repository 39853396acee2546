"""helm lint and helm template per values set; every rendered object checked against its schema."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.chart.render import KUBE_VERSIONS, VALUE_SETS, Obj, of_kind, render, run_helm, values_of

SCHEMAS = Path(__file__).parent / "schemas"
# CRDs are not in the Kubernetes OpenAPI document: each gets a local structural schema.
CRD_SCHEMAS = {
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"): "volumesnapshotclass-snapshot-v1.json",
    (
        "groupsnapshot.storage.k8s.io/v1",
        "VolumeGroupSnapshotClass",
    ): "volumegroupsnapshotclass-groupsnapshot-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("cbt.storage.k8s.io/v1alpha1", "SnapshotMetadataService"): "snapshotmetadataservice-cbt-v1alpha1.json",
}


def validate_object(obj: Obj, kube_version: str) -> None:
    """Raise if `obj` does not match its Kubernetes (strict: unknown fields rejected) or CRD schema."""
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is not None:
        schema = json.loads((SCHEMAS / crd).read_text())
        jsonschema.Draft202012Validator(schema).validate(obj)
        return
    kubernetes_validate.validate(obj, kube_version, strict=True)


def test_lint_passes(set_id: str) -> None:
    result = run_helm(["lint", "--strict"], VALUE_SETS[set_id])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_matches_its_schema(set_id: str, kube_version: str) -> None:
    objects = render(set_id)
    assert objects
    for obj in objects:
        validate_object(obj, kube_version)


def test_object_names_are_unique(set_id: str) -> None:
    keys = Counter((o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in render(set_id))
    assert [k for k, n in keys.items() if n > 1] == []


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": {"name": "m", "namespace": "x"},
                "spec": {"selector": {}, "endpoints": [{"prot": "a"}]},
            },
            "prot",
            id="servicemonitor-misspelt-endpoint-field",
        ),
        pytest.param(
            {
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshotClass",
                "metadata": {"name": "s"},
                "driver": "d",
                "deletionPolicy": "Keep",
            },
            "deletionPolicy",
            id="snapshotclass-bad-deletion-policy",
        ),
        pytest.param(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSIDriver",
                "metadata": {"name": "d"},
                "spec": {"attachRequired": True, "podInfoOnMount": "no"},
            },
            "podInfoOnMount",
            id="csidriver-wrong-type",
        ),
        pytest.param(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a"}, "automount": True},
            "automount",
            id="openapi-unknown-field",
        ),
    ],
)
def test_schema_check_catches_bad_objects(obj: Obj, field: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match=field):
        validate_object(obj, KUBE_VERSIONS[-1])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"replicaCount": 2}, "replicaCount", id="unknown-top-level-key"),
        pytest.param({"backend": {"aws": {"regoin": "eu-west-1"}}}, "regoin", id="unknown-nested-key"),
        pytest.param({"backend": {"name": "gce"}}, "backend", id="unknown-backend"),
        pytest.param({"migration": {"enabled": "yes"}}, "enabled", id="gate-toggle-not-boolean"),
        pytest.param(
            {"migration": {"featureGates": {"CSIMigrationAWS": "on"}}}, "CSIMigrationAWS", id="gate-not-bool"
        ),
        pytest.param(
            {"migration": {"featureGates": {"CSIMigrationFoo": True}}}, "CSIMigrationFoo", id="unknown-gate"
        ),
        pytest.param({"node": {"kubeletPath": "var/lib/kubelet"}}, "kubeletPath", id="relative-kubelet-path"),
        pytest.param(
            {"storageClasses": [{"name": "a", "provisoner": "x"}]}, "provisoner", id="unknown-class-key"
        ),
        pytest.param({"storageClasses": [{"parameters": {}}]}, "name", id="class-without-name"),
        pytest.param(
            {"volumeGroupSnapshotClasses": [{"name": "g", "deletionPolicy": "Keep"}]},
            "deletionPolicy",
            id="group-class-bad-deletion-policy",
        ),
        pytest.param({"controller": {"runAsUser": 0}}, "runAsUser", id="controller-as-root"),
        pytest.param(
            {"sidecars": {"provisioner": {"leaderElection": False}}}, "leaderElection", id="sidecar-key"
        ),
        pytest.param(
            {"csiDriver": {"volumeLifecycleModes": ["Ephemeral"]}},
            "volumeLifecycleModes",
            id="inline-ephemeral-mode-the-driver-cannot-serve",
        ),
        pytest.param(
            {"csiDriver": {"volumeLifecycleModes": ["Persistent", "Ephemeral"]}},
            "volumeLifecycleModes",
            id="inline-ephemeral-mode-next-to-persistent",
        ),
    ],
)
def test_values_schema_rejects(values: dict[str, Any], message: str) -> None:
    result = run_helm(["template", "ballast", "--kube-version", "1.31.0"], values)
    assert result.returncode != 0, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_crd_objects_render_only_when_asked() -> None:
    assert of_kind(render("defaults"), "ServiceMonitor") == []
    assert of_kind(render("defaults"), "VolumeSnapshotClass") == []
    assert len(of_kind(render("metrics"), "ServiceMonitor")) == 2
    assert [c["metadata"]["name"] for c in of_kind(render("aws"), "VolumeSnapshotClass")] == ["ebs-snapshots"]
    assert of_kind(render("aws"), "VolumeGroupSnapshotClass") == []
    groups = of_kind(render("local-tuned"), "VolumeGroupSnapshotClass")
    assert [(c["metadata"]["name"], c["deletionPolicy"], c["parameters"]) for c in groups] == [
        ("local-groups", "Retain", {"consistency": "best-effort"})
    ]


def test_group_snapshot_classes_on_the_aws_backend_fail_with_the_reason() -> None:
    values = {**values_of("aws"), "volumeGroupSnapshotClasses": [{"name": "groups"}]}
    result = run_helm(["template", "ballast", "--kube-version", "1.31.0"], values)
    assert result.returncode != 0 and "the aws backend takes no volume group snapshots" in result.stderr
