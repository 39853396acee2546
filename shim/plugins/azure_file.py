"""Azure File: kubernetes.io/azure-file <-> file.csi.azure.com (spec 4.4).

Volume handles are `<resourceGroup>#<account>#<share>#<name>#<namespace>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shim import fields
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, registry

RESOURCE_GROUP_ANNOTATION = "kubernetes.io/azure-file-resource-group"
DEFAULT_SECRET_NAMESPACE = "default"
SHARE_NAME_ATTRIBUTE = "sharename"
SECRET_NAME_ATTRIBUTE = "secretname"
SECRET_NAMESPACE_ATTRIBUTE = "secretnamespace"
_SECRET_NAME = re.compile(r"azure-storage-account-(.+)-secret")


@dataclass(frozen=True)
class ShareInfo:
    resource_group: str
    account_name: str
    share_name: str
    disk_name: str


def storage_account_name(secret_name: str) -> str:
    """The account encoded in `azure-storage-account-<account>-secret`; TranslationError if not encoded."""
    match = _SECRET_NAME.search(secret_name)
    if match is None:
        raise TranslationError(f"could not get account name from {secret_name}")
    return match.group(1)


def _account_or_secret_name(secret_name: str) -> str:
    try:
        return storage_account_name(secret_name)
    except TranslationError:
        return secret_name


def file_share_info(volume_handle: str) -> ShareInfo:
    """Split a handle on `#`: at least three parts required; the 4th (disk name) is optional."""
    parts = volume_handle.split("#")
    if len(parts) < 3:
        raise TranslationError(f'error parsing volume id: "{volume_handle}", should at least contain two #')
    return ShareInfo(parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else "")


def _csi(driver: str, handle: str, azure: JSON, namespace: str) -> JSON:
    share_name = fields.string(azure, "shareName")
    return base.csi_source(
        driver,
        handle,
        read_only=fields.boolean(azure, "readOnly"),
        volume_attributes={SHARE_NAME_ATTRIBUTE: share_name},
        secret_refs={"nodeStageSecretRef": base.secret_ref(fields.string(azure, "secretName"), namespace)},
    )


class AzureFile(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/azure-file"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        spec = base.spec_of(pv)
        azure = fields.source(spec, self.source_key) or {}
        account = _account_or_secret_name(fields.string(azure, "secretName"))
        meta = fields.child(pv, "metadata")
        annotations = fields.string_map(meta, "annotations") or {}
        resource_group = annotations.get(RESOURCE_GROUP_ANNOTATION, "")
        namespace = fields.opt_string(azure, "secretNamespace")
        if namespace is None:
            namespace = fields.string(fields.child(spec, "claimRef"), "namespace")
        if not namespace:
            raise TranslationError("could not find a secret namespace in PersistentVolumeSource or ClaimRef")
        share_name = fields.string(azure, "shareName")
        name = fields.string(meta, "name")
        handle = f"{resource_group}#{account}#{share_name}#{name}#{namespace}"
        csi = _csi(self.csi_name, handle, azure, namespace)
        del spec[self.source_key]
        spec["csi"] = csi
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        share_name = secret_name = ""
        secret_namespace: str | None = None
        for key, value in (fields.string_map(csi, "volumeAttributes") or {}).items():
            lowered = fields.go_lower(key)
            if lowered == SHARE_NAME_ATTRIBUTE:
                share_name = value
            elif lowered == SECRET_NAME_ATTRIBUTE:
                secret_name = value
            elif lowered == SECRET_NAMESPACE_ATTRIBUTE:
                secret_namespace = value
        stage_ref = fields.child(csi, "nodeStageSecretRef")
        if stage_ref is not None and fields.string(stage_ref, "name"):
            secret_name = fields.string(stage_ref, "name")
            secret_namespace = fields.string(stage_ref, "namespace")
        resource_group = ""
        if not share_name or not secret_name:
            info = file_share_info(fields.string(csi, "volumeHandle"))
            share_name = share_name or info.share_name
            secret_name = secret_name or f"azure-storage-account-{info.account_name}-secret"
            resource_group = info.resource_group
        azure = fields.compact({"readOnly": fields.boolean(csi, "readOnly")})
        azure.update(
            {
                "secretName": secret_name,
                "shareName": share_name,
                "secretNamespace": DEFAULT_SECRET_NAMESPACE if secret_namespace is None else secret_namespace,
            }
        )
        base.spec_of(pv)[self.source_key] = azure
        if resource_group:
            fields.set_metadata(pv, "annotations", RESOURCE_GROUP_ANNOTATION, resource_group)
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        azure = fields.source(volume, self.source_key) or {}
        account = _account_or_secret_name(fields.string(azure, "secretName"))
        namespace = pod_namespace or DEFAULT_SECRET_NAMESPACE
        handle = f"#{account}#{fields.string(azure, 'shareName')}#{fields.string(volume, 'name')}#{namespace}"
        return base.new_pv(handle, _csi(self.csi_name, handle, azure, namespace), [base.READ_WRITE_MANY])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        """Azure File needs no StorageClass changes; nil stays nil (no error, as in Kubernetes)."""
        return sc
