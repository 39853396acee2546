"""Portworx: kubernetes.io/portworx-volume <-> pxd.portworx.com (spec 4.7)."""

from __future__ import annotations

from shim import fields
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, registry

AUTH_SECRET_NAME = "openstorage.io/auth-secret-name"
AUTH_SECRET_NAMESPACE = "openstorage.io/auth-secret-namespace"
_CSI_SECRET_KINDS = (
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
)
_PV_SECRET_REFS = (
    "controllerPublishSecretRef",
    "nodeStageSecretRef",
    "nodePublishSecretRef",
    "controllerExpandSecretRef",
    "nodeExpandSecretRef",
)


class Portworx(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/portworx-volume"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        """readOnly is not carried over (as in Kubernetes); auth annotations become all five secret refs."""
        portworx = base.take_source(pv, self.source_key)
        annotations = fields.string_map(fields.child(pv, "metadata"), "annotations") or {}
        refs: dict[str, JSON] = {}
        if AUTH_SECRET_NAME in annotations and AUTH_SECRET_NAMESPACE in annotations:
            refs = {
                name: base.secret_ref(annotations[AUTH_SECRET_NAME], annotations[AUTH_SECRET_NAMESPACE])
                for name in _PV_SECRET_REFS
            }
        base.spec_of(pv)["csi"] = base.csi_source(
            self.csi_name,
            fields.string(portworx, "volumeID"),
            fs_type=fields.string(portworx, "fsType"),
            secret_refs=refs,
        )
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        base.spec_of(pv)[self.source_key] = fields.compact(
            {
                "volumeID": fields.string(csi, "volumeHandle"),
                "fsType": fields.string(csi, "fsType"),
                "readOnly": fields.boolean(csi, "readOnly"),
            },
            keep=("volumeID",),
        )
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        portworx = fields.source(volume, self.source_key) or {}
        volume_id = fields.string(portworx, "volumeID")
        csi = base.csi_source(self.csi_name, volume_id, fs_type=fields.string(portworx, "fsType"))
        mode = base.READ_ONLY_MANY if fields.boolean(portworx, "readOnly") else base.READ_WRITE_ONCE
        return base.new_pv(f"{self.csi_name}-{volume_id}", csi, [mode])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        """Auth secret keys expand to the six CSI secret parameters; provisioner becomes the CSI driver."""
        if sc is None:
            raise TranslationError("sc is nil")
        params: dict[str, str] = {}
        for key, value in (fields.string_map(sc, "parameters") or {}).items():
            lowered = fields.go_lower(key)
            if lowered == AUTH_SECRET_NAME:
                params.update({f"csi.storage.k8s.io/{kind}-secret-name": value for kind in _CSI_SECRET_KINDS})
            elif lowered == AUTH_SECRET_NAMESPACE:
                params.update(
                    {f"csi.storage.k8s.io/{kind}-secret-namespace": value for kind in _CSI_SECRET_KINDS}
                )
            else:
                params[key] = value
        if params:
            sc["parameters"] = params
        sc["provisioner"] = self.csi_name
        return sc
