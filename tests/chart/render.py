"""Rendering the chart with helm for a table of values sets, plus lookups over the rendered objects."""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, require_tool

CHART = REPO / "charts" / "ballast-csi"
# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas we validate against.
KUBE_VERSIONS = ("1.27", "1.37")
RENDER_KUBE_VERSION = "1.31.0"

Obj = dict[str, Any]

# The values sets every chart test runs against; ids are the keys.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "aws": {
        "backend": {
            "name": "aws",
            "aws": {
                "region": "eu-west-1",
                "credentialsSecret": {"name": "aws-secret"},
                "describeBatchWindow": "0.1",
                "extraTags": {"team": "storage", "cost-center": "a b"},
                "k8sTagClusterId": "prod-1",
                "warnOnInvalidTag": True,
            },
        },
        "controller": {
            "serviceAccount": {
                "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/b"}
            }
        },
        "node": {"hostNetwork": True, "maxVolumesPerNode": 25},
        "storageClasses": [
            {
                "name": "gp3",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                "parameters": {"type": "gp3", "csi.storage.k8s.io/fstype": "ext4"},
                "allowedTopologies": [
                    {
                        "matchLabelExpressions": [
                            {"key": "topology.ebs.csi.aws.com/zone", "values": ["eu-west-1a"]}
                        ]
                    }
                ],
            }
        ],
        "volumeSnapshotClasses": [{"name": "ebs-snapshots", "deletionPolicy": "Retain"}],
    },
    "migration": {
        "backend": {"name": "aws"},
        "migration": {
            "enabled": True,
            "featureGates": {
                "CSIMigration": True,
                "CSIMigrationAWS": True,
                "InTreePluginAWSUnregister": False,
            },
        },
    },
    "metrics": {
        "metrics": {
            "enabled": True,
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        },
    },
    "local-tuned": {
        "backend": {"local": {"dataDir": "/srv/ballast", "capacity": "50Gi", "zone": "zone-a"}},
        "driver": {"logFormat": "json", "logLevel": "debug", "workers": 8},
        "node": {
            "kubeletPath": "/var/lib/k0s/kubelet",
            "tolerateAllTaints": False,
            "tolerations": [{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}],
            "allowedPathPrefixes": ["/mnt/extra"],
            "formatConcurrency": 2,
        },
        "controller": {"replicas": 1, "podDisruptionBudget": {"enabled": False}},
        "sidecars": {"snapshotter": {"enabled": False}},
        "migration": {"featureGates": {"CSIMigrationGCE": True}},
        "storageClasses": [
            {
                "name": "ballast-local",
                "volumeBindingMode": "Immediate",
                "allowVolumeExpansion": False,
                "mountOptions": ["noatime"],
                "parameters": {"csi.storage.k8s.io/fstype": "xfs"},
            }
        ],
        "volumeSnapshotClasses": [{"name": "local-snapshots"}],
        "volumeGroupSnapshotClasses": [
            {"name": "local-groups", "deletionPolicy": "Retain", "parameters": {"consistency": "best-effort"}}
        ],
    },
    "snapshot-metadata": {
        "backend": {"name": "aws"},
        "snapshotMetadata": {
            "enabled": True,
            "tlsSecretName": "snapshot-metadata-tls",
            "caCert": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
            "blockType": "fixed",
            "blockSize": "512Ki",
            "resources": {"requests": {"cpu": "10m"}},
        },
    },
}
VALUE_SET_IDS = list(VALUE_SETS)


def helm_bin() -> str:
    return require_tool("helm")


def run_helm(args: list[str], values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run `helm <args> -f <values> <chart>`; never raises on a non-zero exit."""
    with tempfile.TemporaryDirectory(prefix="ballast-chart-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        return subprocess.run(
            [helm_bin(), *args, "-f", str(values_file), str(CHART)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )


def render_values(values: dict[str, Any]) -> list[Obj]:
    """Objects `helm template` renders for `values` over the chart defaults (not cached)."""
    result = run_helm(
        ["template", "ballast", "--namespace", "kube-system", "--kube-version", RENDER_KUBE_VERSION], values
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def _render_cached(set_id: str) -> tuple[Obj, ...]:
    return tuple(render_values(VALUE_SETS[set_id]))


def render(set_id: str) -> list[Obj]:
    """Objects `helm template` renders for one values set (rendered once per session)."""
    helm_bin()  # skip/fail before touching the cache when helm is missing
    return list(_render_cached(set_id))


def values_of(set_id: str) -> Obj:
    """Chart defaults deep-merged with the set's overrides (what the templates saw)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return _merge(defaults, VALUE_SETS[set_id])


def _merge(base: Obj, over: Obj) -> Obj:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def component(obj: Obj) -> str:
    return str(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def only(objects: list[Obj], kind: str, of: str | None = None) -> Obj:
    """The one object of `kind`; a Deployment is the driver's controller unless `of` names another
    component (`migration`: the migration controller's)."""
    if of is None and kind == "Deployment":
        of = "controller"
    found = [o for o in of_kind(objects, kind) if of is None or component(o) == of]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Obj) -> dict[str, Obj]:
    return {c["name"]: c for c in pod_spec(workload)["containers"]}


def resolved_args(container: Obj) -> list[str]:
    """Container args with $(VAR) references expanded from the container's literal env values."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in container["args"]
    ]


def flag_values(args: list[str], flag: str) -> list[str]:
    """Values of `--flag=value` occurrences, in order."""
    prefix = flag + "="
    return [a[len(prefix) :] for a in args if a.startswith(prefix)]


def mounts(container: Obj) -> dict[str, Obj]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def volumes(workload: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod_spec(workload).get("volumes", [])}


def iter_all_containers(workload: Obj) -> Iterator[Obj]:
    spec = pod_spec(workload)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]
