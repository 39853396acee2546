"""Running `ballast-migrate` on the test bed as the chart deploys it.

`MigrationRelease` renders the chart with the migration controller enabled (a release of its own per
test, in the test's namespace), creates its ServiceAccount, ClusterRole, bindings and the Leases Role
exactly as rendered, and starts controllers as processes with the Deployment's container args,
authenticated as that ServiceAccount (TokenRequest token), as the pod would be. Tests only append
flags (argparse keeps the last value): a free metrics port, and per test a selector, identity, lock
or lease timings, or leader election off. So a rule missing from the chart's RBAC fails a test.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shim.migrate.lock import lease_name
from shim.migrate.objects import ANN_ORIGINAL
from shim.migrate.options import version
from shim.plugins.registry import PLUGINS
from tests.chart.render import run_helm
from tests.conftest import REPO
from tests.e2e.cluster import Cluster
from tests.e2e.deploy import apply_objects, delete_objects
from tests.e2e.kube import Kube, KubeError, csi_drivers, events, leases, phase_is, pvcs, pvs
from tests.e2e.process import Process, free_port
from tests.shim.migrate.samples import sample_pv

Obj = dict[str, Any]
MIGRATE = REPO / ".venv" / "bin" / "ballast-migrate"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
ALL_GATES = (
    "CSIMigration=true,CSIMigrationAWS=true,CSIMigrationGCE=true,CSIMigrationAzureDisk=true,"
    "CSIMigrationAzureFile=true,CSIMigrationOpenStack=true,CSIMigrationvSphere=true,CSIMigrationPortworx=true"
)
NO_GATES = "CSIMigration=false"
MOVE_TIMEOUT = 120  # a claim rebinds at the PV binder's next claim resync (15 s by default)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass
class Controller:
    process: Process
    metrics_port: int
    identity: str

    def metrics(self) -> dict[str, float]:
        """Its /metrics by series name plus labels as written (empty until it serves them)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                found[key] = float(value)
        return found

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            series, _, rest = key.partition("{")
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if series == name and all(pairs.get(k) == v for k, v in labels.items()):
                total += value
        return total


@dataclass
class MigrationRelease:
    cluster: Cluster
    kube: Kube
    namespace: str
    release: str
    objects: list[Obj]
    kubeconfig: Path
    applied: list[Obj] = field(default_factory=list)
    controllers: list[Controller] = field(default_factory=list)

    @property
    def container(self) -> Obj:
        (deployment,) = [
            o
            for o in self.objects
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-migration")
        ]
        container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
        return container

    def chart_argv(self) -> list[str]:
        """The container's command and args, $(POD_NAMESPACE) expanded as the kubelet does."""
        args = [a.replace("$(POD_NAMESPACE)", self.namespace) for a in self.container["args"]]
        assert self.container["command"] == ["ballast-migrate"]
        return [str(MIGRATE), *args]

    def start(self, name: str, *extra: str, env: Mapping[str, str] | None = None) -> Controller:
        """A controller with the chart's args plus `extra`, identity `<name>_<version>` by default."""
        port = free_port()
        pod_env = {"POD_NAME": name, "POD_NAMESPACE": self.namespace, **(env or {})}
        argv = [
            *self.chart_argv(),
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-address=127.0.0.1:{port}",
            *extra,
        ]
        process = self.cluster.processes.start(f"{self.release}-{name}", argv, env=pod_env)
        identity = next((a.split("=", 1)[1] for a in extra if a.startswith("--holder-identity=")), "")
        controller = Controller(process, port, identity or f"{name}_{version()}")
        self.controllers.append(controller)
        return controller

    def one_shot(self, command: str, *extra: str, env: Mapping[str, str] | None = None) -> Process:
        """`ballast-migrate apply|rollback|status` as the same ServiceAccount, in the background."""
        argv = [
            str(MIGRATE),
            command,
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            *extra,
        ]
        return self.cluster.processes.start(f"{self.release}-{command}-{uuid.uuid4().hex[:4]}", argv, env=env)

    def stop_all(self) -> None:
        for controller in self.controllers:
            self.cluster.processes.stop(controller.process)
        self.controllers.clear()


def migration_release(
    cluster: Cluster, namespace: str, values: Mapping[str, Any] | None = None
) -> MigrationRelease:
    """Render the chart (migration enabled) as a fresh release in `namespace` and apply its RBAC."""
    release = unique("m")
    merged = {"migration": {"enabled": True, **dict((values or {}).get("migration", {}))}}
    result = run_helm(
        ["template", release, "--namespace", namespace, "--kube-version", cluster.kubernetes_version],
        {**dict(values or {}), **merged},
    )
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    kube = cluster.admin()
    applied: list[Obj] = []
    rbac = [o for o in objects if o["kind"] in RBAC_KINDS and _for_migration(o)]
    apply_objects(kube, rbac, applied)
    drivers = [_csi_driver(p.csi_name) for p in PLUGINS if not kube.exists(csi_drivers(p.csi_name))]
    apply_objects(kube, drivers, applied)  # installed CSI drivers: the controller skips PVs of others
    account = next(o for o in rbac if o["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = cluster.service_account_kubeconfig(namespace, account)
    return MigrationRelease(cluster, kube, namespace, release, objects, kubeconfig, applied)


def _csi_driver(name: str) -> Obj:
    """The CSIDriver object an installed CSI driver named `name` has."""
    meta = {"name": name}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": meta,
        "spec": {"attachRequired": True},
    }


def _for_migration(obj: Obj) -> bool:
    """The migration controller's objects, plus the Leases Role its RoleBinding names."""
    labels = obj["metadata"].get("labels", {})
    return bool(labels.get("app.kubernetes.io/component") == "migration") or obj["metadata"]["name"].endswith(
        "-leases"
    )


def cleanup(release: MigrationRelease) -> None:
    release.stop_all()
    delete_objects(release.kube, release.applied)


# ---------------------------------------------------------------- PVs and claims


def bound_pair(kube: Kube, namespace: str, pv: Obj, claim: str, storage_class: str | None = None) -> None:
    """Create `pv` pre-bound to claim `claim` and the claim naming it; the PV binder binds them."""
    pv = {**pv, "apiVersion": "v1", "kind": "PersistentVolume"}
    pv["spec"] = {**pv["spec"], "claimRef": {"namespace": namespace, "name": claim}}
    kube.create(pvs(), pv)
    spec = pv["spec"]
    kube.create(
        pvcs(namespace),
        {
            "metadata": {"name": claim},
            "spec": {
                "accessModes": spec["accessModes"],
                "volumeName": pv["metadata"]["name"],
                "storageClassName": storage_class
                if storage_class is not None
                else spec.get("storageClassName", ""),
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "resources": {"requests": {"storage": spec["capacity"]["storage"]}},
            },
        },
    )


def plugin_pvs(kube: Kube, namespace: str, run: str, plugins: Sequence[str]) -> dict[str, str]:
    """One bound sample PV per plugin, labelled e2e-run=`run`; plugin -> PV name (its claim: the plugin)."""
    names = {}
    for plugin in plugins:
        pv = sample_pv(plugin, name=f"{run}-{plugin}")
        pv["metadata"].setdefault("labels", {})["e2e-run"] = run
        bound_pair(kube, namespace, pv, claim=plugin)
        names[plugin] = pv["metadata"]["name"]
    wait_all_bound(kube, namespace, list(plugins))
    return names


def ebs_batch(kube: Kube, namespace: str, run: str, count: int, timeout: float = 60) -> list[str]:
    """`count` bound EBS PVs on distinct volume IDs, labelled e2e-run=`run`, each with a claim named
    like it; waits until all are Bound."""
    names = []
    for i in range(count):
        pv = sample_pv("aws-ebs", name=f"{run}-{i:04d}")
        pv["metadata"]["labels"]["e2e-run"] = run
        pv["spec"]["awsElasticBlockStore"]["volumeID"] = f"aws://us-east-1a/vol-{i:017x}"
        bound_pair(kube, namespace, pv, claim=pv["metadata"]["name"])
        names.append(pv["metadata"]["name"])
    wait_all_bound(kube, namespace, names, timeout)
    return names


def wait_all_bound(kube: Kube, namespace: str, claims: Sequence[str], timeout: float = 60) -> None:
    for claim in claims:
        kube.wait(pvcs(namespace, claim), phase_is("Bound"), timeout, f"claim {claim} to bind")


def is_converted(pv: Obj) -> bool:
    return "csi" in pv["spec"] and ANN_ORIGINAL in pv["metadata"].get("annotations", {})


def converted_and_bound(kube: Kube, namespace: str, claim: str) -> Callable[[Obj], bool]:
    """A `wait` condition on a PV: converted, Bound, its claim Bound to it, and no journal left."""

    def check(pv: Obj) -> bool:
        return is_converted(pv) and _settled(kube, namespace, claim, pv)

    return check


def back_in_tree(kube: Kube, namespace: str, claim: str, source_key: str) -> Callable[[Obj], bool]:
    def check(pv: Obj) -> bool:
        return source_key in pv["spec"] and "csi" not in pv["spec"] and _settled(kube, namespace, claim, pv)

    return check


def _settled(kube: Kube, namespace: str, claim: str, pv: Obj) -> bool:
    """Bound to its claim and back again, the journal finished and the lock released."""
    if pv.get("status", {}).get("phase") != "Bound":
        return False
    if "migration.ballast.io/journal-id" in pv["metadata"].get("annotations", {}):
        return False  # the last step (policy restored, annotation dropped) has not run yet
    pvc = kube.get(pvcs(namespace, claim))
    if pvc["status"].get("phase") != "Bound" or pvc["spec"].get("volumeName") != pv["metadata"]["name"]:
        return False
    return no_lock(kube, namespace, pv["metadata"]["name"])  # the lock goes right after the last step


def no_lock(kube: Kube, namespace: str, pv: str) -> bool:
    return not kube.exists(leases(namespace, lease_name(pv)))


def events_about(kube: Kube, namespace: str, name: str, reason: str = "") -> list[Obj]:
    """Events (from ballast-migrate) about object `name` in `namespace` ("default" for PVs)."""
    return [
        e
        for e in kube.items(events(namespace))
        if e["involvedObject"].get("name") == name
        and e.get("source", {}).get("component") == "ballast-migrate"
        and (not reason or e["reason"] == reason)
    ]


def delete_pv_and_claim(kube: Kube, namespace: str, pv: str, claim: str) -> None:
    """Best-effort cleanup of a test's PV and claim (finalizers released: nothing here owns a disk)."""
    kube.delete(pvcs(namespace, claim))
    try:
        kube.patch(pvs(pv), {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
        kube.delete(pvs(pv))
        kube.patch(pvs(pv), {"metadata": {"finalizers": None}})
    except KubeError as err:
        if err.status != 404:
            raise
