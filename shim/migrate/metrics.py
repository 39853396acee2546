"""Prometheus metrics of the migration controller, and the HTTP server for /metrics and /healthz.

Series (all prefixed ballast_migrate_):
- operations_total{direction, result}: conversions and rollbacks by how they ended (done, waiting,
  busy, skipped, refused, failed);
- skips_total{reason}: PVs and objects left alone because of bad input or state (translation-failed,
  driver-missing, unknown-plugin, bad-record, claim-vanished, too-large, ...);
- api_requests_total{verb, resource, code}: every Kubernetes API request (code 0: no response);
- conflicts_retried_total: API 409 conflicts that were retried on fresh state;
- operation_seconds{direction}: time from the first step to done;
- volumes_waiting{reason}: PVs that would move but wait, by why (engine.WAIT_REASONS): in-use (a pod
  or attachment uses it), phase (Pending, Failed), pre-bound (its claimRef names an existing claim the
  PV binder has not bound yet), changed (it changed under a conversion, which starts over);
- inline_volumes{plugin}: in-tree pod volumes seen (reported, never converted);
- leader: 1 while this process leads (or runs without leader election);
- info{version, identity}: always 1.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from shim.migrate.options import parse_address

log = logging.getLogger(__name__)
BUCKETS = (0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600)


class Metrics:
    """One registry per controller (tests run several in one process)."""

    def __init__(self, version: str, identity: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.operations = Counter(
            "ballast_migrate_operations_total",
            "Conversions and rollbacks by result",
            ["direction", "result"],
            registry=r,
        )
        self.skips = Counter(
            "ballast_migrate_skips_total", "Objects skipped for bad input or state", ["reason"], registry=r
        )
        self.api_requests = Counter(
            "ballast_migrate_api_requests_total",
            "Kubernetes API requests",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.conflicts = Counter(
            "ballast_migrate_conflicts_retried_total", "API 409 conflicts retried", registry=r
        )
        self.seconds = Histogram(
            "ballast_migrate_operation_seconds",
            "First step to done, per PV",
            ["direction"],
            buckets=BUCKETS,
            registry=r,
        )
        self.waiting = Gauge("ballast_migrate_volumes_waiting", "PVs waiting to move", ["reason"], registry=r)
        self.inline = Gauge(
            "ballast_migrate_inline_volumes",
            "In-tree pod volumes seen (not converted)",
            ["plugin"],
            registry=r,
        )
        self.leader = Gauge("ballast_migrate_leader", "1 while this process leads", registry=r)
        info = Gauge("ballast_migrate_info", "Version and identity", ["version", "identity"], registry=r)
        info.labels(version, identity).set(1)

    def api_request(self, verb: str, resource: str, code: int) -> None:
        """The kube client's request hook."""
        self.api_requests.labels(verb, resource, str(code)).inc()


class MetricsServer:
    """/metrics (Prometheus text) and /healthz (200 while `healthy()`, else 503) on one address."""

    def __init__(self, address: str, metrics: Metrics, healthy: Callable[[], bool]) -> None:
        host, port = parse_address(address)
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._reply(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                elif self.path == "/healthz":
                    ok = healthy()
                    self._reply(200 if ok else 503, "text/plain", b"ok\n" if ok else b"unhealthy\n")
                else:
                    self._reply(404, "text/plain", b"not found\n")

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving /metrics and /healthz on port %d", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
