"""Prometheus metrics and /healthz on --metrics-address.

RPC counts and latency by method and code (fed by the logging interceptor), backend operation latency
and errors (by wrapping the backend instance's public operations), storage API retries (read from the
backend at each scrape), in-flight operations and, on nodes, staged volumes. /healthz answers 200 when
the backend probe says ready, 503 otherwise.
"""

from __future__ import annotations

import functools
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from csi.backends.base import Backend
from csi.config import Config
from csi.failures import DriverError, FailedPreconditionError, NotFoundError
from csi.flagtypes import parse_address
from csi.inflight import InFlight

log = logging.getLogger("ballast.metrics")

BACKEND_OPERATIONS = (
    "create_volume",
    "delete_volume",
    "get_volume",
    "list_volumes",
    "expand_volume",
    "modify_volume",
    "get_capacity",
    "attach",
    "detach",
    "create_snapshot",
    "delete_snapshot",
    "get_snapshot",
    "list_snapshots",
    "create_group_snapshot",
    "delete_group_snapshot",
    "get_group_snapshot",
    "resolve_device",
    "release_device",
    "volume_health",
    "list_volume_health",
    "storage_health",
    "prepared_device",
    "snapshot_allocated",  # until the first range: the stream itself is timed per RPC
    "snapshot_delta",
)
# Raised as answers, not failures: "no such object". An idempotent delete, detach or unstage takes it as
# done and a lookup as "none", so counting it would make successful calls look like backend errors; a
# NOT_FOUND the CO got still shows in ballast_rpc_total.
ANSWERS = (NotFoundError,)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class StagedCounter(Protocol):
    def staged_count(self) -> int: ...


class RetryCollector(Collector):
    """ballast_backend_retries_total{operation}: the backend's own count, read at every scrape."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "ballast_backend_retries",
            "Storage API calls the backend retried (throttling, server errors, unreachable), by operation",
            labels=["operation"],
        )
        for operation, count in sorted(self._backend.retries().items()):
            family.add_metric([operation], count)
        yield family


class Metrics:
    def __init__(self, config: Config, backend: Backend, inflight: InFlight) -> None:
        self.registry = CollectorRegistry()
        self._address = config.server.metrics_address
        self._backend = backend
        self._server: ThreadingHTTPServer | None = None
        self.rpc_total = Counter(
            "ballast_rpc_total",
            "CSI RPCs served, by method and gRPC code",
            ["method", "code"],
            registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            "ballast_rpc_duration_seconds",
            "CSI RPC latency, by method and gRPC code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.backend_seconds = Histogram(
            "ballast_backend_operation_duration_seconds",
            "Backend operation latency",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "ballast_backend_operation_errors_total",
            "Backend operations that failed, by error class (NotFoundError, an answer, is not counted)",
            ["operation", "error"],
            registry=self.registry,
        )
        inflight_gauge = Gauge(
            "ballast_inflight_operations", "Operations holding an in-flight key", registry=self.registry
        )
        inflight_gauge.set_function(lambda: float(len(inflight)))
        self.staged = Gauge(
            "ballast_node_staged_volumes", "Volumes staged on this node", registry=self.registry
        )
        self.registry.register(RetryCollector(backend))
        self._instrument(backend)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        self.rpc_total.labels(method, code).inc()
        self.rpc_seconds.labels(method, code).observe(seconds)

    def watch_node(self, node: StagedCounter) -> None:
        self.staged.set_function(lambda: float(node.staged_count()))

    def _instrument(self, backend: Backend) -> None:
        """Wrap the instance's operations so every call is timed and every failure counted."""
        for name in BACKEND_OPERATIONS:
            original = getattr(backend, name, None)
            if callable(original):
                setattr(backend, name, self._timed(name, original))

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        hist = self.backend_seconds.labels(name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            except ANSWERS:
                raise
            except Exception as exc:
                self.backend_errors.labels(name, type(exc).__name__).inc()
                raise
            finally:
                hist.observe(time.perf_counter() - start)

        return timed

    def healthy(self) -> bool:
        """The backend probe's answer; any failure means unhealthy. The reason is logged, not served: a
        DriverError (the backend's own verdict: a data dir not writable, an API unreachable) as one line,
        anything else with its stack."""
        try:
            return bool(self._backend.probe())
        except DriverError as exc:
            log.warning("health probe failed: %s", exc)
        except Exception:
            log.warning("health probe failed unexpectedly", exc_info=True)
        return False

    def start(self) -> None:
        """Bind --metrics-address (IPv4 or IPv6) and serve /metrics and /healthz on a thread. A bind that
        fails raises FailedPreconditionError naming the flag."""
        host, port = parse_address(self._address)
        server_class = _IPv6Server if ":" in host else _Server
        try:
            self._server = server_class((host, port), _handler(self))
        except OSError as exc:  # in use, not an address of this host, a name that does not resolve
            raise FailedPreconditionError(
                f"--metrics-address {self._address}: {exc.strerror or exc}"
            ) from exc
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()
        shown = f"[{host}]" if ":" in host else host
        log.info("metrics on http://%s:%d/metrics", shown, self.port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that left before its answer (a timed-out probe) is routine: a debug line, not the
        stack socketserver prints on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("metrics client %s left: %s", client_address, exc)
        else:
            log.warning("metrics request from %s failed", client_address, exc_info=True)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def _handler(metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    """The request handler of `metrics`' HTTP server: /metrics, /healthz, 404 for anything else."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, status, ctype = generate_latest(metrics.registry), 200, CONTENT_TYPE_LATEST
            elif self.path == "/healthz":
                ok = metrics.healthy()
                body, status, ctype = (b"ok\n" if ok else b"not ready\n"), (200 if ok else 503), "text/plain"
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
