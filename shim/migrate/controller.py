"""The long-running migration controller.

It keeps list+watch caches of PVs, PVCs, Pods, VolumeAttachments, StorageClasses and its own lock
Leases, and puts keys on a work queue whenever something relevant changes, plus every
--resync-period. Workers (--workers) take keys one at a time each:

- `pv/<name>`: an in-tree PV whose plugin's gate is on is converted; a converted PV (it carries a
  record) whose gate is off is rolled back, unless the plugin's InTreePlugin<X>Unregister gate is on
  (nothing would serve the in-tree PV then: Warning Event); a journal in the PV's Lease is finished
  first whatever the gates say. Pods, attachments and claims re-queue the PVs they concern, so a PV
  that waited for being in use moves as soon as it is free.
- `sc/<name>`: an in-tree StorageClass whose gate is on gets its twin; our twin whose gate is off is
  removed once no PVC names it. StorageClasses are listed at start and every resync, and read one by
  one (RBAC gives the controller no watch on them); a PVC naming a twin re-queues that twin.
- `pod/<ns>/<name>`: in-tree inline volumes are counted and reported (Event once per pod), never moved.

While any cache is not synced (it relists after a broken watch, e.g. an API server restart), workers
act on nothing: each key they take is put back for later, since a frozen cache could hide a new user
of a PV. A worker never dies of an error: it is logged, and the key retried with backoff. A PV that was
skipped (bad input) or refused (left for a person) is held back until it changes or the next resync,
so two controllers never bounce a refused journal between them.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

from shim.gates import FeatureGates
from shim.manifests import in_tree_source_key
from shim.migrate import kube
from shim.migrate import objects as o
from shim.migrate.actor import Actor, build
from shim.migrate.cache import Caches, Reflector, key_of
from shim.migrate.controller_sync import Syncer
from shim.migrate.engine import BUSY, FAILED, PENDING, REFUSED, SKIPPED, WAITING, Outcome
from shim.migrate.lock import ANN_JOURNAL, LOCK_SELECTOR, has_journal, holder_of, pv_of
from shim.migrate.metrics import Metrics
from shim.migrate.usage import UsageFrom, claims_of_pod
from shim.migrate.workqueue import WorkQueue

log = logging.getLogger(__name__)
PENDING_RETRY = 5.0
UNSYNCED_RETRY = 1.0
MAX_BACKOFF = 120.0
BACKOFF_DOUBLINGS = 7  # 2**7 s passes MAX_BACKOFF: the exponent stops there (no float overflow, ever)


class StoreClaims:
    """Claims looked up in the PVC cache."""

    def __init__(self, reflector: Reflector) -> None:
        self._store = reflector.store

    def get(self, namespace: str, name: str) -> o.JsonObj | None:
        return self._store.get(f"{namespace}/{name}")


class Controller:
    def __init__(self, client: kube.KubeClient, metrics: Metrics, args: argparse.Namespace) -> None:
        self._args = args
        self._gates: FeatureGates = args.feature_gates
        self._queue = WorkQueue()
        self._claim_to_pv: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        self._held: dict[str, float] = {}  # key -> monotonic time until which it is not retried
        self.pvs = Reflector(client, kube.PVS, self._on_pv, labelSelector=args.selector or None)
        self.pvcs = Reflector(client, kube.PVCS, self._on_pvc)
        self.pods = Reflector(client, kube.PODS, self._on_pod)
        self.attachments = Reflector(client, kube.VOLUME_ATTACHMENTS, self._on_attachment)
        self.leases = Reflector(
            client, kube.LEASES, self._on_lease, args.namespace, labelSelector=LOCK_SELECTOR
        )
        claims = StoreClaims(self.pvcs)
        usage = UsageFrom(self.attachments.store.items, self.pods.store.in_namespace, claims)
        self.actor: Actor = build(args, client, metrics, claims, usage)
        caches = Caches(self.pvs, self.pvcs, self.pods, self.leases)
        self._sync = Syncer(caches, self.actor, self._gates, args.dry_run)
        self._workers: list[threading.Thread] = []

    @property
    def reflectors(self) -> tuple[Reflector, ...]:
        return (self.pvs, self.pvcs, self.pods, self.attachments, self.leases)

    # ---------------------------------------------------------------- events -> keys

    def _on_pv(self, old: o.JsonObj | None, new: o.JsonObj | None) -> None:
        for obj, present in ((old, False), (new, True)):
            claim = o.claim_ref(obj) if obj is not None else None
            if claim is not None:
                key = f"{claim.namespace}/{claim.name}"
                if present:
                    self._claim_to_pv[key] = o.name_of(obj or {})
                elif self._claim_to_pv.get(key) == o.name_of(obj or {}):
                    del self._claim_to_pv[key]
        key = "pv/" + o.name_of(new or old or {})
        self._held.pop(key, None)  # it changed: whatever held it back may be fixed
        self._queue.add(key)

    def _on_pvc(self, old: o.JsonObj | None, new: o.JsonObj | None) -> None:
        obj = new or old or {}
        pv = (obj.get("spec") or {}).get("volumeName") or self._claim_to_pv.get(key_of(obj))
        if pv:
            self._queue.add(f"pv/{pv}")
        storage_class = (obj.get("spec") or {}).get("storageClassName")
        if storage_class in self._sync.twins:
            self._queue.add(f"sc/{storage_class}")

    def _on_pod(self, old: o.JsonObj | None, new: o.JsonObj | None) -> None:
        obj = new or old or {}
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        for claim in claims_of_pod(obj):
            pv = self._claim_to_pv.get(f"{namespace}/{claim}")
            if pv:
                self._queue.add(f"pv/{pv}")
        volumes = (obj.get("spec") or {}).get("volumes") or []
        if any(in_tree_source_key(v) for v in volumes) or key_of(obj) in self._sync.inline:
            self._queue.add(f"pod/{key_of(obj)}")

    def _on_attachment(self, old: o.JsonObj | None, new: o.JsonObj | None) -> None:
        source = ((new or old or {}).get("spec") or {}).get("source") or {}
        if source.get("persistentVolumeName"):
            self._queue.add(f"pv/{source['persistentVolumeName']}")

    def _on_lease(self, old: o.JsonObj | None, new: o.JsonObj | None) -> None:
        """A lock with an unfinished journal lost its holder (released, paused): pick it up. Leases
        held by someone are left to expire (the busy retry and the resync come back to them). A PV
        whose last attempt failed waits for its backoff: each failed attempt releases its lock, and
        that release must not start the next attempt at once."""
        if new is not None and not holder_of(new) and o.annotations_of(new).get(ANN_JOURNAL):
            key = f"pv/{pv_of(new)}"
            if key not in self._failures:
                self._queue.add(key)

    def enqueue_all(self) -> None:
        for pv in self.pvs.store.items():
            self._queue.add("pv/" + o.name_of(pv))
        for lease in self.leases.store.items():
            if has_journal(lease):
                self._queue.add(f"pv/{pv_of(lease)}")
        for sc in self._sync.list_classes():
            self._queue.add("sc/" + o.name_of(sc))
        for pod in self.pods.store.items():
            if any(in_tree_source_key(v) for v in (pod.get("spec") or {}).get("volumes") or []):
                self._queue.add(f"pod/{key_of(pod)}")

    # ---------------------------------------------------------------- running

    def synced(self) -> bool:
        """Every cache follows the API server (none is relisting)."""
        return all(r.synced.is_set() for r in self.reflectors)

    def healthy(self) -> bool:
        """True while every started cache and worker runs (a standby that leads nothing is healthy)."""
        started = [r for r in self.reflectors if r.started]
        return all(r.alive() for r in started) and all(w.is_alive() for w in self._workers)

    def run(self, stopping: threading.Event) -> None:
        """Work until `stopping` is set (leader lost or shutdown), then stop the workers."""
        for reflector in self.reflectors:
            reflector.start()
        while not self.synced():
            if stopping.wait(0.1):
                return
        log.info(
            "caches synced; %d PVs, %d lock Leases",
            len(self.pvs.store.keys()),
            len(self.leases.store.keys()),
        )
        self.enqueue_all()
        self._workers = [
            threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
            for i in range(self._args.workers)
        ]
        for worker in self._workers:
            worker.start()
        next_resync = time.monotonic() + self._args.resync_period
        while not stopping.wait(1.0):
            if time.monotonic() >= next_resync:
                self.enqueue_all()
                next_resync = time.monotonic() + self._args.resync_period
        self._queue.shutdown()
        for worker in self._workers:
            worker.join()
        self.actor.engine.release_held()
        for reflector in self.reflectors:
            reflector.stop()

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            try:
                self._process(key)
            except Exception:
                log.exception("processing %s failed; retrying later", key)
                self._retry(key)
            finally:
                self._queue.done(key)

    def _retry(self, key: str) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        self._queue.add_after(key, min(MAX_BACKOFF, 2.0 ** min(failures, BACKOFF_DOUBLINGS)))

    def _process(self, key: str) -> None:
        if not self.synced():
            self._queue.add_after(key, UNSYNCED_RETRY)
            return
        if self._held.get(key, 0.0) > time.monotonic():
            return
        kind, _, name = key.partition("/")
        if kind == "pv":
            self._after(key, self._sync.pv(name))
        elif kind == "sc":
            self._sync.storage_class(name)
        elif kind == "pod":
            self._sync.pod(name)

    def _after(self, key: str, outcome: Outcome | None) -> None:
        result = None if outcome is None else outcome.result
        self._sync.note_waiting(key, outcome.reason if outcome is not None and result == WAITING else None)
        if result == FAILED:
            self._retry(key)
            return
        self._failures.pop(key, None)
        if result in (REFUSED, SKIPPED):
            self._held[key] = time.monotonic() + self._args.resync_period * 0.9
        elif result == PENDING:
            self._queue.add_after(key, PENDING_RETRY)
        elif result == BUSY:
            self._queue.add_after(key, self._args.lock_duration / 2)
