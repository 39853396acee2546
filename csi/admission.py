"""Admission of RPCs to the worker threads, so the calls a CO polls a plugin's health with are never
stuck behind volume work.

grpcio runs every call on one thread pool, in arrival order. Volume calls can hold their thread for
long: a stage waits for one of the node's format slots, then for mkfs; an EBS create waits for the
volume to become available. With every thread taken, a Probe would queue behind them past the liveness
probe's timeout, and the kubelet would restart the plugin in the middle of that work.

So the pool has threads of three kinds. At most `workers` volume calls run at once; up to `backlog` more
wait for one of them, each parked on its own idle thread (the queue they would otherwise form inside
grpcio, made visible); RESERVED threads are left for the QUICK calls, which never wait. A volume call
that finds the backlog full is answered UNAVAILABLE at once: the CO retries it with backoff, as it does
any transient failure.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from csi.failures import DeadlineError, GaveUpError, TransientError
from csi.interceptors import Behavior, MethodInterceptor, StreamBehavior

# Calls that answer from memory: the health and identity questions a CO (or a liveness probe) asks.
QUICK = frozenset(
    {
        "/csi.v1.Identity/Probe",
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Identity/GetPluginCapabilities",
        "/csi.v1.Controller/ControllerGetCapabilities",
        "/csi.v1.GroupController/GroupControllerGetCapabilities",
        "/csi.v1.Node/NodeGetCapabilities",
        "/csi.v1.Node/NodeGetInfo",
    }
)
RESERVED = 2
BACKLOG_PER_WORKER = 4


def pool_size(workers: int) -> int:
    """Threads the server's pool needs: running and waiting volume calls, and the reserve."""
    return workers * (1 + BACKLOG_PER_WORKER) + RESERVED


class AdmissionInterceptor(MethodInterceptor):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self._workers = workers
        self._admitted = threading.BoundedSemaphore(workers * (1 + BACKLOG_PER_WORKER))
        self._running = threading.BoundedSemaphore(workers)

    @contextlib.contextmanager
    def _turn(self, method: str, context: Any) -> Iterator[None]:
        """Admitted, then running; a call whose client gave up while it waited (its deadline passed, or
        it was cancelled) is not run at all. A call without a deadline waits as long as it takes."""
        name = method.rsplit("/", 1)[-1]
        if not self._admitted.acquire(blocking=False):
            raise TransientError(
                f"{name}: the plugin is busy ({self._workers} volume calls running "
                f"and {self._workers * BACKLOG_PER_WORKER} waiting); retry later, or raise --workers"
            )
        try:
            if not self._running.acquire(timeout=_patience(context)):
                raise DeadlineError(f"{name}: the deadline passed while it waited for a worker")
            try:
                if not context.is_active():
                    raise GaveUpError(f"{name}: the client gave up while it waited for a worker")
                yield
            finally:
                self._running.release()
        finally:
            self._admitted.release()

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        if method in QUICK:
            return behavior

        def admitted(request: Any, context: Any) -> Any:
            with self._turn(method, context):
                return behavior(request, context)

        return admitted

    def wrap_stream(self, method: str, behavior: StreamBehavior) -> StreamBehavior:
        def admitted(request: Any, context: Any) -> Iterator[Any]:
            with self._turn(method, context):
                yield from behavior(request, context)

        return admitted


def _patience(context: Any) -> float | None:
    """Seconds a call may wait for a worker: until its deadline. Without one, grpcio reports a time no
    lock accepts (about 9e18 s): None, no limit."""
    remaining = context.time_remaining()
    if remaining is None or remaining > threading.TIMEOUT_MAX:
        return None
    return max(float(remaining), 0.0)
