"""The StorageClass recipe shared by GCE PD, AWS EBS and Azure Disk (spec 3.10/3.11).

Kubernetes walks the parameter map in random order; where two keys write the same slot (zone and zones,
case variants), Ballast lets the later key in the object's own order win.
"""

from __future__ import annotations

from collections.abc import Callable

from shim import fields, topology
from shim.errors import TranslationError
from shim.fields import JSON

FS_TYPE_KEY = "fstype"
CSI_FS_TYPE_KEY = "csi.storage.k8s.io/fstype"
ZONE_KEY = "zone"
ZONES_KEY = "zones"

# Called for keys the recipe does not know: returns True when it handled (wrote) the key itself.
ExtraParameter = Callable[[str, str, dict[str, str]], bool]


def require_sc(sc: JSON | None) -> JSON:
    """`sc`, or TranslationError for nil (Kubernetes panics here)."""
    if sc is None:
        raise TranslationError("storage class is nil")
    return sc


def set_parameters(sc: JSON, params: dict[str, str]) -> None:
    """Replace parameters; an empty map is omitted like Go's JSON."""
    if params:
        sc["parameters"] = params
    else:
        sc.pop("parameters", None)


def translate_zonal_storage_class(
    sc: JSON, csi_key: str, *, rename_fs_type: bool, extra: ExtraParameter | None = None
) -> JSON:
    """fstype -> CSI fstype key, zone/zones -> allowedTopologies, others copied.

    zone/zones together with allowedTopologies -> TranslationError.
    """
    generated: list[JSON] | None = None
    params: dict[str, str] = {}
    for key, value in (fields.string_map(sc, "parameters") or {}).items():
        lowered = fields.go_lower(key)
        if lowered == FS_TYPE_KEY and rename_fs_type:
            params[CSI_FS_TYPE_KEY] = value
        elif lowered == ZONE_KEY:
            generated = topology.generate_topology_selectors(csi_key, [value])
        elif lowered == ZONES_KEY:
            generated = topology.generate_topology_selectors(csi_key, value.split(","))
        elif extra is None or not extra(key, value, params):
            params[key] = value
    allowed = fields.obj_list(sc, "allowedTopologies")
    if generated and allowed:
        raise TranslationError("cannot simultaneously set allowed topologies and zone/zones parameters")
    if generated:
        sc["allowedTopologies"] = generated
    elif allowed:
        sc["allowedTopologies"] = topology.translate_allowed_topologies(allowed, csi_key)
    set_parameters(sc, params)
    return sc
