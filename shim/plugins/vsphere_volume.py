"""vSphere: kubernetes.io/vsphere-volume <-> csi.vsphere.vmware.com (spec 4.6)."""

from __future__ import annotations

import contextlib

from shim import fields, topology
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, registry, storageclass

ZONE_KEY = "topology.csi.vmware.com/zone"
REGION_KEY = "topology.csi.vmware.com/region"
STORAGE_POLICY_NAME = "storagepolicyname"
INITIAL_VOLUME_FILE_PATH = "initialvolumefilepath"
CSI_MIGRATION = "csimigration"

# In-tree StorageClass parameter (lower-cased) -> CSI parameter; anything not listed is dropped.
_SC_PARAMETERS = {
    storageclass.FS_TYPE_KEY: storageclass.CSI_FS_TYPE_KEY,
    STORAGE_POLICY_NAME: STORAGE_POLICY_NAME,
    **{
        key: f"{key}-migrationparam"
        for key in (
            "datastore",
            "diskformat",
            "hostfailurestotolerate",
            "forceprovisioning",
            "cachereservation",
            "diskstripes",
            "objectspacereservation",
            "iopslimit",
        )
    },
}


def _topology_to_csi(pv: JSON) -> None:
    """Zone and region requirements (or single labels, not split) -> the vSphere CSI keys."""
    for label, csi_key in zip(topology.get_topology_label(pv), (ZONE_KEY, REGION_KEY), strict=True):
        if topology.get_topology_values(pv, label):
            topology.replace_topology(pv, label, csi_key)
        else:
            value = topology.labels(pv).get(label, "")
            if value:
                with contextlib.suppress(TranslationError):  # a blank label adds nothing, as in Kubernetes
                    topology.add_topology(pv, csi_key, [value])


def _topology_to_in_tree(pv: JSON) -> None:
    """vSphere CSI keys -> the PV's zone/region labels; a missing label gets the first (sorted) value."""
    zone_label, region_label = topology.get_topology_label(pv)
    topology.replace_topology(pv, ZONE_KEY, zone_label)
    topology.replace_topology(pv, REGION_KEY, region_label)
    for label in (zone_label, region_label):
        values = topology.get_topology_values(pv, label)
        if values and label not in topology.labels(pv):
            topology.set_label(pv, label, values[0])


class VSphereVolume(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/vsphere-volume"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        vsphere = base.take_source(pv, self.source_key)
        attributes: dict[str, str] = {}
        policy = fields.string(vsphere, "storagePolicyName")
        if policy:
            attributes[STORAGE_POLICY_NAME] = policy
        csi = base.csi_source(
            self.csi_name,
            fields.string(vsphere, "volumePath"),
            fs_type=fields.string(vsphere, "fsType"),
            volume_attributes=attributes,
        )
        _topology_to_csi(pv)
        base.spec_of(pv)["csi"] = csi
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        attributes = fields.string_map(csi, "volumeAttributes") or {}
        vsphere = fields.compact(
            {
                "volumePath": attributes.get(INITIAL_VOLUME_FILE_PATH, ""),
                "fsType": fields.string(csi, "fsType"),
            },
            keep=("volumePath",),
        )
        _topology_to_in_tree(pv)
        base.spec_of(pv)[self.source_key] = vsphere
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        """Kubernetes panics on an inline volume with storagePolicyName; Ballast raises instead."""
        vsphere = fields.source(volume, self.source_key) or {}
        if fields.string(vsphere, "storagePolicyName"):
            raise TranslationError(
                "inline vSphere volumes with storagePolicyName cannot be translated "
                "(Kubernetes' translator crashes on them)"
            )
        path = fields.string(vsphere, "volumePath")
        csi = base.csi_source(self.csi_name, path, fs_type=fields.string(vsphere, "fsType"))
        return base.new_pv(f"{self.csi_name}-{path}", csi, [base.READ_WRITE_ONCE])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        if sc is None:
            raise TranslationError("sc is nil")
        params: dict[str, str] = {}
        for key, value in (fields.string_map(sc, "parameters") or {}).items():
            target = _SC_PARAMETERS.get(fields.go_lower(key))
            if target is not None:
                params[target] = value
        params[CSI_MIGRATION] = "true"
        allowed = fields.obj_list(sc, "allowedTopologies")
        if allowed:
            sc["allowedTopologies"] = topology.translate_allowed_topologies(allowed, ZONE_KEY)
        sc["parameters"] = params
        return sc
