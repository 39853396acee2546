"""A tiny Kubernetes API stand-in on 127.0.0.1: recorded (or given) lists, and the objects in them.

Lists are served the way the API server pages them (`limit` / `continue`), filtered by a
`fieldSelector` of metadata.name and metadata.namespace equalities (the field labels every resource
has). The items of a list are read, created, merge-patched and deleted one by one at
`<list path>/<name>`, with the API server's rules the migration code relies on: metadata.uid and
metadata.resourceVersion in a patch, and preconditions.uid and preconditions.resourceVersion in
DeleteOptions, are preconditions (409 Conflict otherwise); every write bumps the resourceVersion;
DELETE of an object with finalizers only sets its deletionTimestamp, and the object goes once it is
deleting without finalizers. A watch (`?watch=true`) of a list path in `watches` streams the events
given for it, then breaks: the connection drops without ending the chunked stream, as when an API
server goes away. Other watches stay open, sending nothing, until `break_watches()` or the server
stops, and then break likewise. Every request is recorded (path, query, Authorization header, method);
unknown paths and configured failures are answered with a Kubernetes `Status` object.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

RECORDED = Path(__file__).parent / "testdata" / "cluster"
QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)

# API path -> recorded response file.
LIST_PATHS: Mapping[str, str] = {
    "/api/v1/persistentvolumes": "persistentvolumes.json",
    "/apis/storage.k8s.io/v1/storageclasses": "storageclasses.json",
    "/api/v1/pods": "pods.json",
    "/apis/storage.k8s.io/v1/csidrivers": "csidrivers.json",
}


Obj = dict[str, Any]
Answer = tuple[int, Obj]


@dataclass(frozen=True)
class SeenRequest:
    path: str
    query: Mapping[str, str]
    authorization: str
    method: str = "GET"


def recorded_lists(directory: Path = RECORDED) -> dict[str, dict[str, Any]]:
    """The recorded list responses, keyed by API path."""
    return {path: json.loads((directory / name).read_text()) for path, name in LIST_PATHS.items()}


def merge_patch(target: Any, patch: Any) -> Any:
    """`target` changed by the JSON merge patch `patch` (RFC 7386: null removes, objects merge)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _invalid(body: Obj) -> str | None:
    """Two of the API server's validations: label keys are qualified names, accessModes is a list."""
    for key in (body.get("metadata") or {}).get("labels") or {}:
        if not QUALIFIED_NAME.fullmatch(key):
            return (
                f'metadata.labels: Invalid value: "{key}": name part must consist of alphanumeric characters'
            )
    modes = (body.get("spec") or {}).get("accessModes")
    if modes is not None and not isinstance(modes, list):
        return "spec.accessModes: Invalid value: must be a list"
    return None


class FakeKubeAPI:
    """Context manager running the server in a thread; `url` is its base address."""

    def __init__(
        self,
        lists: Mapping[str, dict[str, Any]] | None = None,
        failures: Mapping[str, tuple[int, str]] | None = None,
        watches: Mapping[str, list[Obj]] | None = None,
    ) -> None:
        self.lists = dict(recorded_lists() if lists is None else lists)
        self.failures = dict(failures or {})
        self.watches = dict(watches or {})  # list path -> the events each watch streams before it breaks
        self.requests: list[SeenRequest] = []
        self._version = 1000
        self._lock = threading.Lock()
        self._held = threading.Event()  # set: the watches held open so far break
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.break_watches()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def break_watches(self) -> None:
        """Break every watch held open now (the API server went away)."""
        with self._lock:
            held, self._held = self._held, threading.Event()
        held.set()

    def write_kubeconfig(self, path: Path, token: str = "test-token", context: str = "fake") -> Path:
        """A kubeconfig pointing at this server with a bearer token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake-cluster", "user": "tester"}}],
            "current-context": context,
        }
        path.write_text(json.dumps(config))
        return path

    def _page(self, path: str, query: Mapping[str, str]) -> Answer:
        recorded = self.lists[path]
        items = recorded.get("items", [])
        for term in filter(None, (query.get("fieldSelector") or "").split(",")):
            field, _, value = term.partition("=")
            if field not in ("metadata.name", "metadata.namespace"):  # what every resource supports
                return 400, _status(400, "BadRequest", f'field label not supported: "{field}"')
            key = field.removeprefix("metadata.")
            items = [i for i in items if i.get("metadata", {}).get(key) == value.removeprefix("=")]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items)
        page = dict(recorded)
        page["items"] = items[start : start + limit]
        metadata = dict(recorded.get("metadata", {}))
        if start + limit < len(items):
            metadata["continue"] = str(start + limit)
        page["metadata"] = metadata
        return 200, page

    def _written(self, obj: Obj) -> Obj:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        return obj

    def _create(self, path: str, body: Obj, dry_run: bool) -> Answer:
        """A create: validated first (422), then a taken name (409); a dry run stores nothing."""
        items = self.lists.setdefault(path, {"kind": "List", "metadata": {}, "items": []})["items"]
        metadata = body.setdefault("metadata", {})
        metadata.setdefault("name", f"{metadata.get('generateName', 'object-')}{self._version}")
        invalid = _invalid(body)
        if invalid is not None:
            return 422, _status(422, "Invalid", invalid)
        if any(i["metadata"]["name"] == metadata["name"] for i in items):
            return 409, _status(409, "AlreadyExists", f"{metadata['name']} already exists")
        if dry_run:
            return 201, body
        metadata["uid"] = str(uuid.uuid4())
        items.append(self._written(body))
        return 201, body

    def _patch(self, items: list[Obj], obj: Obj, patch: Obj) -> Answer:
        wanted = patch.get("metadata") or {}
        for field in ("uid", "resourceVersion"):
            if field in wanted and wanted[field] != obj["metadata"].get(field):
                return 409, _status(409, "Conflict", f"precondition failed: {field}")
        patched = self._written(merge_patch(obj, patch))
        items[items.index(obj)] = patched
        if patched["metadata"].get("deletionTimestamp") and not patched["metadata"].get("finalizers"):
            items.remove(patched)
        return 200, patched

    def _replace(self, items: list[Obj], obj: Obj, body: Obj) -> Answer:
        """An update: refused (409) unless it names the stored resourceVersion, as the API server does."""
        if body.get("metadata", {}).get("resourceVersion") != obj["metadata"].get("resourceVersion"):
            return 409, _status(409, "Conflict", "the object has been modified")
        body["metadata"]["uid"] = obj["metadata"].get("uid")
        items[items.index(obj)] = self._written(body)
        return 200, body

    def _delete(self, items: list[Obj], obj: Obj, options: Obj) -> Answer:
        for field, wanted in (options.get("preconditions") or {}).items():
            if wanted and wanted != obj["metadata"].get(field):
                return 409, _status(409, "Conflict", f"precondition failed: {field}")
        if obj["metadata"].get("finalizers"):
            obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            self._written(obj)
        else:
            items.remove(obj)
        return 200, obj

    def answer(self, method: str, path: str, query: Mapping[str, str], body: Obj) -> Answer:
        """The response to a request that is not a watch (the caller holds the lock)."""
        if path in self.failures:
            code, reason = self.failures[path]
            return code, _status(code, reason, f"{path} is {reason.lower()} for this user")
        if method == "GET" and path in self.lists:
            return self._page(path, query)
        if method == "POST":
            return self._create(path, body, dry_run=query.get("dryRun") == "All")
        parent, _, name = path.rpartition("/")
        items = self.lists.get(parent, {}).get("items", [])
        obj = next((i for i in items if i.get("metadata", {}).get("name") == name), None)
        if obj is None:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        if method == "PATCH":
            return self._patch(items, obj, body)
        if method == "DELETE":
            return self._delete(items, obj, body)
        if method == "PUT":
            return self._replace(items, obj, body)
        return 200, obj

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # for the chunked watch streams

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                with api._lock:
                    api.requests.append(
                        SeenRequest(url.path, query, self.headers.get("Authorization", ""), method)
                    )
                    streams = query.get("watch") == "true" and url.path not in api.failures
                    if streams:
                        events = api.watches.get(url.path)
                        lines = [json.dumps(e).encode() + b"\n" for e in events or []]
                        held = api._held if events is None else None
                    else:
                        code, answer = api.answer(method, url.path, query, body)
                        data = json.dumps(answer).encode()
                if streams:
                    self._stream_then_break(lines, held)
                    return
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream_then_break(self, lines: list[bytes], held: threading.Event | None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in lines:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                if held is not None:
                    held.wait()
                self.close_connection = True  # and no last chunk: the stream ends prematurely

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

        return Handler
