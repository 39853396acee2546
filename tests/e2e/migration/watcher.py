"""An independent witness of what happens to PVs: a watch (official kubernetes client) that counts
DELETED and ADDED events per PV name, so "converted exactly once" is checked by the API server's own
event stream, not by the controller's bookkeeping."""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType
from typing import Any

import kubernetes

from tests.e2e.cluster import Cluster


class PVWatch:
    """Context manager: counts watch events on PVs matching `selector` until it exits."""

    def __init__(self, cluster: Cluster, selector: str) -> None:
        configuration = kubernetes.client.Configuration()
        loaders: Any = kubernetes.config  # untyped package functions
        # persist_config=False: the default rewrites the kubeconfig, which other readers may see empty.
        loaders.load_kube_config(
            config_file=str(cluster.admin_kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        self._api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
        self._selector = selector
        watch_module: Any = kubernetes.watch  # an untyped class
        self._watch = watch_module.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()
        self.deleted: Counter[str] = Counter()
        self.added: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self._version = ""

    def __enter__(self) -> PVWatch:
        listed: Any = self._api.list_persistent_volume(label_selector=self._selector)
        self._version = str(listed.metadata.resource_version)
        self._thread.start()
        return self

    def _run(self) -> None:
        """Watch from the last version seen; a dropped connection resumes there (no event is lost),
        an expired version (410) is an error the test reports."""
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                    self._api.list_persistent_volume,
                    label_selector=self._selector,
                    resource_version=self._version,
                    timeout_seconds=5,
                ):
                    self._count(event)
            except kubernetes.client.exceptions.ApiException as exc:
                self.errors.append(exc)
                return
            except Exception:  # a connection cut: resume from self._version
                continue

    def _count(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        self._version = obj.metadata.resource_version
        name = obj.metadata.name
        if event["type"] == "DELETED":
            self.deleted[name] += 1
        elif event["type"] == "ADDED":
            self.added[name] += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(15)
