"""The interface every in-tree plugin translator implements.

Translators receive objects the facade already copied: they may mutate and return them. They never
check feature gates and never look at other plugins' sources.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from shim import fields
from shim.fields import JSON
from shim.plugins.registry import PluginInfo

FILESYSTEM = "Filesystem"
READ_WRITE_ONCE = "ReadWriteOnce"
READ_ONLY_MANY = "ReadOnlyMany"
READ_WRITE_MANY = "ReadWriteMany"


class InTreePlugin(ABC):
    """Translation logic of one in-tree plugin, described by its row of registry.PLUGINS."""

    info: ClassVar[PluginInfo]

    @property
    def in_tree_name(self) -> str:
        return self.info.in_tree_name

    @property
    def csi_name(self) -> str:
        return self.info.csi_name

    @property
    def source_key(self) -> str:
        """Its key in a PV spec and in a pod volume."""
        return self.info.source_key

    def can_support(self, pv: JSON) -> bool:
        """Whether the PV carries this plugin's source (present and non-null; contents not validated)."""
        spec = fields.child(pv, "spec")
        return spec is not None and fields.source(spec, self.source_key) is not None

    def can_support_inline(self, volume: JSON) -> bool:
        """Whether the pod volume carries this plugin's source."""
        return fields.source(volume, self.source_key) is not None

    @abstractmethod
    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        """Replace the in-tree source of `pv` with a CSI source; may rewrite topology and access modes."""

    @abstractmethod
    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        """Replace the CSI source of `pv` with this plugin's in-tree source."""

    @abstractmethod
    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        """A new CSI PV (metadata.name + spec only) for an inline pod volume."""

    @abstractmethod
    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        """Rewrite StorageClass parameters/topology for the CSI driver; `sc` None is plugin-specific."""

    def repair_volume_handle(self, volume_handle: str, node_id: str) -> str:
        """Complete a handle using the node ID; identity unless a plugin needs more."""
        return volume_handle


def spec_of(pv: JSON) -> JSON:
    """The PV's spec, created when missing."""
    return fields.ensure_child(pv, "spec")


def take_source(pv: JSON, key: str) -> JSON:
    """The in-tree source under spec[key] (must exist), removed from the spec."""
    spec = spec_of(pv)
    found = fields.source(spec, key)
    assert found is not None, f"facade dispatched a PV without {key}"
    del spec[key]
    return found


def take_csi(pv: JSON) -> JSON:
    """The CSI source (must exist), removed from the spec."""
    return take_source(pv, "csi")


def new_pv(name: str, csi: JSON, access_modes: list[str]) -> JSON:
    """A bare PV as built for inline volumes: metadata.name (omitted when empty), CSI source, access modes."""
    return {
        "metadata": fields.compact({"name": name}),
        "spec": {"csi": csi, "accessModes": access_modes},
    }


def csi_source(
    driver: str,
    volume_handle: str,
    *,
    read_only: bool = False,
    fs_type: str = "",
    volume_attributes: dict[str, str] | None = None,
    secret_refs: dict[str, JSON] | None = None,
) -> JSON:
    """A CSI PV source serialised like Kubernetes: driver/volumeHandle always, the rest only when set.
    Secret refs are pointers in Kubernetes: one that is set stays, even when it serialises as {}."""
    source = fields.compact(
        {
            "driver": driver,
            "volumeHandle": volume_handle,
            "readOnly": read_only,
            "fsType": fs_type,
            "volumeAttributes": volume_attributes,
        },
        keep=("driver", "volumeHandle"),
    )
    return {**source, **(secret_refs or {})}


def secret_ref(name: str, namespace: str) -> JSON:
    """A SecretReference; empty name/namespace omitted (so it may serialise as {})."""
    return fields.compact({"name": name, "namespace": namespace})
