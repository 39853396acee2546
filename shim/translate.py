"""Translator: the public facade over the seven in-tree plugin translators.

Behaviour follows Kubernetes' csi-translation-lib (the reference vectors in
tests/shim/testdata/translation-vectors.json and the differential test hold it to that), with these
deliberate rules where Kubernetes crashes or is nondeterministic:
- nil (None) PVs, volumes and StorageClasses raise TranslationError, except the Azure File
  StorageClass, where None is returned as Kubernetes does;
- an object carrying two in-tree sources is ambiguous and raises (Kubernetes picks one at random);
  `is_pv_migratable` / `is_inline_migratable` are True only when exactly one plugin matches;
- where two parameter / attribute keys write the same output slot, the later key in the object wins;
- an inline vSphere volume with storagePolicyName raises (Kubernetes dereferences nil there).
As in Kubernetes v0.37.2, PVs are dispatched on their in-tree source only: a stale `csi` next to it
is replaced.

Every method copies its input first and never mutates arguments. Objects are plain Kubernetes JSON
dicts; fields the shim writes omit zero values the way Kubernetes' JSON does, while fields it only
carries over are kept as given (Kubernetes' typed decoding would drop unknown or zero-valued ones).
A field of the wrong JSON type raises TranslationError, as Kubernetes' decoder would refuse it.
"""

from __future__ import annotations

import importlib
from typing import Any, overload

from shim import fields
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import registry
from shim.plugins.base import FILESYSTEM, InTreePlugin


def translator(info: registry.PluginInfo) -> InTreePlugin:
    """A new translator of the plugin `info` describes (its module is imported on first use)."""
    module, _, name = info.translator.partition(":")
    cls: type[InTreePlugin] = getattr(importlib.import_module(module), name)
    return cls()


def default_plugins() -> tuple[InTreePlugin, ...]:
    """One translator per migratable in-tree plugin (registry.PLUGINS)."""
    return tuple(translator(info) for info in registry.PLUGINS)


def json_copy(value: Any) -> Any:
    """Deep copy of a JSON value (dicts, lists, scalars); faster than copy.deepcopy."""
    if isinstance(value, dict):
        return {k: json_copy(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) if isinstance(v, dict | list) else v for v in value]
    return value


def _name(obj: JSON, *path: str) -> str:
    for key in path[:-1]:
        child = obj.get(key)
        obj = child if isinstance(child, dict) else {}
    value = obj.get(path[-1])
    return value if isinstance(value, str) else ""


class Translator:
    """In-tree <-> CSI translation of PVs, inline pod volumes and StorageClasses; stateless, thread-safe."""

    def __init__(self, plugins: tuple[InTreePlugin, ...] | None = None) -> None:
        self._plugins = default_plugins() if plugins is None else plugins
        self._by_in_tree = {p.in_tree_name: p for p in self._plugins}
        self._by_csi = {p.csi_name: p for p in self._plugins}

    # -- dispatch -----------------------------------------------------------------------------------

    def _pv_plugins(self, pv: JSON) -> list[InTreePlugin]:
        spec = fields.child(pv, "spec")
        if spec is None:
            return []
        return [p for p in self._plugins if spec.get(p.source_key) is not None and p.can_support(pv)]

    def _inline_plugins(self, volume: JSON) -> list[InTreePlugin]:
        return [
            p for p in self._plugins if volume.get(p.source_key) is not None and p.can_support_inline(volume)
        ]

    @staticmethod
    def _one(found: list[InTreePlugin], what: str) -> InTreePlugin:
        if not found:
            raise TranslationError(f"could not find in-tree plugin translation logic for {what}")
        if len(found) > 1:
            sources = ", ".join(p.source_key for p in found)
            raise TranslationError(f"{what} has more than one in-tree volume source ({sources})")
        return found[0]

    # -- translations -------------------------------------------------------------------------------

    def translate_in_tree_pv_to_csi(self, pv: JSON | None) -> JSON:
        """A copy of the in-tree PV with a CSI source (topology and access modes adjusted per plugin)."""
        source = fields.obj(pv, "persistent volume")
        if source is None:
            raise TranslationError("persistent volume was nil")
        plugin = self._one(self._pv_plugins(source), repr(_name(source, "metadata", "name")))
        return plugin.translate_pv_to_csi(json_copy(source))

    def translate_csi_pv_to_in_tree(self, pv: JSON | None) -> JSON:
        """A copy of the CSI PV with the in-tree source of the plugin owning `spec.csi.driver`."""
        source = fields.obj(pv, "persistent volume")
        spec = None if source is None else fields.child(source, "spec")
        if source is None or spec is None or fields.child(spec, "csi") is None:
            raise TranslationError("CSI persistent volume was nil")
        driver = _name(spec, "csi", "driver")
        plugin = self._by_csi.get(driver)
        if plugin is None:
            raise TranslationError(f"could not find in-tree plugin translation logic for {driver}")
        return plugin.translate_csi_to_pv(json_copy(source))

    def translate_in_tree_inline_volume_to_csi(self, volume: JSON | None, pod_namespace: str) -> JSON:
        """A new CSI PV (no apiVersion/kind; volumeMode Filesystem) for an inline pod volume."""
        source = fields.obj(volume, "volume")
        if source is None:
            raise TranslationError("persistent volume was nil")
        plugin = self._one(self._inline_plugins(source), repr(_name(source, "name")))
        pv = plugin.translate_inline_to_csi(json_copy(source), pod_namespace)
        pv["spec"].setdefault("volumeMode", FILESYSTEM)
        return pv

    @overload
    def translate_in_tree_storage_class_to_csi(
        self, in_tree_plugin_name: str, storage_class: JSON
    ) -> JSON: ...

    @overload
    def translate_in_tree_storage_class_to_csi(
        self, in_tree_plugin_name: str, storage_class: None
    ) -> JSON | None: ...

    def translate_in_tree_storage_class_to_csi(
        self, in_tree_plugin_name: str, storage_class: JSON | None
    ) -> JSON | None:
        """A copy of the StorageClass with parameters/topology for the CSI driver.

        The plugin is chosen by `in_tree_plugin_name` only, never by `provisioner`, and only Portworx
        rewrites `provisioner`. A None StorageClass raises, except for Azure File (returns None).
        """
        plugin = self._by_in_tree.get(in_tree_plugin_name)
        if plugin is None:
            raise TranslationError(
                "could not find in-tree storage class parameter translation logic for "
                f'"{in_tree_plugin_name}"'
            )
        return plugin.translate_storage_class(json_copy(fields.obj(storage_class, "storage class")))

    # -- queries ------------------------------------------------------------------------------------

    def is_pv_migratable(self, pv: JSON | None) -> bool:
        """Whether exactly one plugin supports the PV's in-tree source."""
        source = fields.obj(pv, "persistent volume")
        return source is not None and len(self._pv_plugins(source)) == 1

    def is_inline_migratable(self, volume: JSON | None) -> bool:
        """Whether exactly one plugin supports the inline volume's source."""
        source = fields.obj(volume, "volume")
        return source is not None and len(self._inline_plugins(source)) == 1

    def is_migratable_in_tree_plugin_by_name(self, name: str) -> bool:
        return name in self._by_in_tree

    def is_migrated_csi_driver_by_name(self, name: str) -> bool:
        return name in self._by_csi

    def get_in_tree_plugin_name_from_spec(self, pv: JSON | None, volume: JSON | None) -> str:
        """In-tree plugin name of the PV's source, else (PV None) of the volume's source."""
        source = fields.obj(pv, "persistent volume")
        if source is not None:
            found = self._pv_plugins(source)
            what = f"persistent volume {_name(source, 'metadata', 'name')}"
        else:
            inline = fields.obj(volume, "volume")
            if inline is None:
                raise TranslationError("both persistent volume and volume are nil")
            found = self._inline_plugins(inline)
            what = f"volume {_name(inline, 'name')}"
        if not found:
            raise TranslationError(f"could not find in-tree plugin name from {what}")
        return self._one(found, what).in_tree_name

    def get_csi_name_from_in_tree_name(self, name: str) -> str:
        plugin = self._by_in_tree.get(name)
        if plugin is None:
            raise TranslationError(f"could not find CSI Driver name for plugin {name}")
        return plugin.csi_name

    def get_in_tree_name_from_csi_name(self, name: str) -> str:
        plugin = self._by_csi.get(name)
        if plugin is None:
            raise TranslationError(f"could not find In-Tree driver name for CSI plugin {name}")
        return plugin.in_tree_name

    def repair_volume_handle(self, driver_name: str, volume_handle: str, node_id: str) -> str:
        """The handle completed from the node ID (GCE PD only; other drivers return it unchanged)."""
        plugin = self._by_csi.get(driver_name)
        if plugin is None:
            raise TranslationError(f"could not find In-Tree driver name for CSI plugin {driver_name}")
        return plugin.repair_volume_handle(volume_handle, node_id)
