"""Kubernetes Events about PVs, claims, StorageClasses and pods, from component `ballast-migrate`.

Events of cluster-scoped objects (PVs, StorageClasses) go to namespace `default`, as Kubernetes'
own controllers do. The same (object, reason, message) is posted at most once per `interval`, so a PV
that waits through many resyncs does not flood the cluster. A failed post is logged, never raised:
events are a report, not part of any step. With `post=False` (dry run) events are only logged.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from shim.migrate.kube import EVENTS, ApiError, KubeClient
from shim.migrate.objects import JsonObj

log = logging.getLogger(__name__)
COMPONENT = "ballast-migrate"
NORMAL = "Normal"
WARNING = "Warning"


class Ref(NamedTuple):
    """The object an event is about."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def of(cls, obj: JsonObj, api_version: str = "", kind: str = "") -> Ref:
        metadata = obj.get("metadata") or {}
        return cls(
            str(obj.get("apiVersion") or api_version),
            str(obj.get("kind") or kind),
            str(metadata.get("name", "")),
            str(metadata.get("namespace", "")),
            str(metadata.get("uid", "")),
        )

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


class EventRecorder:
    """Posts deduplicated Events; thread-safe."""

    def __init__(
        self, client: KubeClient | None, identity: str, interval: float = 600.0, post: bool = True
    ) -> None:
        self._client = client
        self._identity = identity
        self._interval = interval
        self._post = post and client is not None
        self._sent: dict[tuple[str, str, str, str], float] = {}
        self._lock = threading.Lock()

    def _due(self, ref: Ref, reason: str, message: str) -> bool:
        key = (ref.uid or str(ref), ref.kind, reason, message)
        now = time.monotonic()
        with self._lock:
            last = self._sent.get(key)
            if last is not None and now - last < self._interval:
                return False
            self._sent[key] = now
            return True

    def emit(self, ref: Ref, kind: str, reason: str, message: str) -> None:
        """Post an event about `ref` (`kind` is Normal or Warning)."""
        if not self._due(ref, reason, message):
            return
        level = logging.WARNING if kind == WARNING else logging.INFO
        log.log(level, "%s: %s: %s", ref, reason, message)
        if not self._post or self._client is None:
            return
        namespace = ref.namespace or "default"
        try:
            self._client.create(EVENTS, self._body(ref, kind, reason, message, namespace), namespace)
        except ApiError as exc:
            log.warning("could not post event %s on %s: %s", reason, ref, exc)

    def _body(self, ref: Ref, kind: str, reason: str, message: str, namespace: str) -> JsonObj:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
        if ref.namespace:
            involved["namespace"] = ref.namespace
        if ref.uid:
            involved["uid"] = ref.uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name[:200]}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
