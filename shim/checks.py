"""Checks of Kubernetes objects before the shim translates or plans anything: `check_object` raises
ManifestError, naming the document and field, unless an object is well-formed for what the shim reads.

Objects of built-in API groups must use a kind that group has; other groups pass unchecked. In-tree
volume sources must carry their required fields with the types core/v1 gives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shim.objects import (
    IN_TREE_SOURCES,
    Location,
    ManifestError,
    SourceSchema,
    api_group,
    is_list_kind,
    pod_spec_path,
)

# Built-in API groups whose kinds are known; any other group (CRDs, rbac, ...) passes unchecked.
BUILTIN_KINDS: Mapping[str, frozenset[str]] = {
    "": frozenset(
        {
            "Binding",
            "ComponentStatus",
            "ConfigMap",
            "Endpoints",
            "Event",
            "LimitRange",
            "List",
            "Namespace",
            "Node",
            "PersistentVolume",
            "PersistentVolumeClaim",
            "Pod",
            "PodTemplate",
            "ReplicationController",
            "ResourceQuota",
            "Secret",
            "Service",
            "ServiceAccount",
        }
    ),
    "apps": frozenset({"ControllerRevision", "DaemonSet", "Deployment", "ReplicaSet", "StatefulSet"}),
    "batch": frozenset({"CronJob", "Job"}),
    "storage.k8s.io": frozenset(
        {
            "CSIDriver",
            "CSINode",
            "CSIStorageCapacity",
            "StorageClass",
            "VolumeAttachment",
            "VolumeAttributesClass",
        }
    ),
}


def _require_mapping(value: Any, location: Location, obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise location.error(obj, field, f"must be a mapping, got {type_name(value)}")
    return value


_TYPE_NAMES: Mapping[type, str] = {
    dict: "mapping",
    list: "list",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _check_string_field(
    holder: Mapping[str, Any], key: str, location: Location, obj: Mapping[str, Any], field: str
) -> str:
    value = holder.get(key)
    if value is None:
        raise location.error(obj, f"{field}.{key}" if field else key, "required field is missing")
    if not isinstance(value, str) or not value:
        raise location.error(
            obj, f"{field}.{key}" if field else key, f"must be a non-empty string, got {value!r}"
        )
    return value


def check_source(
    source: Any, schema: SourceSchema, location: Location, obj: Mapping[str, Any], field: str
) -> None:
    """Check an in-tree volume source: a mapping with its required fields and typed known fields."""
    source = _require_mapping(source, location, obj, field)
    for key in schema.required:
        _check_string_field(source, key, location, obj, field)
    for key, expected in schema.typed.items():
        value = source.get(key)
        if value is None:
            continue
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        if not ok:
            raise location.error(
                obj,
                f"{field}.{key}",
                f"must be {_TYPE_NAMES[expected]}, got {type_name(value)} {value!r}",
            )


def _check_single_source(
    holder: Mapping[str, Any],
    location: Location,
    obj: Mapping[str, Any],
    field: str,
    extra: tuple[str, ...] = (),
) -> None:
    present = [k for k in (*IN_TREE_SOURCES, *extra) if holder.get(k) is not None]
    if len(present) > 1:
        raise location.error(obj, field, f"more than one volume source set: {', '.join(present)}")
    for key in present:
        if key in IN_TREE_SOURCES:
            check_source(holder[key], IN_TREE_SOURCES[key], location, obj, f"{field}.{key}" if field else key)


def _check_metadata(obj: Mapping[str, Any], location: Location, name_required: bool) -> None:
    meta = obj.get("metadata")
    if meta is None:
        if name_required:
            raise location.error(obj, "metadata.name", "required field is missing")
        return
    meta = _require_mapping(meta, location, obj, "metadata")
    if name_required or meta.get("name") is not None:
        _check_string_field(meta, "name", location, obj, "metadata")
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        values = _require_mapping(values, location, obj, f"metadata.{key}")
        for k, v in values.items():
            if not isinstance(v, str):
                raise location.error(
                    obj, f"metadata.{key}.{k}", f"must be a string, got {type_name(v)} {v!r}"
                )


def _check_pv(obj: Mapping[str, Any], location: Location) -> None:
    spec = _require_mapping(obj.get("spec"), location, obj, "spec")
    _check_single_source(spec, location, obj, "spec", extra=("csi",))
    if spec.get("csi") is not None:
        csi = _require_mapping(spec["csi"], location, obj, "spec.csi")
        _check_string_field(csi, "driver", location, obj, "spec.csi")
        _check_string_field(csi, "volumeHandle", location, obj, "spec.csi")
        if csi.get("volumeAttributes") is not None:
            _check_string_map(csi["volumeAttributes"], location, obj, "spec.csi.volumeAttributes")


def _check_string_map(
    value: Any, location: Location, obj: Mapping[str, Any], path: str, hint: str = ""
) -> None:
    """`value` (found at `path` in `obj`) is a map whose values are all strings."""
    for k, v in _require_mapping(value, location, obj, path).items():
        if not isinstance(v, str):
            raise location.error(obj, f"{path}.{k}", f"must be a string{hint}, got {type_name(v)} {v!r}")


def _check_storage_class(obj: Mapping[str, Any], location: Location) -> None:
    _check_string_field(obj, "provisioner", location, obj, "")
    if obj.get("parameters") is not None:
        _check_string_map(obj["parameters"], location, obj, "parameters", hint=" (quote it)")
    terms = obj.get("allowedTopologies")
    if terms is not None and not isinstance(terms, list):
        raise location.error(obj, "allowedTopologies", f"must be a list, got {type_name(terms)}")


def _check_workload(obj: Mapping[str, Any], location: Location, path: tuple[str, ...]) -> None:
    node: Any = obj
    for depth, key in enumerate(path):
        field = ".".join(path[: depth + 1])
        node = _require_mapping(node.get(key), location, obj, field)
    volumes = node.get("volumes")
    if volumes is None:
        return
    prefix = ".".join(path)
    if not isinstance(volumes, list):
        raise location.error(obj, f"{prefix}.volumes", f"must be a list, got {type_name(volumes)}")
    for i, volume in enumerate(volumes):
        field = f"{prefix}.volumes[{i}]"
        volume = _require_mapping(volume, location, obj, field)
        _check_string_field(volume, "name", location, obj, field)
        _check_single_source(volume, location, obj, field)


def check_object(obj: Any, location: Location) -> None:
    """Raise ManifestError unless `obj` is a well-formed object (Lists: each item too)."""
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{location}: expected a Kubernetes object (a mapping), got {type_name(obj)}")
    for key in ("apiVersion", "kind"):
        _check_string_field(obj, key, location, obj, "")
    group, kind = api_group(obj), obj["kind"]
    if is_list_kind(obj):
        items = obj["items"]
        if not isinstance(items, list):
            raise location.error(obj, "items", f"must be a list, got {type_name(items)}")
        for i, item in enumerate(items):
            check_object(item, replace(location, item=i))
        return
    known = BUILTIN_KINDS.get(group)
    if known is not None and kind not in known:
        version = obj["apiVersion"]
        raise location.error(obj, "kind", f"unknown kind {kind!r} for apiVersion {version!r}")
    cluster_scoped_named = (group, kind) in {("", "PersistentVolume"), ("storage.k8s.io", "StorageClass")}
    _check_metadata(
        obj, location, name_required=cluster_scoped_named or (group, kind) == ("storage.k8s.io", "CSIDriver")
    )
    if (group, kind) == ("", "PersistentVolume"):
        _check_pv(obj, location)
    elif (group, kind) == ("storage.k8s.io", "StorageClass"):
        _check_storage_class(obj, location)
    else:
        path = pod_spec_path(obj)
        if path is not None:
            _check_workload(obj, location, path)
