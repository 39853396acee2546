"""Kubernetes API access as plain JSON dicts (the shape shim.Translator works on).

The kubernetes package is used only to load a kubeconfig or the in-cluster service account (and to
refresh expiring tokens); requests go through urllib3 directly, so objects are never converted into
generated model classes and back. Every request is reported to an optional hook (verb, resource,
HTTP status; 0 when no response came), which the controller turns into its API-call metric.

Errors: a response outside 2xx raises ApiError carrying the status, the Kubernetes `reason` and the
server's message; a transport failure raises ApiError with status 0. Nothing is retried here: the
callers decide (a 409 means different things to a lock and to a PV update).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

import urllib3

from shim.migrate.options import KubeConfigError

JsonObj = dict[str, Any]
RequestHook = Callable[[str, str, int], None]

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30.0
PAGE_SIZE = 500


class ApiError(Exception):
    """A failed API request; `status` is the HTTP status (0: no response)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def lasting(self) -> bool:
        """A refusal the same request meets again (a missing namespace, RBAC, an invalid object); not
        a conflict (409), throttling (429), a timeout (408), a server error or no response."""
        return 400 <= self.status < 500 and self.status not in (408, 409, 429)

    @property
    def conflict(self) -> bool:
        """409 Conflict: a resourceVersion or uid precondition failed (AlreadyExists is separate)."""
        return self.status == 409 and self.reason != "AlreadyExists"

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.status == 410


class Resource(NamedTuple):
    """One API resource: its group-version prefix, plural name, scope and kind."""

    prefix: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/apis/").removeprefix("/api/")

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        parts = [self.prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
        return "/".join(parts)


PVS = Resource("/api/v1", "persistentvolumes", False, "PersistentVolume")
PVCS = Resource("/api/v1", "persistentvolumeclaims", True, "PersistentVolumeClaim")
PODS = Resource("/api/v1", "pods", True, "Pod")
EVENTS = Resource("/api/v1", "events", True, "Event")
VOLUME_ATTACHMENTS = Resource("/apis/storage.k8s.io/v1", "volumeattachments", False, "VolumeAttachment")
STORAGE_CLASSES = Resource("/apis/storage.k8s.io/v1", "storageclasses", False, "StorageClass")
CSI_DRIVERS = Resource("/apis/storage.k8s.io/v1", "csidrivers", False, "CSIDriver")
LEASES = Resource("/apis/coordination.k8s.io/v1", "leases", True, "Lease")


class Connection(NamedTuple):
    """Where the API server is and how to authenticate to it."""

    server: str
    pool: urllib3.PoolManager
    auth_headers: Callable[[], dict[str, str]]


def _status_of(body: bytes) -> tuple[str, str]:
    try:
        status = json.loads(body)
    except ValueError:
        return "", body.decode("utf-8", "replace")[:500]
    if not isinstance(status, dict):
        return "", str(status)[:500]
    return str(status.get("reason", "")), str(status.get("message", ""))


def _query(params: Mapping[str, Any]) -> str:
    kept = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items() if v is not None}
    return f"?{urlencode(kept)}" if kept else ""


class KubeClient:
    """A thread-safe JSON client over one connection pool."""

    def __init__(self, connection: Connection, on_request: RequestHook | None = None) -> None:
        self._connection = connection
        self._on_request = on_request

    def close(self) -> None:
        self._connection.pool.clear()

    def _send(
        self,
        verb: str,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        resource = path.split("?", 1)[0].rstrip("/").split("/")
        plural = next((p for p in reversed(resource) if p in _PLURALS), resource[-1])
        headers = {"Accept": "application/json", **self._connection.auth_headers()}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            response = self._connection.pool.request(
                method,
                self._connection.server + path,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(connect=10.0, read=timeout),
                preload_content=not stream,
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._report(verb, plural, 0)
            raise ApiError(0, "", f"{method} {path}: cannot reach the API server: {exc}") from None
        self._report(verb, plural, response.status)
        if response.status >= 300:
            reason, message = _status_of(response.data if not stream else response.read())
            raise ApiError(response.status, reason, message or f"{method} {path}")
        return response

    def _report(self, verb: str, plural: str, status: int) -> None:
        if self._on_request is not None:
            self._on_request(verb, plural, status)

    def _json(self, verb: str, method: str, path: str, body: Any = None, content_type: str = "") -> JsonObj:
        response = self._send(verb, method, path, body, content_type or "application/json")
        decoded: JsonObj = json.loads(response.data) if response.data else {}
        return decoded

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> JsonObj:
        return self._json("get", "GET", resource.path(namespace, name))

    def get_or_none(self, resource: Resource, name: str, namespace: str | None = None) -> JsonObj | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(resource, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def list_page(self, resource: Resource, namespace: str | None = None, **query: Any) -> JsonObj:
        """One page of a list; `query` takes labelSelector, fieldSelector, limit, continue, ..."""
        return self._json("list", "GET", resource.path(namespace) + _query(query))

    def list_all(
        self, resource: Resource, namespace: str | None = None, **query: Any
    ) -> tuple[list[JsonObj], str]:
        """Every item (paged by PAGE_SIZE) and the list's resourceVersion, to watch from."""
        items: list[JsonObj] = []
        token: str | None = None
        while True:
            page = self.list_page(resource, namespace, limit=PAGE_SIZE, **{"continue": token}, **query)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                return items, str(metadata.get("resourceVersion", ""))

    def create(
        self, resource: Resource, body: JsonObj, namespace: str | None = None, *, dry_run: bool = False
    ) -> JsonObj:
        """POST; with `dry_run` the API server validates and admits the object (a taken name is still
        409 AlreadyExists, found after validation) but stores nothing."""
        query = _query({"dryRun": "All"}) if dry_run else ""
        return self._json("create", "POST", resource.path(namespace) + query, body)

    def update(self, resource: Resource, body: JsonObj) -> JsonObj:
        """PUT of the whole object; its metadata.resourceVersion makes it conditional."""
        metadata = body["metadata"]
        return self._json("update", "PUT", resource.path(metadata.get("namespace"), metadata["name"]), body)

    def patch(self, resource: Resource, name: str, patch: JsonObj, namespace: str | None = None) -> JsonObj:
        """JSON merge patch; metadata.uid / metadata.resourceVersion in `patch` act as preconditions."""
        return self._json("patch", "PATCH", resource.path(namespace, name), patch, MERGE_PATCH)

    def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        preconditions: JsonObj | None = None,
    ) -> JsonObj:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions or {}}
        return self._json("delete", "DELETE", resource.path(namespace, name), body)

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int,
        namespace: str | None = None,
        **query: Any,
    ) -> Iterator[JsonObj]:
        """Watch events ({"type", "object"}) from `resource_version` until the server ends the watch.

        A stream that breaks (the API server went away mid-watch) raises ApiError with status 0, as a
        request that cannot be sent does; a line that is not JSON raises ValueError."""
        params = {
            "watch": True,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": True,
            **query,
        }
        path = resource.path(namespace) + _query(params)
        response = self._send("watch", "GET", path, timeout=timeout_seconds + 15.0, stream=True)
        try:
            yield from _lines(response)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "", f"watch {path}: the stream broke: {exc}") from None
        finally:
            response.release_conn()


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[JsonObj]:
    buffer = b""
    for chunk in response.stream(64 * 1024, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


_PLURALS = frozenset(r.plural for r in (PVS, PVCS, PODS, EVENTS, VOLUME_ATTACHMENTS, STORAGE_CLASSES, LEASES))


def _auth_headers(configuration: Any) -> Callable[[], dict[str, str]]:
    def headers() -> dict[str, str]:
        found: dict[str, str] = {}
        for setting in configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                found[setting["key"]] = setting["value"]
        return found

    return headers


def _pool(configuration: Any, size: int) -> urllib3.PoolManager:
    verify = bool(getattr(configuration, "verify_ssl", True))
    return urllib3.PoolManager(
        num_pools=4,
        maxsize=size,
        block=False,
        cert_reqs=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE,
        ca_certs=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        assert_hostname=getattr(configuration, "tls_server_name", None) or None,
    )


def _config_problem(kubeconfig: str | None, exc: Exception) -> str:
    if kubeconfig is None:
        return f"in-cluster configuration: cannot use it: {exc}"
    if isinstance(exc, (TypeError, AttributeError, UnicodeDecodeError)):  # the loader met no YAML mapping
        return f"{kubeconfig}: not a kubeconfig (expected a YAML mapping of clusters, users and contexts)"
    return f"{kubeconfig}: cannot use it: {exc}"


def connect(
    kubeconfig: str | None,
    context: str | None = None,
    pool_size: int = 16,
    on_request: RequestHook | None = None,
) -> KubeClient:
    """A client from `kubeconfig`, or from the in-cluster service account when it is None."""
    try:
        import yaml
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise KubeConfigError("the kubernetes package is missing (pip install 'ballast-csi[kube]')") from None
    configuration = client.Configuration()
    loaders: Any = config  # the package's loaders carry no type hints
    try:
        if kubeconfig is None:
            loaders.load_incluster_config(client_configuration=configuration)
        else:
            loaders.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as exc:
        raise KubeConfigError(_config_problem(kubeconfig, exc)) from None
    connection = Connection(
        configuration.host.rstrip("/"), _pool(configuration, pool_size), _auth_headers(configuration)
    )
    return KubeClient(connection, on_request)
