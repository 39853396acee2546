"""The chart, deployed onto a test-bed cluster as processes instead of pods.

`helm template` renders the chart; its RBAC, ServiceAccounts, CSIDriver, StorageClasses,
VolumeSnapshotClasses and VolumeGroupSnapshotClasses are created in the API server as they are. Each
container of the controller Deployment (and, on request, of the node DaemonSet) becomes a process started
with exactly the args the chart gives it. The only changes are the ones a kubelet would make:
- `$(VAR)` references are expanded from the container's env (fieldRef spec.nodeName -> the node name,
  secretKeyRef -> a value the test supplies);
- paths under a volumeMount point at the host directory behind the volume (an emptyDir becomes a
  directory in the deployment's temp dir; hostPath volumes are rendered with temp paths already);
- sidecars get `--kubeconfig` for their pod's ServiceAccount, whose token comes from the TokenRequest
  API; the driver gets KUBECONFIG in its environment (the in-cluster config it would read otherwise).
So a rule missing from the chart's RBAC fails the flow that needs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.chart.render import run_helm
from tests.conftest import REPO
from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, KubeError, namespaces, path_of
from tests.e2e.process import Process, Processes, wait_for
from tests.e2e.tools import k8s_binary, snapshot_crds

Obj = dict[str, Any]
DRIVER_BIN = REPO / ".venv" / "bin" / "ballast-csi"  # the image's ENTRYPOINT
RELEASE = "ballast"
# Sidecar container name in the chart -> the binary the test bed built for it.
SIDECAR_BINARIES = {
    "csi-provisioner": "csi-provisioner",
    "csi-attacher": "csi-attacher",
    "csi-resizer": "csi-resizer",
    "csi-snapshotter": "csi-snapshotter",
}
# Containers that need a kubelet (plugin registration, HTTP probes): the test plays their part instead.
KUBELET_FACING = {"node-driver-registrar", "liveness-probe"}
# Kinds taken from the rendered chart and created in the API server (workloads become processes).
APPLIED_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "CSIDriver",
    "StorageClass",
    "VolumeSnapshotClass",
    "VolumeGroupSnapshotClass",
)


def render_chart(values: Mapping[str, Any], namespace: str, kube_version: str) -> list[Obj]:
    """Objects `helm template` renders for `values` (release "ballast" in `namespace`)."""
    result = run_helm(
        ["template", RELEASE, "--namespace", namespace, "--kube-version", kube_version], dict(values)
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[Obj], kind: str, name_suffix: str = "") -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, (
        f"expected one {kind} *{name_suffix}, got {[m['metadata']['name'] for m in matches]}"
    )
    return matches[0]


# Plural resource names of the kinds the harness creates from manifests.
PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "CSIDriver": "csidrivers",
    "StorageClass": "storageclasses",
    "VolumeSnapshotClass": "volumesnapshotclasses",
    "VolumeGroupSnapshotClass": "volumegroupsnapshotclasses",
    "VolumeAttributesClass": "volumeattributesclasses",
    "CustomResourceDefinition": "customresourcedefinitions",
}


def object_path(obj: Obj) -> str:
    return path_of(obj, PLURALS[obj["kind"]])


def apply_objects(kube: Kube, objects: list[Obj], created: list[Obj]) -> None:
    """Create each object (all are new), appending each to `created` as soon as it exists, so a
    failure half-way still lets the caller delete what was made."""
    for obj in objects:
        path = object_path(obj)
        kube.create(path.rsplit("/", 1)[0], obj)
        created.append(obj)


def delete_objects(kube: Kube, objects: list[Obj]) -> None:
    """Delete objects, newest first; missing ones are fine."""
    for obj in reversed(objects):
        kube.delete(object_path(obj))


def install_snapshot_crds(kube: Kube) -> None:
    """The VolumeSnapshot and VolumeGroupSnapshot CRDs from the snapshotter's client module; waits until
    they are served."""
    install_crds(kube, snapshot_crds())


def install_crds(kube: Kube, manifests: Iterable[Path]) -> None:
    """Create each CRD manifest (already there is fine) and wait until the API server serves it."""
    for path in manifests:
        crd = yaml.safe_load(path.read_text())
        try:
            kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except KubeError as err:
            if err.status != 409:
                raise
        kube.wait(
            object_path(crd),
            lambda c: any(
                x["type"] == "Established" and x["status"] == "True"
                for x in (c.get("status") or {}).get("conditions") or []
            ),
            30,
            f"CRD {crd['metadata']['name']} to be established",
        )


@dataclass
class PodProcesses:
    """The processes standing in for one pod of the chart."""

    name: str
    processes: dict[str, Process] = field(default_factory=dict)
    host_dirs: dict[str, Path] = field(default_factory=dict)  # volume name -> host directory


@dataclass
class Deployment:
    """The chart deployed on a cluster: applied objects and the controller (and node) processes."""

    cluster: Cluster
    namespace: str
    objects: list[Obj]
    driver_name: str
    workdir: Path
    processes: Processes
    applied: list[Obj] = field(default_factory=list)
    controller: PodProcesses | None = None
    nodes: dict[str, PodProcesses] = field(default_factory=dict)

    @property
    def controller_endpoint(self) -> str:
        assert self.controller is not None
        return f"unix://{self.controller.host_dirs['socket-dir'] / 'csi.sock'}"

    def node_endpoint(self, node_name: str) -> str:
        return f"unix://{self.nodes[node_name].host_dirs['plugin-dir'] / 'csi.sock'}"

    def diagnose(self) -> str:
        pods = [self.controller, *self.nodes.values()]
        return "\n".join(
            f"--- {p.name}/{name} ---\n{proc.tail(3000)}"
            for p in pods
            if p is not None
            for name, proc in p.processes.items()
        )


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, undefined ones left as they are."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _container_env(
    container: Obj, node_name: str, secrets: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "spec.nodeName", source
            env[item["name"]] = node_name
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"unsupported env source in {container['name']}: {source}")
    return env


def _host_paths(pod_spec: Obj, pod_dir: Path) -> dict[str, Path]:
    """Host directory behind each volume: emptyDir -> a fresh dir, hostPath -> its path."""
    dirs: dict[str, Path] = {}
    for volume in pod_spec.get("volumes", []):
        if "emptyDir" in volume:
            dirs[volume["name"]] = pod_dir / volume["name"]
        elif "hostPath" in volume:
            dirs[volume["name"]] = Path(volume["hostPath"]["path"])
        else:
            continue
        dirs[volume["name"]].mkdir(parents=True, exist_ok=True)
    return dirs


def _remap(text: str, mounts: list[tuple[str, Path]]) -> str:
    """Rewrite container paths (a mountPath at the start of the value, after `=` or after `unix://`)
    to the host directory behind that volume, in one pass (a host path is never rewritten again). As in
    a container, the most specific mount wins: a hostPath mounted at its own path inside an emptyDir's
    mountPath (the data dir under /tmp) stays where it is."""
    moved = {m: str(h) for m, h in mounts}
    if all(m == h for m, h in moved.items()):
        return text
    alternatives = "|".join(re.escape(m) for m in sorted(moved, key=len, reverse=True))
    pattern = re.compile(rf"(?:^|(?<==)|(?<=unix://))({alternatives})(?=/|$)")
    return pattern.sub(lambda m: moved[m.group(1)], text)


def start_pod(
    deployment: Deployment,
    pod_spec: Obj,
    pod_name: str,
    node_name: str,
    secrets: Mapping[str, Mapping[str, str]],
    extra_env: Mapping[str, str],
) -> PodProcesses:
    """Start every container of `pod_spec` that runs without a kubelet, as processes."""
    pod_dir = deployment.workdir / pod_name
    pod = PodProcesses(name=pod_name, host_dirs=_host_paths(pod_spec, pod_dir))
    service_account = pod_spec["serviceAccountName"]
    kubeconfig: Path | None = None
    for container in pod_spec["containers"]:
        name = container["name"]
        if name in KUBELET_FACING:
            continue
        mounts = [(m["mountPath"], pod.host_dirs[m["name"]]) for m in container.get("volumeMounts", [])]
        raw_env = _container_env(container, node_name, secrets)
        env = {k: _remap(v, mounts) for k, v in raw_env.items()}
        args = [_remap(_expand(a, raw_env), mounts) for a in container.get("args", [])]
        if kubeconfig is None and pod_spec.get("automountServiceAccountToken", True) is not False:
            kubeconfig = deployment.cluster.service_account_kubeconfig(
                deployment.namespace, service_account, path=pod_dir / "kubeconfig"
            )
        if name in SIDECAR_BINARIES:
            assert kubeconfig is not None, f"{pod_name}: {name} needs an API token"
            argv = [str(k8s_binary(SIDECAR_BINARIES[name])), *args, f"--kubeconfig={kubeconfig}"]
        elif name == "ballast-plugin":
            argv = [str(DRIVER_BIN), *args]
            if kubeconfig is not None:
                env["KUBECONFIG"] = str(kubeconfig)
            env.update(extra_env)
        else:
            raise AssertionError(f"{pod_name}: no process for container {name!r}")
        pod.processes[name] = deployment.processes.start(f"{pod_name}-{name}", argv, env=env)
    return pod


def wait_socket(process: Process, socket: Path, timeout: float = 30) -> None:
    wait_for(
        lambda: socket.exists() or not process.alive(),
        timeout,
        f"{process.name} to listen on {socket}",
        diagnose=process.tail,
    )
    assert process.alive(), f"{process.name} exited:\n{process.tail()}"


@contextlib.contextmanager
def deployed_chart(
    cluster: Cluster,
    values: Mapping[str, Any],
    namespace: str,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
    driver_env: Mapping[str, str] | None = None,
    controller_node: str = "",
) -> Iterator[Deployment]:
    """Render the chart with `values`, apply its objects in `namespace` and start the controller pod's
    containers as processes. `values` may name `{workdir}` in strings: it is replaced by the
    deployment's temp dir (for the local data dir and the kubelet path). `controller_node` is the Node
    the controller pod is scheduled on (its spec.nodeName). On exit every process is
    stopped, every applied object deleted and the temp dir removed."""
    workdir = Path(tempfile.mkdtemp(prefix="ballast-e2e-deploy-"))
    rendered_values = yaml.safe_load(yaml.safe_dump(dict(values)).replace("{workdir}", str(workdir)))
    kube = cluster.admin()
    processes = Processes(workdir / "logs")
    applied: list[Obj] = []
    try:
        objects = render_chart(rendered_values, namespace, cluster.kubernetes_version)
        csidriver = find(objects, "CSIDriver")
        deployment = Deployment(
            cluster=cluster,
            namespace=namespace,
            objects=objects,
            driver_name=csidriver["metadata"]["name"],
            workdir=workdir,
            processes=processes,
        )
        with contextlib.suppress(KubeError):
            kube.create(namespaces(), {"metadata": {"name": namespace}})
        deployment.applied = applied
        apply_objects(kube, [o for o in objects if o["kind"] in APPLIED_KINDS], applied)
        controller = find(objects, "Deployment", "-controller")
        deployment.controller = start_pod(
            deployment,
            controller["spec"]["template"]["spec"],
            "controller",
            node_name=controller_node,
            secrets=secrets or {},
            extra_env=driver_env or {},
        )
        wait_socket(
            deployment.controller.processes["ballast-plugin"],
            deployment.controller.host_dirs["socket-dir"] / "csi.sock",
        )
        yield deployment
    finally:
        processes.stop_all()
        delete_objects(kube, applied)
        if not os.environ.get("BALLAST_E2E_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
