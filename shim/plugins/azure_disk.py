"""Azure Disk: kubernetes.io/azure-disk <-> disk.csi.azure.com (spec 4.3). Only managed disks migrate."""

from __future__ import annotations

import re

from shim import fields
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, registry, storageclass

TOPOLOGY_KEY = "topology.disk.csi.azure.com/zone"
MANAGED = "Managed"
KIND_ATTRIBUTE = "kind"
CACHING_MODE_ATTRIBUTE = "cachingmode"
FS_TYPE_ATTRIBUTE = "fstype"
_MANAGED_PATH = re.compile(
    r".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)"
)
_UNMANAGED_PATH = re.compile(r"http(?:.*)://(?:.*)/vhds/(.+)")
_UNZONED = re.compile(r"[0-9]+")


def is_managed_disk(disk_uri: str) -> bool:
    """False for blob (unmanaged) URIs, i.e. more than 4 bytes starting with `http` in any case."""
    raw = disk_uri.encode("utf-8")
    return not (len(raw) > 4 and raw[:4].lower() == b"http")


def disk_name(disk_uri: str) -> str:
    """The disk name at the end of a managed-disk resource ID or a blob `.../vhds/<name>` URI."""
    pattern = _MANAGED_PATH if is_managed_disk(disk_uri) else _UNMANAGED_PATH
    match = pattern.search(disk_uri)
    if match is None:
        raise TranslationError(f"could not get disk name from {disk_uri}, correct format: {pattern.pattern}")
    return match.group(1)


def _equal_fold(a: str, b: str) -> bool:
    return len(a) == len(b) and all(x == y or x.casefold() == y.casefold() for x, y in zip(a, b, strict=True))


def _check_kind(azure: JSON) -> None:
    kind = fields.opt_string(azure, "kind")
    if kind is not None and not _equal_fold(kind, MANAGED):
        raise TranslationError(f"kind({kind}) is not supported in csi migration")


def _to_csi(driver: str, azure: JSON, *, inline: bool) -> JSON:
    _check_kind(azure)
    attributes = {KIND_ATTRIBUTE: MANAGED}
    caching_mode = fields.opt_string(azure, "cachingMode")
    if caching_mode is not None and (caching_mode or not inline):
        attributes[CACHING_MODE_ATTRIBUTE] = caching_mode
    fs_type = fields.opt_string(azure, "fsType")
    if fs_type is not None:
        attributes[FS_TYPE_ATTRIBUTE] = fs_type
    return base.csi_source(
        driver,
        fields.string(azure, "diskURI"),
        read_only=bool(fields.opt_bool(azure, "readOnly")),
        fs_type=fs_type or "",
        volume_attributes=attributes,
    )


def _blank_numeric_zones(terms: list[JSON] | None) -> None:
    """Numeric fault domains (`^[0-9]+$`) of the driver's zone key become "" (non-zonal regions)."""
    for term in terms or []:
        for req in fields.obj_list(term, "matchLabelExpressions") or []:
            values = fields.str_list(req, "values")
            if fields.string(req, "key") == TOPOLOGY_KEY and values:
                req["values"] = ["" if _UNZONED.fullmatch(v) else v for v in values]


class AzureDisk(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/azure-disk"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        spec = base.spec_of(pv)
        csi = _to_csi(self.csi_name, fields.source(spec, self.source_key) or {}, inline=False)
        del spec[self.source_key]
        spec["csi"] = csi
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        handle = fields.string(csi, "volumeHandle")
        azure: JSON = {
            "diskName": disk_name(handle),
            "diskURI": handle,
            "fsType": fields.string(csi, "fsType"),
            "readOnly": fields.boolean(csi, "readOnly"),
            "kind": MANAGED,
        }
        for key, value in (fields.string_map(csi, "volumeAttributes") or {}).items():
            lowered = fields.go_lower(key)
            if lowered == CACHING_MODE_ATTRIBUTE and value:
                azure["cachingMode"] = value
            elif lowered == FS_TYPE_ATTRIBUTE and value:
                azure["fsType"] = value
        base.spec_of(pv)[self.source_key] = azure
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        csi = _to_csi(self.csi_name, fields.source(volume, self.source_key) or {}, inline=True)
        return base.new_pv(csi["volumeHandle"], csi, [base.READ_WRITE_ONCE])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        result = storageclass.translate_zonal_storage_class(
            storageclass.require_sc(sc), TOPOLOGY_KEY, rename_fs_type=False
        )
        _blank_numeric_zones(fields.obj_list(result, "allowedTopologies"))
        return result
