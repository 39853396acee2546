"""Loading and checking Kubernetes manifests (YAML or JSON, one or many documents per source).

Contract:
- `load_text` / `load_sources` return every non-empty document as a `Manifest`, in input order, each
  remembering its source and 1-based document number; `List` kinds keep their items inline.
- Every problem raises `ManifestError` whose text names the source, the document (and List item),
  the object when known, and the field, e.g. `pvs.yaml, document 2 (PersistentVolume pv-a):
  spec.awsElasticBlockStore.volumeID: required field is missing`.
- Objects of built-in API groups must use a kind that group has; other groups pass unchecked.
- Objects are plain JSON-shaped dicts; YAML timestamps stay strings so output can be JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

JsonObj = dict[str, Any]

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN_NAME = "<stdin>"


class ManifestError(ValueError):
    """Input that is not a usable manifest; the message names the document and field."""


@dataclass(frozen=True)
class SourceSchema:
    """An in-tree volume source: its plugin, required string fields and typed optional fields."""

    key: str
    plugin: str
    required: tuple[str, ...]
    typed: Mapping[str, type]


def _schema(key: str, plugin: str, required: tuple[str, ...], **typed: type) -> SourceSchema:
    return SourceSchema(key, plugin, required, {**dict.fromkeys(required, str), **typed})


# Source key (same in PV spec and pod volume) -> schema. Types follow the core/v1 API.
IN_TREE_SOURCES: Mapping[str, SourceSchema] = {
    s.key: s
    for s in (
        _schema(
            "awsElasticBlockStore",
            "kubernetes.io/aws-ebs",
            ("volumeID",),
            fsType=str,
            partition=int,
            readOnly=bool,
        ),
        _schema(
            "gcePersistentDisk", "kubernetes.io/gce-pd", ("pdName",), fsType=str, partition=int, readOnly=bool
        ),
        _schema(
            "azureDisk",
            "kubernetes.io/azure-disk",
            ("diskName", "diskURI"),
            cachingMode=str,
            fsType=str,
            readOnly=bool,
            kind=str,
        ),
        _schema(
            "azureFile",
            "kubernetes.io/azure-file",
            ("secretName", "shareName"),
            readOnly=bool,
            secretNamespace=str,
        ),
        _schema("cinder", "kubernetes.io/cinder", ("volumeID",), fsType=str, readOnly=bool, secretRef=dict),
        _schema(
            "vsphereVolume",
            "kubernetes.io/vsphere-volume",
            ("volumePath",),
            fsType=str,
            storagePolicyName=str,
            storagePolicyID=str,
        ),
        _schema("portworxVolume", "kubernetes.io/portworx-volume", ("volumeID",), fsType=str, readOnly=bool),
    )
}

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


# ---------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings (Kubernetes objects are JSON-shaped)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _iter_json(text: str, source: str) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    pos, number = 0, 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        number += 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}"
            raise ManifestError(f"{source}, document {number}: invalid JSON at {where}: {exc.msg}") from None
        yield value


def _iter_yaml(text: str, source: str) -> Iterator[Any]:
    number = 0
    try:
        for value in yaml.load_all(text, Loader=_Loader):  # _Loader is a SafeLoader
            number += 1
            yield value
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(f"{source}, document {number + 1}: invalid YAML{where}: {problem}") from None


def _fill_typed_list_items(value: Any) -> None:
    """Give items of a `<Kind>List` (raw API responses) the apiVersion/kind they omit."""
    if not isinstance(value, dict) or not is_list_kind(value) or value["kind"] == "List":
        return
    items, api_version = value["items"], value.get("apiVersion")
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict):
            item.setdefault("kind", value["kind"][: -len("List")])
            if isinstance(api_version, str):
                item.setdefault("apiVersion", api_version)


def load_text(text: str, source: str) -> list[Manifest]:
    """Parse and check every document in `text` (JSON stream if it starts with `{`/`[`, else YAML)."""
    stripped = text.lstrip()
    values = _iter_json(text, source) if stripped[:1] in ("{", "[") else _iter_yaml(text, source)
    manifests: list[Manifest] = []
    for number, value in enumerate(values, start=1):
        if value is None:
            continue  # an empty YAML document
        location = Location(source, number)
        _fill_typed_list_items(value)
        check_object(value, location)
        manifests.append(Manifest(location, value))
    return manifests


def manifest_files(path: Path) -> list[Path]:
    """`path` itself, or every *.yaml / *.yml / *.json below a directory, sorted."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES)
    return [path]


def load_sources(paths: Sequence[str], stdin: TextIO | None = None) -> list[Manifest]:
    """Manifests from files, directories (recursively) and `-` (stdin), in argument order."""
    manifests: list[Manifest] = []
    for arg in paths:
        if arg == "-":
            manifests.extend(load_text((stdin or sys.stdin).read(), STDIN_NAME))
            continue
        path = Path(arg)
        if not path.exists():
            raise ManifestError(f"{arg}: no such file or directory")
        for file in manifest_files(path):
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ManifestError(f"{file}: cannot read: {exc}") from None
            manifests.extend(load_text(text, str(file)))
    return manifests


# ---------------------------------------------------------------- checks


def _require_mapping(value: Any, location: Location, obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise location.error(obj, field, f"must be a mapping, got {_type_name(value)}")
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


def _type_name(value: Any) -> str:
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
                f"must be {_TYPE_NAMES[expected]}, got {_type_name(value)} {value!r}",
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
                    obj, f"metadata.{key}.{k}", f"must be a string, got {_type_name(v)} {v!r}"
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
            raise location.error(obj, f"{path}.{k}", f"must be a string{hint}, got {_type_name(v)} {v!r}")


def _check_storage_class(obj: Mapping[str, Any], location: Location) -> None:
    _check_string_field(obj, "provisioner", location, obj, "")
    if obj.get("parameters") is not None:
        _check_string_map(obj["parameters"], location, obj, "parameters", hint=" (quote it)")
    terms = obj.get("allowedTopologies")
    if terms is not None and not isinstance(terms, list):
        raise location.error(obj, "allowedTopologies", f"must be a list, got {_type_name(terms)}")


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
        raise location.error(obj, f"{prefix}.volumes", f"must be a list, got {_type_name(volumes)}")
    for i, volume in enumerate(volumes):
        field = f"{prefix}.volumes[{i}]"
        volume = _require_mapping(volume, location, obj, field)
        _check_string_field(volume, "name", location, obj, field)
        _check_single_source(volume, location, obj, field)


def check_object(obj: Any, location: Location) -> None:
    """Raise ManifestError unless `obj` is a well-formed object (Lists: each item too)."""
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{location}: expected a Kubernetes object (a mapping), got {_type_name(obj)}")
    for key in ("apiVersion", "kind"):
        _check_string_field(obj, key, location, obj, "")
    group, kind = api_group(obj), obj["kind"]
    if is_list_kind(obj):
        items = obj["items"]
        if not isinstance(items, list):
            raise location.error(obj, "items", f"must be a list, got {_type_name(items)}")
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


# ---------------------------------------------------------------- live cluster

# What `plan` reads from a cluster: (resource label, apiVersion, item kind, client attribute, list method).
CLUSTER_LISTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("persistentvolumes", "v1", "PersistentVolume", "CoreV1Api", "list_persistent_volume"),
    ("storageclasses", "storage.k8s.io/v1", "StorageClass", "StorageV1Api", "list_storage_class"),
    ("pods", "v1", "Pod", "CoreV1Api", "list_pod_for_all_namespaces"),
    ("csidrivers", "storage.k8s.io/v1", "CSIDriver", "StorageV1Api", "list_csi_driver"),
)
PAGE_SIZE = 500
REQUEST_TIMEOUT_SECONDS = 30


def load_cluster(kubeconfig: str, context: str | None = None) -> list[Manifest]:
    """PVs, StorageClasses, Pods and CSIDrivers of a live cluster, read through the kubernetes client.

    Lists are paged (`limit`/`continue`); items get their apiVersion/kind (list items carry none) and
    are checked like file input. Any failure raises ManifestError naming the resource.
    """
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError
    except ImportError:
        raise ManifestError(
            "--kubeconfig needs the kubernetes package (pip install 'ballast-csi[kube]')"
        ) from None
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise ManifestError(f"{kubeconfig}: cannot use kubeconfig: {exc}") from None
    manifests: list[Manifest] = []
    with api_client:
        apis = {"CoreV1Api": client.CoreV1Api(api_client), "StorageV1Api": client.StorageV1Api(api_client)}
        for resource, api_version, kind, api_name, method in CLUSTER_LISTS:
            source = f"cluster {resource}"
            list_call = getattr(apis[api_name], method)
            token: str | None = None
            page = 0
            while True:
                page += 1
                kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False}
                kwargs["_request_timeout"] = REQUEST_TIMEOUT_SECONDS
                if token:
                    kwargs["_continue"] = token
                try:
                    response = list_call(**kwargs)
                    body = json.loads(response.data)
                except ApiException as exc:
                    raise ManifestError(f"{source}: listing failed: {exc.status} {exc.reason}") from None
                except (HTTPError, OSError) as exc:
                    raise ManifestError(f"{source}: cannot reach the cluster: {exc}") from None
                except ValueError as exc:
                    raise ManifestError(f"{source}: response is not JSON: {exc}") from None
                items = body.get("items") if isinstance(body, dict) else None
                if not isinstance(items, list):
                    raise ManifestError(f"{source}, page {page}: response has no items list")
                for i, item in enumerate(items):
                    location = Location(source, page, i, unit="page")
                    if not isinstance(item, dict):
                        raise ManifestError(f"{location}: expected an object, got {_type_name(item)}")
                    item = {"apiVersion": api_version, "kind": kind, **item}
                    check_object(item, location)
                    manifests.append(Manifest(location, item))
                token = (body.get("metadata") or {}).get("continue") or None
                if not token:
                    break
    return manifests
