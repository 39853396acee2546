"""A real Kubernetes control plane as plain processes: etcd, kube-apiserver, kube-controller-manager.

No kubelet, no scheduler, no container engine: tests play their parts where a flow needs them.
Everything a cluster creates lives under one fresh temp dir (certs, etcd data, kubeconfigs, logs) and
on ports picked free at start, so several clusters (other engineers' test runs) can share this machine.

    with running_cluster() as cluster:
        kube = cluster.admin()                     # tests/e2e/kube.py: JSON dicts in and out
        kubeconfig = cluster.service_account_kubeconfig("kube-system", "my-sa", create=True)
        proc = cluster.processes.start("my-controller", [..., f"--kubeconfig={kubeconfig}"])

Leaving the `with` block (normally or by an exception) stops every process in `cluster.processes`
(SIGTERM to each process group, then SIGKILL) and removes the temp dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from tests.e2e import pki
from tests.e2e.kube import Kube, KubeError, namespaces, service_accounts
from tests.e2e.process import Process, Processes, free_port, wait_for
from tests.e2e.tools import etcd_binary, k8s_binary, versions

# Controllers kube-controller-manager runs: everything it runs by default, except the node lifecycle
# controller. With no kubelet no Node ever reports Ready; that controller would taint every Node
# unreachable and evict whatever a test binds to it. The PV binder, pv/pvc-protection, attach-detach,
# expand, ServiceAccount and namespace controllers all run, as in a real cluster.
# kubernetes.config is untyped; this names the one function used, with its type.
_client_from_config: Callable[..., kubernetes.client.ApiClient] = kubernetes.config.new_client_from_config

CONTROLLERS = "*,-node-lifecycle-controller"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_ATTEMPTS = 3  # a port picked free can be taken before the process binds it: retry with new ports


@dataclass
class Cluster:
    """A running control plane. Paths are inside `root`; `processes` owns every child started for it."""

    root: Path
    server: str  # https://127.0.0.1:<port>
    ca_file: Path
    admin_kubeconfig: Path
    kubernetes_version: str
    processes: Processes
    etcd: Process
    apiserver: Process
    controller_manager: Process

    def admin(self) -> Kube:
        """A REST client authenticated as cluster admin (system:masters)."""
        return Kube.from_kubeconfig(self.admin_kubeconfig)

    def admin_api(self) -> kubernetes.client.ApiClient:
        """The official client, as cluster admin (for code under test that takes an ApiClient)."""
        return _client_from_config(config_file=str(self.admin_kubeconfig))

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        path: Path | None = None,
        create: bool = False,
        expiration_seconds: int = 6 * 3600,
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name`, with a token from the
        TokenRequest API (what a pod's projected token is). `create=True` creates the ServiceAccount
        (and the namespace) when missing; otherwise a missing one raises KubeError 404. Written to
        `path` (default: under root)."""
        admin = self.admin()
        if create:
            for collection, body in (
                (namespaces(), {"metadata": {"name": namespace}}),
                (service_accounts(namespace), {"metadata": {"name": name}}),
            ):
                try:
                    admin.create(collection, body)
                except KubeError as err:
                    if err.status != 409:
                        raise
        request = {"spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": expiration_seconds}}
        token = admin.create(f"{service_accounts(namespace, name)}/token", request)["status"]["token"]
        target = path or self.root / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig"
        return write_kubeconfig(target, self.server, self.ca_file, {"token": token}, f"{namespace}-{name}")

    def diagnose(self) -> str:
        """The ends of the control plane's logs, for failure messages."""
        return "\n".join(
            f"--- {p.name} ---\n{p.tail(2000)}" for p in (self.etcd, self.apiserver, self.controller_manager)
        )


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: dict[str, str], name: str) -> Path:
    """Write a one-context kubeconfig (`user` holds token or client-certificate/client-key paths)."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _http_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _start_etcd(processes: Processes, data_dir: Path) -> tuple[Process, str]:
    for attempt in range(START_ATTEMPTS):
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        proc = processes.start(
            f"etcd-{attempt}",
            [
                str(etcd_binary()),
                "--name=e2e",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                "--listen-metrics-urls=",
                "--logger=zap",
                "--log-level=warn",
            ],
        )
        deadline = time.monotonic() + 30
        while proc.alive() and time.monotonic() < deadline:
            health = _http_json(f"{client}/health")
            if isinstance(health, dict) and health.get("health") == "true":
                return proc, client
            time.sleep(0.1)
        processes.stop(proc)
        if "address already in use" not in proc.tail():
            raise RuntimeError(f"etcd did not start:\n{proc.tail()}")
        shutil.rmtree(data_dir, ignore_errors=True)
    raise RuntimeError("etcd: no free ports after retries")


def _start_apiserver(
    processes: Processes,
    root: Path,
    etcd_url: str,
    ca: pki.CertificateAuthority,
    sa_keys: pki.KeyPair,
    admin: pki.KeyPair,
    feature_gates: str,
    extra_args: Sequence[str],
) -> tuple[Process, str]:
    serving = ca.issue(
        "apiserver",
        "kube-apiserver",
        server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        server_ips=("127.0.0.1",),
    )
    ctx = ssl.create_default_context(cafile=str(ca.cert_file))
    ctx.load_cert_chain(str(admin.cert), str(admin.key))
    for attempt in range(START_ATTEMPTS):
        port = free_port()
        argv = [
            str(k8s_binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={root / 'apiserver-certs'}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert_file}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa_keys.cert}",
            f"--service-account-signing-key-file={sa_keys.key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC,Node",
            # No Service for the API server itself: nothing here routes to a ClusterIP.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]
        if feature_gates:
            argv.append(f"--feature-gates={feature_gates}")
        argv += list(extra_args)
        proc = processes.start(f"kube-apiserver-{attempt}", argv)
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while proc.alive() and time.monotonic() < deadline:
            if _https_ok(f"{url}/readyz", ctx):
                return proc, url
            time.sleep(0.2)
        processes.stop(proc)
        if "address already in use" not in proc.tail():
            raise RuntimeError(f"kube-apiserver did not start:\n{proc.tail()}")
    raise RuntimeError("kube-apiserver: no free port after retries")


def _default_service_account_exists(admin_kubeconfig: Path) -> bool:
    try:
        return Kube.from_kubeconfig(admin_kubeconfig).exists(service_accounts("default", "default"))
    except (KubeError, OSError):
        return False


@contextlib.contextmanager
def running_cluster(
    feature_gates: str = "",
    apiserver_args: Sequence[str] = (),
    controller_manager_args: Sequence[str] = (),
) -> Iterator[Cluster]:
    """Boot etcd + kube-apiserver + kube-controller-manager; stop them and remove every file on exit.

    Set BALLAST_E2E_KEEP=1 to keep the temp dir (logs, certs) for debugging."""
    root = Path(tempfile.mkdtemp(prefix="ballast-e2e-"))
    processes = Processes(root / "logs")
    try:
        ca = pki.CertificateAuthority(_mkdir(root / "pki"))
        sa_keys = pki.service_account_keys(root / "pki")
        admin = ca.issue("admin", "e2e-admin", organizations=("system:masters",))
        kcm = ca.issue("kube-controller-manager", "system:kube-controller-manager")
        etcd, etcd_url = _start_etcd(processes, root / "etcd")
        apiserver, server = _start_apiserver(
            processes, root, etcd_url, ca, sa_keys, admin, feature_gates, apiserver_args
        )
        admin_kubeconfig = write_kubeconfig(
            root / "kubeconfigs" / "admin.kubeconfig",
            server,
            ca.cert_file,
            {"client-certificate": str(admin.cert), "client-key": str(admin.key)},
            "admin",
        )
        kcm_kubeconfig = write_kubeconfig(
            root / "kubeconfigs" / "kube-controller-manager.kubeconfig",
            server,
            ca.cert_file,
            {"client-certificate": str(kcm.cert), "client-key": str(kcm.key)},
            "kube-controller-manager",
        )
        controller_manager = processes.start(
            "kube-controller-manager",
            [
                str(k8s_binary("kube-controller-manager")),
                f"--kubeconfig={kcm_kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--controllers={CONTROLLERS}",
                # Each controller acts as its own ServiceAccount with its bootstrap RBAC role, as in a
                # kubeadm cluster; the token controller signs with the API server's key.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa_keys.key}",
                f"--root-ca-file={ca.cert_file}",
                *([f"--feature-gates={feature_gates}"] if feature_gates else []),
                "--v=1",
                *controller_manager_args,
            ],
        )
        cluster = Cluster(
            root=root,
            server=server,
            ca_file=ca.cert_file,
            admin_kubeconfig=admin_kubeconfig,
            kubernetes_version=versions()["KUBERNETES_VERSION"],
            processes=processes,
            etcd=etcd,
            apiserver=apiserver,
            controller_manager=controller_manager,
        )
        # The ServiceAccount controller creating "default" in "default" shows the controller manager is
        # up, authenticated and running its controllers.
        wait_for(
            lambda: controller_manager.alive() and _default_service_account_exists(admin_kubeconfig),
            60,
            "kube-controller-manager to create the default ServiceAccount",
            interval=0.2,
            diagnose=cluster.diagnose,
        )
        yield cluster
    finally:
        processes.stop_all()
        if not os.environ.get("BALLAST_E2E_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
