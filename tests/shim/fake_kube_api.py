"""A tiny Kubernetes API stand-in: serves recorded list responses over HTTP on 127.0.0.1.

It honours `limit` / `continue` the way the API server pages lists, records every request (path,
query, Authorization header) for assertions, and answers unknown paths or configured failures with a
Kubernetes `Status` object.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

RECORDED = Path(__file__).parent / "testdata" / "cluster"

# API path -> recorded response file.
LIST_PATHS: Mapping[str, str] = {
    "/api/v1/persistentvolumes": "persistentvolumes.json",
    "/apis/storage.k8s.io/v1/storageclasses": "storageclasses.json",
    "/api/v1/pods": "pods.json",
    "/apis/storage.k8s.io/v1/csidrivers": "csidrivers.json",
}


@dataclass(frozen=True)
class SeenRequest:
    path: str
    query: Mapping[str, str]
    authorization: str


def recorded_lists(directory: Path = RECORDED) -> dict[str, dict[str, Any]]:
    """The recorded list responses, keyed by API path."""
    return {path: json.loads((directory / name).read_text()) for path, name in LIST_PATHS.items()}


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


class FakeKubeAPI:
    """Context manager running the server in a thread; `url` is its base address."""

    def __init__(
        self,
        lists: Mapping[str, dict[str, Any]] | None = None,
        failures: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.lists = dict(recorded_lists() if lists is None else lists)
        self.failures = dict(failures or {})
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
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
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

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

    def _page(self, path: str, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        if path in self.failures:
            code, reason = self.failures[path]
            return code, _status(code, reason, f"{path} is {reason.lower()} for this user")
        recorded = self.lists.get(path)
        if recorded is None:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        items = recorded.get("items", [])
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items)
        page = dict(recorded)
        page["items"] = items[start : start + limit]
        metadata = dict(recorded.get("metadata", {}))
        if start + limit < len(items):
            metadata["continue"] = str(start + limit)
        page["metadata"] = metadata
        return 200, page

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                with api._lock:
                    api.requests.append(SeenRequest(url.path, query, self.headers.get("Authorization", "")))
                code, body = api._page(url.path, query)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

        return Handler
