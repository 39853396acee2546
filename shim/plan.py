"""Migration planning: which in-tree volumes move to which CSI driver, and what blocks them.

`Planner.plan(manifest)` returns one PlanItem per PV, StorageClass or pod volume that uses an in-tree
plugin, under given feature gates and the set of installed CSI drivers. Pure: no I/O, no printing.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from shim import TranslationError, Translator
from shim.gates import PLUGIN_GATES, FeatureGates
from shim.manifests import IN_TREE_SOURCES, JsonObj, Manifest, in_tree_source_key, pod_spec

# StorageClass parameter prefix the external-provisioner consumes itself; never reaches the driver.
PROVISIONER_PREFIX = "csi.storage.k8s.io/"

# Drivers known to refuse unknown StorageClass parameters (keys compared lower-cased): the keys they accept.
# Drivers not listed here are not checked.
DRIVER_PARAMETERS: Mapping[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "ebs.csi.aws.com": (
        frozenset(
            {
                "type",
                "iops",
                "iopspergb",
                "allowautoiopspergbincrease",
                "allowautoiopsincreaseonmodify",
                "throughput",
                "encrypted",
                "kmskeyid",
                "blockexpress",
                "volumeinitializationrate",
                "blockattachuntilinitialized",
                "blocksize",
                "inodesize",
                "bytesperinode",
                "numberofinodes",
                "ext4bigalloc",
                "ext4clustersize",
                "ext4encryptionsupport",
                "fstype",
            }
        ),
        ("tagspecification",),
    ),
    "pd.csi.storage.gke.io": (
        frozenset(
            {
                "type",
                "replication-type",
                "disk-encryption-kms-key",
                "labels",
                "provisioned-iops-on-create",
                "provisioned-throughput-on-create",
                "resource-tags",
                "storage-pools",
                "enable-confidential-storage",
                "availability-class",
                "data-cache-size",
                "data-cache-mode",
                "enable-multi-zone-provisioning",
                "use-allowed-disk-topology",
                "access-mode",
            }
        ),
        (),
    ),
}


@dataclass
class PlanItem:
    """One PV, StorageClass or pod volume that uses an in-tree plugin."""

    kind: str
    name: str
    source: str
    plugin: str
    migration: str  # "off", "on" or "complete"
    driver: str
    volume: str = ""
    becomes: JsonObj = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)

    @property
    def object(self) -> str:
        text = f"{self.kind} {self.name}"
        return f"{text} volume {self.volume}" if self.volume else text

    def to_json(self) -> JsonObj:
        return {
            "kind": self.kind,
            "name": self.name,
            "volume": self.volume,
            "source": self.source,
            "plugin": self.plugin,
            "migration": self.migration,
            "csiDriver": self.driver,
            "becomes": self.becomes,
            "blockers": list(self.blockers),
        }


def _migration_state(gates: FeatureGates, plugin: str) -> str:
    if gates.is_migration_complete(plugin):
        return "complete"
    return "on" if gates.is_migration_enabled(plugin) else "off"


def _display_name(manifest: Manifest) -> str:
    return f"{manifest.namespace}/{manifest.name}" if manifest.namespace else manifest.name


def _parameter_blockers(driver: str, parameters: Mapping[str, str]) -> list[str]:
    accepted = DRIVER_PARAMETERS.get(driver)
    if accepted is None:
        return []
    keys, prefixes = accepted
    rejected = [
        key
        for key in parameters
        if not key.startswith(PROVISIONER_PREFIX)
        and key.lower() not in keys
        and not key.lower().startswith(prefixes)
    ]
    return [f"parameter {key!r} is not accepted by {driver}" for key in rejected]


def missing_driver(driver: str, installed: Container[str]) -> str | None:
    """The blocker of a volume whose CSI driver is not installed (no CSIDriver object), or None. The
    migration engine asks the same before it converts a PV (`installed` looked up in the cluster)."""
    if driver in installed:
        return None
    return f"CSI driver {driver} is not installed (no CSIDriver object)"


class Planner:
    """Builds PlanItems for manifests under given gates and installed CSI drivers."""

    def __init__(self, translator: Translator, gates: FeatureGates, installed_drivers: set[str]) -> None:
        self._translator = translator
        self._gates = gates
        self._installed = installed_drivers

    def _item(self, manifest: Manifest, plugin: str, volume: str = "") -> PlanItem:
        driver = self._translator.get_csi_name_from_in_tree_name(plugin)
        item = PlanItem(
            kind=manifest.kind,
            name=_display_name(manifest),
            source=str(manifest.location),
            plugin=plugin,
            migration=_migration_state(self._gates, plugin),
            driver=driver,
            volume=volume,
        )
        missing = missing_driver(driver, self._installed)
        if missing is not None:
            item.blockers.append(missing)
        if self._gates.is_plugin_unregistered(plugin) and not self._gates.is_migration_enabled(plugin):
            unregister = PLUGIN_GATES[plugin].unregister
            item.blockers.append(f"{unregister} is on but migration is off: nothing would serve this volume")
        return item

    def _translate(self, item: PlanItem, call: Callable[[], JsonObj]) -> JsonObj | None:
        try:
            return call()
        except TranslationError as exc:
            item.blockers.insert(0, f"translation fails: {exc}")
            return None

    def _pv_becomes(self, pv: JsonObj | None) -> JsonObj:
        if pv is None:
            return {}
        csi = pv.get("spec", {}).get("csi", {})
        return {
            k: csi[k]
            for k in ("driver", "volumeHandle", "fsType", "readOnly", "volumeAttributes")
            if k in csi
        }

    def plan(self, manifest: Manifest) -> list[PlanItem]:
        obj, group, kind = manifest.obj, manifest.group, manifest.kind
        if (group, kind) == ("", "PersistentVolume"):
            key = in_tree_source_key(obj["spec"])
            if key is None:
                return []
            item = self._item(manifest, IN_TREE_SOURCES[key].plugin)
            pv = self._translate(item, partial(self._translator.translate_in_tree_pv_to_csi, obj))
            item.becomes = self._pv_becomes(pv)
            return [item]
        if (group, kind) == ("storage.k8s.io", "StorageClass"):
            plugin = obj["provisioner"]
            if not self._translator.is_migratable_in_tree_plugin_by_name(plugin):
                return []
            item = self._item(manifest, plugin)
            translate = partial(self._translator.translate_in_tree_storage_class_to_csi, plugin, obj)
            sc = self._translate(item, translate)
            if sc is not None:
                parameters = sc.get("parameters") or {}
                item.becomes = {"provisioner": item.driver, "parameters": parameters}
                if sc.get("allowedTopologies"):
                    item.becomes["allowedTopologies"] = sc["allowedTopologies"]
                item.blockers.extend(_parameter_blockers(item.driver, parameters))
            return [item]
        items: list[PlanItem] = []
        spec = pod_spec(obj)
        namespace = manifest.namespace or "default"
        for volume in (spec or {}).get("volumes") or []:
            key = in_tree_source_key(volume)
            if key is None:
                continue
            item = self._item(manifest, IN_TREE_SOURCES[key].plugin, volume["name"])
            translate = partial(self._translator.translate_in_tree_inline_volume_to_csi, volume, namespace)
            pv = self._translate(item, translate)
            item.becomes = self._pv_becomes(pv)
            items.append(item)
        return items


def installed_drivers(manifests: Sequence[Manifest], extra: Sequence[str]) -> set[str]:
    """Names of CSIDriver objects in the input plus drivers declared on the command line."""
    names = {m.name for m in manifests if (m.group, m.kind) == ("storage.k8s.io", "CSIDriver")}
    return names | set(extra)
