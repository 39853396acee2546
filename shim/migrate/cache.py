"""List + watch caches of API objects (what client-go calls reflectors and stores).

A Reflector lists a resource (paged), replaces its Store with the result, then watches from the list's
resourceVersion, applying ADDED / MODIFIED / DELETED and following BOOKMARKs. A watch that ends is
resumed from the last resourceVersion; an expired one (410 Gone) or any error (a broken stream, an
unexpected exception, whatever its type) relists after a backoff: a reflector never stops before
`stop()`. `synced` is set while the Store follows the API server: it is cleared when a list or watch
fails and set again when the next relist completes, so readers can tell a frozen Store from a live one.
Every change is passed to `on_change(old, new)` (None for a missing side), also for objects that a
relist adds, changes or drops. List items get the apiVersion and kind that list responses omit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from shim.migrate.kube import ApiError, KubeClient, Resource
from shim.migrate.objects import JsonObj

log = logging.getLogger(__name__)
OnChange = Callable[[JsonObj | None, JsonObj | None], None]
WATCH_SECONDS = 300
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)


def key_of(obj: JsonObj) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if namespace else str(metadata["name"])


class Store:
    """Thread-safe objects by key, with a namespace index."""

    def __init__(self) -> None:
        self._items: dict[str, JsonObj] = {}
        self._by_namespace: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> JsonObj | None:
        with self._lock:
            return self._items.get(key)

    def items(self) -> list[JsonObj]:
        with self._lock:
            return list(self._items.values())

    def in_namespace(self, namespace: str) -> list[JsonObj]:
        with self._lock:
            return [self._items[k] for k in self._by_namespace.get(namespace, ())]

    def put(self, obj: JsonObj) -> JsonObj | None:
        key = key_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        with self._lock:
            old = self._items.get(key)
            self._items[key] = obj
            self._by_namespace.setdefault(namespace, set()).add(key)
            return old

    def remove(self, obj: JsonObj) -> JsonObj | None:
        key = key_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        with self._lock:
            self._by_namespace.get(namespace, set()).discard(key)
            return self._items.pop(key, None)

    def keys(self) -> set[str]:
        with self._lock:
            return set(self._items)


class Reflector:
    """Keeps a Store in step with one resource (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        on_change: OnChange,
        namespace: str | None = None,
        **selectors: Any,
    ) -> None:
        self.store = Store()
        self.synced = threading.Event()
        self._client = client
        self._resource = resource
        self._on_change = on_change
        self._namespace = namespace
        self._selectors = selectors
        self._thread = threading.Thread(target=self._run, name=f"reflector-{resource.plural}", daemon=True)
        self._stop = threading.Event()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _typed(self, obj: JsonObj) -> JsonObj:
        obj.setdefault("apiVersion", self._resource.api_version)
        obj.setdefault("kind", self._resource.kind)
        return obj

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist()
                failures = 0
                self._watch(version)
            except Exception as exc:  # whatever broke (a callback too), relist: the thread must not die
                self.synced.clear()
                delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                self._log_failure(exc, delay)
                self._stop.wait(delay)

    def _log_failure(self, exc: Exception, delay: float) -> None:
        plural = self._resource.plural
        if isinstance(exc, ApiError | ValueError | OSError):
            if not (isinstance(exc, ApiError) and exc.gone):
                log.warning("%s: list/watch failed (relisting in %.1fs): %s", plural, delay, exc)
        else:
            log.error("%s: list/watch failed unexpectedly (relisting in %.1fs)", plural, delay, exc_info=exc)

    def _relist(self) -> str:
        items, version = self._client.list_all(self._resource, self._namespace, **self._selectors)
        fresh = {key_of(i): self._typed(i) for i in items}
        for key in self.store.keys() - set(fresh):
            old = self.store.get(key)
            if old is not None:
                self.store.remove(old)
                self._on_change(old, None)
        for obj in fresh.values():
            old = self.store.put(obj)
            if old is None or old["metadata"].get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._on_change(old, obj)
        self.synced.set()
        return version

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            events = self._client.watch(
                self._resource, version, WATCH_SECONDS, self._namespace, **self._selectors
            )
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(
                        int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message", ""))
                    )
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                obj = self._typed(obj)
                if kind == "DELETED":
                    self._on_change(self.store.remove(obj) or obj, None)
                else:
                    self._on_change(self.store.put(obj), obj)
                if self._stop.is_set():
                    return


class Caches(NamedTuple):
    """The controller's caches: PVs (its selector), claims, pods and its lock Leases."""

    pvs: Reflector
    pvcs: Reflector
    pods: Reflector
    leases: Reflector
