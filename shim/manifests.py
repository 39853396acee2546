"""Loading Kubernetes manifests (YAML or JSON, one or many documents per source) and the objects of a
live cluster, each checked (checks.py) and remembered with where it came from (objects.py).

Contract:
- `load_text` / `load_sources` return every non-empty document as a `Manifest`, in input order, each
  remembering its source and 1-based document number; `List` kinds keep their items inline.
- `load_cluster` reads PVs, StorageClasses, Pods and CSIDrivers through the kubernetes client, paged.
- Every problem raises `ManifestError` whose text names the source, the document (and List item),
  the object when known, and the field.
- Objects are plain JSON-shaped dicts; YAML timestamps stay strings so output can be JSON.

The object helpers of objects.py are importable from here too: this is the module callers use.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from shim.checks import check_object, type_name
from shim.objects import (
    IN_TREE_SOURCES,
    JsonObj,
    Location,
    Manifest,
    ManifestError,
    SourceSchema,
    api_group,
    expand_lists,
    in_tree_source_key,
    is_list_kind,
    object_label,
    pod_spec,
    pod_spec_path,
)

__all__ = [
    "IN_TREE_SOURCES",
    "JsonObj",
    "Location",
    "Manifest",
    "ManifestError",
    "SourceSchema",
    "api_group",
    "check_object",
    "expand_lists",
    "in_tree_source_key",
    "is_list_kind",
    "load_cluster",
    "load_sources",
    "load_text",
    "manifest_files",
    "object_label",
    "pod_spec",
    "pod_spec_path",
]

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN_NAME = "<stdin>"
MAX_DEPTH = 100  # Kubernetes objects nest about a dozen levels; the YAML writer fails past about 330


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


def _nests_beyond(value: Any, limit: int) -> bool:
    """Whether `value` nests maps and lists more than `limit` deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def load_text(text: str, source: str) -> list[Manifest]:
    """Parse and check every document in `text` (JSON stream if it starts with `{`/`[`, else YAML).
    A document nesting deeper than MAX_DEPTH is a ManifestError, before anything recurses over it."""
    stripped = text.lstrip()
    values = _iter_json(text, source) if stripped[:1] in ("{", "[") else _iter_yaml(text, source)
    manifests: list[Manifest] = []
    number = 0
    try:
        for number, value in enumerate(values, start=1):
            if value is None:
                continue  # an empty YAML document
            if _nests_beyond(value, MAX_DEPTH):
                raise ManifestError(f"{source}, document {number}: nests deeper than {MAX_DEPTH} levels")
            location = Location(source, number)
            _fill_typed_list_items(value)
            check_object(value, location)
            manifests.append(Manifest(location, value))
    except RecursionError:  # the parser itself ran out of stack on a deeper document
        raise ManifestError(f"{source}, document {number + 1}: nests too deep to read") from None
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
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ManifestError(
            "--kubeconfig needs the kubernetes package (pip install 'ballast-csi[kube]')"
        ) from None
    try:
        new_client: Callable[..., Any] = config.new_client_from_config  # the package has no annotations
        api_client = new_client(config_file=kubeconfig, context=context)
    except (ConfigException, OSError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise ManifestError(f"{kubeconfig}: cannot use kubeconfig: {exc}") from None
    manifests: list[Manifest] = []
    with api_client:
        apis = {"CoreV1Api": client.CoreV1Api(api_client), "StorageV1Api": client.StorageV1Api(api_client)}
        for resource, api_version, kind, api_name, method in CLUSTER_LISTS:
            source = f"cluster {resource}"
            for page, items in enumerate(_pages(getattr(apis[api_name], method), source), start=1):
                for i, item in enumerate(items):
                    location = Location(source, page, i, unit="page")
                    if not isinstance(item, dict):
                        raise ManifestError(f"{location}: expected an object, got {type_name(item)}")
                    item = {"apiVersion": api_version, "kind": kind, **item}
                    check_object(item, location)
                    manifests.append(Manifest(location, item))
    return manifests


def _pages(list_call: Any, source: str) -> Iterator[list[Any]]:
    """The items of each page of one list call, following `continue` tokens."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    token: str | None = None
    page = 0
    while True:
        page += 1
        kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False}
        kwargs["_request_timeout"] = REQUEST_TIMEOUT_SECONDS
        if token:
            kwargs["_continue"] = token
        try:
            body = json.loads(list_call(**kwargs).data)
        except ApiException as exc:
            raise ManifestError(f"{source}: listing failed: {exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:
            raise ManifestError(f"{source}: cannot reach the cluster: {exc}") from None
        except ValueError as exc:
            raise ManifestError(f"{source}: response is not JSON: {exc}") from None
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise ManifestError(f"{source}, page {page}: response has no items list")
        yield items
        token = (body.get("metadata") or {}).get("continue") or None
        if not token:
            return
