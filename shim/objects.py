"""Kubernetes objects as the shim reads them: plain JSON-shaped dicts, each remembered with where it came
from (`Location`, `Manifest`), and the few facts about kinds the shim needs (pod spec paths, in-tree
volume sources). Every problem is a `ManifestError` naming the source, document, object and field, e.g.
`pvs.yaml, document 2 (PersistentVolume pv-a): spec.awsElasticBlockStore.volumeID: required field is
missing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from shim.plugins.registry import PLUGINS

JsonObj = dict[str, Any]


class ManifestError(ValueError):
    """Input that is not a usable manifest; the message names the document and field."""


@dataclass(frozen=True)
class SourceSchema:
    """An in-tree volume source: its plugin, required string fields and typed optional fields."""

    key: str
    plugin: str
    required: tuple[str, ...]
    typed: Mapping[str, type]


# Source key (same in PV spec and pod volume) -> schema, from the plugin registry (types follow core/v1).
IN_TREE_SOURCES: Mapping[str, SourceSchema] = MappingProxyType(
    {
        p.source_key: SourceSchema(
            p.source_key, p.in_tree_name, p.required, {**dict.fromkeys(p.required, str), **p.typed}
        )
        for p in PLUGINS
    }
)


# (group, kind) -> path from the object to its pod spec.
POD_SPEC_PATHS: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): ("spec",),
    ("", "PodTemplate"): ("template", "spec"),
    ("", "ReplicationController"): ("spec", "template", "spec"),
    ("apps", "Deployment"): ("spec", "template", "spec"),
    ("apps", "StatefulSet"): ("spec", "template", "spec"),
    ("apps", "DaemonSet"): ("spec", "template", "spec"),
    ("apps", "ReplicaSet"): ("spec", "template", "spec"),
    ("extensions", "Deployment"): ("spec", "template", "spec"),
    ("extensions", "DaemonSet"): ("spec", "template", "spec"),
    ("extensions", "ReplicaSet"): ("spec", "template", "spec"),
    ("batch", "Job"): ("spec", "template", "spec"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template", "spec"),
}


def api_group(obj: Mapping[str, Any]) -> str:
    """The API group of `obj` ("" for the core group)."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


def object_label(obj: Mapping[str, Any]) -> str:
    """`Kind namespace/name`, `Kind name` or just `Kind`, for messages."""
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return str(kind)
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and namespace:
        return f"{kind} {namespace}/{meta['name']}"
    return f"{kind} {meta['name']}"


@dataclass(frozen=True)
class Location:
    """Where an object came from: source, 1-based document number, and List item index if any."""

    source: str
    document: int
    item: int | None = None
    unit: str = "document"  # "page" for lists read from a cluster

    def __str__(self) -> str:
        text = f"{self.source}, {self.unit} {self.document}"
        return text if self.item is None else f"{text}, items[{self.item}]"

    def error(self, obj: Mapping[str, Any] | None, field: str, problem: str) -> ManifestError:
        """A ManifestError for `field` of `obj` at this location."""
        where = str(self) if obj is None else f"{self} ({object_label(obj)})"
        return ManifestError(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")


@dataclass(frozen=True)
class Manifest:
    """One object with its location. `obj` is owned by the caller; nothing here mutates it."""

    location: Location
    obj: JsonObj

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def group(self) -> str:
        return api_group(self.obj)

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata") or {}
        return str(meta.get("name", ""))

    @property
    def namespace(self) -> str:
        meta = self.obj.get("metadata") or {}
        return str(meta.get("namespace", ""))

    @property
    def label(self) -> str:
        return object_label(self.obj)

    def error(self, field: str, problem: str) -> ManifestError:
        return self.location.error(self.obj, field, problem)


def is_list_kind(obj: Mapping[str, Any]) -> bool:
    """True for `List` and `<Kind>List` objects that carry `items`."""
    kind = obj.get("kind")
    return isinstance(kind, str) and kind.endswith("List") and "items" in obj


def expand_lists(manifests: Sequence[Manifest]) -> list[Manifest]:
    """Manifests with every List replaced by its items (each keeping its item index)."""
    result: list[Manifest] = []
    for manifest in manifests:
        if is_list_kind(manifest.obj):
            for i, item in enumerate(manifest.obj["items"]):
                result.append(Manifest(replace(manifest.location, item=i), item))
        else:
            result.append(manifest)
    return result


def pod_spec_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Path to the pod spec inside a workload object, or None for objects without one."""
    kind = obj.get("kind")
    return POD_SPEC_PATHS.get((api_group(obj), kind)) if isinstance(kind, str) else None


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a (validated) workload object, or None."""
    path = pod_spec_path(obj)
    node: Any = obj
    for key in path or ():
        if not isinstance(node, Mapping) or not isinstance(node.get(key), Mapping):
            return None
        node = node[key]
    return node if path else None


def in_tree_source_key(source_holder: Mapping[str, Any]) -> str | None:
    """The in-tree source key set (non-null) in a PV spec or pod volume, or None."""
    for key in IN_TREE_SOURCES:
        if source_holder.get(key) is not None:
            return key
    return None
