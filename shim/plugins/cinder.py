"""OpenStack Cinder: kubernetes.io/cinder <-> cinder.csi.openstack.org (spec 4.5)."""

from __future__ import annotations

from shim import fields, topology
from shim.fields import JSON
from shim.plugins import base, registry, storageclass

TOPOLOGY_KEY = "topology.cinder.csi.openstack.org/zone"


def _to_csi(driver: str, cinder: JSON) -> JSON:
    return base.csi_source(
        driver,
        fields.string(cinder, "volumeID"),
        read_only=fields.boolean(cinder, "readOnly"),
        fs_type=fields.string(cinder, "fsType"),
    )


class Cinder(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/cinder"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        csi = _to_csi(self.csi_name, base.take_source(pv, self.source_key))
        topology.translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY)
        base.spec_of(pv)["csi"] = csi
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        cinder = fields.compact(
            {
                "volumeID": fields.string(csi, "volumeHandle"),
                "fsType": fields.string(csi, "fsType"),
                "readOnly": fields.boolean(csi, "readOnly"),
            },
            keep=("volumeID",),
        )
        topology.translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, None)
        base.spec_of(pv)[self.source_key] = cinder
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        csi = _to_csi(self.csi_name, fields.source(volume, self.source_key) or {})
        return base.new_pv(f"{self.csi_name}-{csi['volumeHandle']}", csi, [base.READ_WRITE_ONCE])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        """fstype renamed; every other key (zone, zones, availability) kept; allowedTopologies re-keyed."""
        result = storageclass.require_sc(sc)
        params: dict[str, str] = {}
        for key, value in (fields.string_map(result, "parameters") or {}).items():
            if fields.go_lower(key) == storageclass.FS_TYPE_KEY:
                params[storageclass.CSI_FS_TYPE_KEY] = value
            else:
                params[key] = value
        allowed = fields.obj_list(result, "allowedTopologies")
        if allowed:
            result["allowedTopologies"] = topology.translate_allowed_topologies(allowed, TOPOLOGY_KEY)
        storageclass.set_parameters(result, params)
        return result
