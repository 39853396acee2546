"""A small typed REST client for the test bed's API server: plain JSON dicts in and out.

Tests speak to the API server in the objects' own JSON (as the shim does), so field names in tests
are the Kubernetes field names. Errors raise KubeError with the HTTP status and the server's message.

    kube = Kube.from_kubeconfig(cluster.admin_kubeconfig)
    pvc = kube.get(pvcs(namespace, "data"))
    kube.patch(pvcs(namespace, "data"), {"spec": {...}})
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


@dataclass
class Kube:
    server: str
    context: ssl.SSLContext
    token: str = ""

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Kube:
        """Read a one-context kubeconfig as tests/e2e/cluster.write_kubeconfig writes them."""
        config = yaml.safe_load(path.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        if "client-certificate" in user:
            context.load_cert_chain(user["client-certificate"], user["client-key"])
        return cls(server=cluster["server"], context=context, token=user.get("token", ""))

    def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise KubeError(err.code, method, path, message) from None
        result: Obj = json.loads(raw) if raw else {}
        return result

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def items(self, path: str, selector: str = "") -> list[Obj]:
        """The items of a collection (optionally filtered by a label selector)."""
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        items: list[Obj] = self.get(path + query).get("items", [])
        return items

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def replace(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Obj | list[Obj], content_type: str = MERGE_PATCH) -> Obj:
        return self.request("PATCH", path, body, content_type)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as err:
            if not (missing_ok and err.status == 404):
                raise

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
            return True
        except KubeError as err:
            if err.status == 404:
                return False
            raise

    def wait(self, path: str, condition: Callable[[Obj], bool], timeout: float, what: str) -> Obj:
        """Poll `path` until `condition(object)` holds (a missing object counts as not yet); returns it."""
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while True:
            try:
                last = self.get(path)
                if condition(last):
                    return last
            except KubeError as err:
                if err.status != 404:
                    raise
            if time.monotonic() >= deadline:
                shown = json.dumps(last, indent=1)[-3000:] if last is not None else "(not found)"
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}; last seen:\n{shown}"
                )
            time.sleep(0.1)

    def wait_gone(self, path: str, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while self.exists(path):
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} to be deleted")
            time.sleep(0.1)


def phase_is(phase: str) -> Callable[[Obj], bool]:
    """A `wait` condition: status.phase equals `phase`."""
    return lambda obj: bool(obj.get("status", {}).get("phase") == phase)


# ---- resource paths (name="" addresses the collection)


def _core(resource: str, name: str = "", namespace: str = "") -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/api/v1{ns}/{resource}" + (f"/{name}" if name else "")


def _group(group_version: str, resource: str, name: str = "", namespace: str = "") -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{group_version}{ns}/{resource}" + (f"/{name}" if name else "")


def namespaces(name: str = "") -> str:
    return _core("namespaces", name)


def nodes(name: str = "") -> str:
    return _core("nodes", name)


def pvs(name: str = "") -> str:
    return _core("persistentvolumes", name)


def pvcs(namespace: str, name: str = "") -> str:
    return _core("persistentvolumeclaims", name, namespace)


def pods(namespace: str, name: str = "") -> str:
    return _core("pods", name, namespace)


def secrets(namespace: str, name: str = "") -> str:
    return _core("secrets", name, namespace)


def events(namespace: str) -> str:
    return _core("events", "", namespace)


def service_accounts(namespace: str, name: str = "") -> str:
    return _core("serviceaccounts", name, namespace)


def storage_classes(name: str = "") -> str:
    return _group("storage.k8s.io/v1", "storageclasses", name)


def csi_nodes(name: str = "") -> str:
    return _group("storage.k8s.io/v1", "csinodes", name)


def csi_drivers(name: str = "") -> str:
    return _group("storage.k8s.io/v1", "csidrivers", name)


def volume_attachments(name: str = "") -> str:
    return _group("storage.k8s.io/v1", "volumeattachments", name)


def volume_attributes_classes(name: str = "") -> str:
    return _group("storage.k8s.io/v1", "volumeattributesclasses", name)


def volume_snapshots(namespace: str, name: str = "") -> str:
    return _group("snapshot.storage.k8s.io/v1", "volumesnapshots", name, namespace)


def volume_snapshot_contents(name: str = "") -> str:
    return _group("snapshot.storage.k8s.io/v1", "volumesnapshotcontents", name)


def volume_snapshot_classes(name: str = "") -> str:
    return _group("snapshot.storage.k8s.io/v1", "volumesnapshotclasses", name)


def volume_group_snapshots(namespace: str, name: str = "") -> str:
    return _group("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshots", name, namespace)


def volume_group_snapshot_contents(name: str = "") -> str:
    return _group("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshotcontents", name)


def volume_group_snapshot_classes(name: str = "") -> str:
    return _group("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshotclasses", name)


def leases(namespace: str, name: str = "") -> str:
    return _group("coordination.k8s.io/v1", "leases", name, namespace)


def path_of(obj: Obj, plural: str) -> str:
    """The path of an object given its apiVersion/metadata and its resource's plural name."""
    group_version = obj["apiVersion"]
    namespace = obj["metadata"].get("namespace", "")
    name = obj["metadata"]["name"]
    if "/" in group_version:
        return _group(group_version, plural, name, namespace)
    return _core(plural, name, namespace)
