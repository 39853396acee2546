"""Startup taint removal by the node plugin.

A node can be created with the taint `<driver-name>/agent-not-ready:NoExecute` so that no pod using the
driver's volumes lands on it before the driver can mount for them. Once this node plugin serves and
kubelet has registered it (the node's CSINode lists the driver), the plugin removes that taint from its
own Node. It keeps looking for a bounded time (the Node or its CSINode entry may appear late), retries
when the Node changed under it (409), and stops quietly when it has no API access: no in-cluster config
and no KUBECONFIG, a KUBECONFIG it cannot use (one warning), no `kubernetes` client installed, or RBAC
forbids the read or the patch.

The Node name comes from `--node-name` / CSI_NODE_NAME (the chart sets it from spec.nodeName); empty
disables the whole thing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any

log = logging.getLogger("ballast.taint")

TAINT_SUFFIX = "/agent-not-ready"
WATCH_SECONDS = 300.0  # how long to keep looking for the Node / CSINode entry / taint
INTERVAL_SECONDS = 2.0


def startup_taint_key(driver_name: str) -> str:
    return f"{driver_name}{TAINT_SUFFIX}"


class Outcome(Enum):
    REMOVED = "removed"
    ABSENT = "absent"  # registered, and the Node carries no such taint: nothing to do
    WAITING = "waiting"  # Node or CSINode entry not there yet, or a conflict: try again
    FORBIDDEN = "forbidden"  # RBAC refuses: give up quietly


def _clients() -> tuple[Any, Any] | None:
    """CoreV1Api and StorageV1Api from the in-cluster config or KUBECONFIG; None when neither exists."""
    try:
        import kubernetes
    except ImportError:
        log.warning("startup taint not removed: the kubernetes client is not installed")
        return None
    # kubernetes.config is untyped: name the two loaders with their types.
    in_cluster: Callable[[], None] = kubernetes.config.load_incluster_config
    from_file: Callable[[], None] = kubernetes.config.load_kube_config
    try:
        in_cluster()
    except kubernetes.config.ConfigException:
        if not os.environ.get("KUBECONFIG"):
            log.info("startup taint not handled: no in-cluster config and no KUBECONFIG")
            return None
        try:
            from_file()
        except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
            log.warning(
                "startup taint not removed: KUBECONFIG %s is unusable: %s", os.environ["KUBECONFIG"], exc
            )
            return None
    return kubernetes.client.CoreV1Api(), kubernetes.client.StorageV1Api()


class StartupTaintRemover:
    """Removes `<driver>/agent-not-ready` from Node `node_name` once CSINode lists the driver."""

    def __init__(
        self,
        driver_name: str,
        node_name: str,
        clients: tuple[Any, Any] | None = None,
        watch_seconds: float = WATCH_SECONDS,
        interval: float = INTERVAL_SECONDS,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.key = startup_taint_key(driver_name)
        self._clients = clients
        self._watch_seconds = watch_seconds
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="startup-taint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        """Try until the taint is gone (or was never there), RBAC refuses, or the time is up."""
        clients = self._clients or _clients()
        if clients is None:
            return
        deadline = self._watch_seconds
        waited = 0.0
        while not self._stop.is_set():
            try:
                outcome = self.run_once(*clients)
            except Exception as exc:  # the API server unreachable for a moment: keep trying
                log.warning("startup taint: %s", exc)
                outcome = Outcome.WAITING
            if outcome is not Outcome.WAITING:
                return
            if waited >= deadline:
                log.warning(
                    "startup taint %s still on node %s after %.0fs: CSINode does not list %s yet",
                    self.key,
                    self.node_name,
                    deadline,
                    self.driver_name,
                )
                return
            self._stop.wait(self._interval)
            waited += self._interval

    def run_once(self, core: Any, storage: Any) -> Outcome:
        from kubernetes.client import ApiException

        try:
            csinode = storage.read_csi_node(self.node_name)
            drivers = {d.name for d in (csinode.spec.drivers or [])}
            if self.driver_name not in drivers:
                return Outcome.WAITING
            node = core.read_node(self.node_name)
            taints = list(node.spec.taints or [])
            kept = [t for t in taints if t.key != self.key]
            if len(kept) == len(taints):
                return Outcome.ABSENT
            # resourceVersion makes the patch conditional: a Node changed meanwhile answers 409.
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": kept},
            }
            core.patch_node(self.node_name, body)
        except ApiException as exc:
            if exc.status in (401, 403):
                log.warning("startup taint not removed from node %s: %s", self.node_name, exc.reason)
                return Outcome.FORBIDDEN
            if exc.status in (404, 409) or exc.status >= 500:
                return Outcome.WAITING
            raise
        log.info("removed startup taint %s from node %s", self.key, self.node_name)
        return Outcome.REMOVED
