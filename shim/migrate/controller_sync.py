"""What the controller does for one key (see controller.py): decide by the gates, then act."""

from __future__ import annotations

import logging
import threading

from shim import TranslationError
from shim.gates import PLUGIN_GATES, FeatureGates
from shim.manifests import IN_TREE_SOURCES, in_tree_source_key
from shim.migrate import objects as o
from shim.migrate.actor import Actor
from shim.migrate.cache import Caches
from shim.migrate.engine import WAIT_REASONS, Outcome
from shim.migrate.events import NORMAL, WARNING, Ref
from shim.migrate.journal import CONVERT, ROLLBACK
from shim.migrate.kube import STORAGE_CLASSES
from shim.migrate.lock import lease_name
from shim.migrate.twins import ANN_PLUGIN, is_twin
from shim.migrate.usage import is_terminated

log = logging.getLogger(__name__)


class Syncer:
    """Per-key decisions of one controller; thread-safe (workers share it)."""

    def __init__(self, caches: Caches, actor: Actor, gates: FeatureGates, dry_run: bool) -> None:
        self._caches = caches
        self._actor = actor
        self._gates = gates
        self._dry_run = dry_run
        self.inline: dict[str, list[str]] = {}  # pod key -> plugins of its in-tree inline volumes
        self.twins: set[str] = set()  # names of our twins seen in the last list
        self._waiting: dict[str, str] = {}  # PV key -> why it waits
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- PVs

    def _converted_plugin(self, pv: o.JsonObj) -> str | None:
        """The in-tree plugin a converted PV came from, by its CSI driver (its record may be broken)."""
        try:
            return self._actor.translator.get_in_tree_name_from_csi_name(o.csi_driver(pv) or "")
        except TranslationError:
            return None

    def direction(self, pv: o.JsonObj) -> str | None:
        """convert, rollback, or None, for a PV as the gates decide."""
        plugin = o.in_tree_plugin(pv)
        if plugin is not None:
            return CONVERT if self._gates.is_migration_enabled(plugin) else None
        if o.ANN_ORIGINAL not in o.annotations_of(pv):
            return None
        plugin = self._converted_plugin(pv)
        if plugin is not None and self._gates.is_migration_enabled(plugin):
            return None
        if plugin is not None and self._gates.is_plugin_unregistered(plugin):
            message = (
                f"not rolled back: {PLUGIN_GATES[plugin].unregister} is on, so nothing would serve "
                "the in-tree PV; turn it off first"
            )
            self._actor.events.emit(Ref.of(pv, "v1", "PersistentVolume"), WARNING, "RollbackBlocked", message)
            return None
        return ROLLBACK

    def pv(self, name: str) -> Outcome | None:
        pv = self._caches.pvs.store.get(name)
        lease = self._caches.leases.store.get(f"{self._actor.locks.namespace}/{lease_name(name)}")
        direction = None if pv is None else self.direction(pv)
        if direction is None and lease is None:
            return None
        if self._dry_run:
            if direction is not None:
                outcome = self._actor.engine.plan(name, direction)
                log.info("dry run: PV %s: %s: %s", name, outcome.result, outcome.message)
            return None
        return self._actor.engine.run(name, direction)

    def note_waiting(self, key: str, reason: str | None) -> None:
        """Record why PV key `key` waits (engine.WAIT_REASONS; None: it does not) and set the gauge."""
        with self._lock:
            if reason is None:
                self._waiting.pop(key, None)
            else:
                self._waiting[key] = reason
            counts = {r: 0 for r in WAIT_REASONS}
            for why in self._waiting.values():
                counts[why] = counts.get(why, 0) + 1
        for why, count in counts.items():
            self._actor.metrics.waiting.labels(why).set(count)

    # ---------------------------------------------------------------- StorageClasses

    def list_classes(self) -> list[o.JsonObj]:
        """Every StorageClass (listed: the controller may not watch them); remembers our twins."""
        classes, _ = self._actor.client.list_all(STORAGE_CLASSES)
        with self._lock:
            self.twins = {o.name_of(sc) for sc in classes if is_twin(sc)}
        return classes

    def storage_class(self, name: str) -> None:
        sc = self._actor.client.get_or_none(STORAGE_CLASSES, name)
        if sc is None:
            return
        if is_twin(sc):
            plugin = o.annotations_of(sc).get(ANN_PLUGIN, "")
            if not self._gates.is_migration_enabled(plugin):
                self._remove_twin(sc)
            return
        provisioner = str(sc.get("provisioner", ""))
        if not self._gates.is_migration_enabled(provisioner):
            return
        if self._dry_run:
            log.info("dry run: StorageClass %s: would get twin %s", name, self._actor.twins.desired(sc))
            return
        result = self._actor.twins.ensure(sc)
        with self._lock:
            self.twins.add(result.twin)
        log.log(
            logging.INFO if result.result == "done" else logging.DEBUG, "StorageClass %s: %s", name, result
        )

    def _remove_twin(self, twin: o.JsonObj) -> None:
        name = o.name_of(twin)
        claims = [
            f"{(c.get('metadata') or {}).get('namespace')}/{o.name_of(c)}"
            for c in self._caches.pvcs.store.items()
            if (c.get("spec") or {}).get("storageClassName") == name
        ]
        if self._dry_run:
            log.info("dry run: twin %s: would be removed once unused (%d claims use it)", name, len(claims))
            return
        result = self._actor.twins.remove(twin, claims)
        log.info("twin %s: %s", name, result.message)

    # ---------------------------------------------------------------- inline pod volumes

    def pod(self, key: str) -> None:
        pod = self._caches.pods.store.get(key)
        found: list[tuple[str, str]] = []
        if pod is not None and not is_terminated(pod):
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                source = in_tree_source_key(volume)
                if source is not None:
                    found.append((str(volume.get("name", "")), IN_TREE_SOURCES[source].plugin))
        self._count_inline(key, [plugin for _, plugin in found])
        for volume, plugin in found:
            if self._gates.is_migration_enabled(plugin) and pod is not None:
                driver = self._actor.translator.get_csi_name_from_in_tree_name(plugin)
                message = (
                    f"inline volume {volume} uses in-tree {plugin}; inline volumes are not converted "
                    f"(Kubernetes serves them through {driver}); use a PersistentVolumeClaim to have it "
                    "converted"
                )
                self._actor.events.emit(Ref.of(pod, "v1", "Pod"), NORMAL, "InlineInTreeVolume", message)

    def _count_inline(self, key: str, plugins: list[str]) -> None:
        with self._lock:
            if plugins:
                self.inline[key] = plugins
            else:
                self.inline.pop(key, None)
            counts = {plugin: 0 for plugin in PLUGIN_GATES}
            for found in self.inline.values():
                for plugin in found:
                    counts[plugin] += 1
        for plugin, count in counts.items():
            self._actor.metrics.inline.labels(plugin).set(count)
