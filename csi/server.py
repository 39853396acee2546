"""Composition root: configuration -> backend -> services -> gRPC server on a unix socket.

`run(config)` serves until SIGTERM/SIGINT, which stop accepting calls, let in-flight calls finish (up to the
grace period, after which gRPC cancels them), wait for their handlers to return, remove the socket, close
the backend (releasing the data dir) and return 0. A handler still running SETTLE_SECONDS after the grace
ends the process instead (exit 1), and the programs it runs: no call may outlive "stopped" while a second
driver takes over the backend. The command line is csi/cli.py's.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import logging
import os
import signal
import socket
import stat
import threading
from concurrent import futures
from types import FrameType

import grpc

from csi import backend_registry as registry
from csi import logs
from csi._proto import csi_pb2_grpc
from csi.admission import AdmissionInterceptor, pool_size
from csi.backends.base import Backend
from csi.capabilities import Capabilities
from csi.config import Config, version
from csi.errors import ErrorInterceptor
from csi.identity import IdentityService
from csi.inflight import InFlight
from shim import failpoints

log = logging.getLogger("ballast.server")
GRACE_SECONDS = 30.0
# After the grace: how long the handlers of cancelled calls may take to return (a cancelled call's work,
# an mkfs say, runs on). GRACE_SECONDS + SETTLE_SECONDS stays below the chart's terminationGracePeriodSeconds.
SETTLE_SECONDS = 10.0


def socket_path(endpoint: str) -> str | None:
    """Filesystem path of a unix endpoint, None for tcp."""
    if endpoint.startswith("unix://"):
        return "/" + endpoint[len("unix://") :].lstrip("/")
    return None


def _prepare_socket(path: str) -> None:
    """Remove a stale socket left by a previous run. Refuse to replace anything else: a file that is not
    a socket, or a socket some process still accepts connections on (the two would split the calls)."""
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SystemExit(f"ballast-csi: --endpoint {path} exists and is not a socket; refusing to replace it")
    if _accepting(path):
        raise SystemExit(
            f"ballast-csi: another process is serving on --endpoint {path}; stop it first or choose "
            "another endpoint"
        )
    os.unlink(path)


def _accepting(path: str) -> bool:
    """True when a process listens on the unix socket `path` (a connection is accepted or queued)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except TimeoutError:
            return True  # listening, with a full backlog
        return True


def build_backend(config: Config) -> Backend:
    """The configured backend, built by its `from_config`; a name that registers something other than
    a Backend subclass -> UnknownBackend."""
    found = registry.load(config.backend.name)
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise registry.UnknownBackend(
            f"backend {config.backend.name!r} names {found!r}, which is not a csi.backends.base.Backend"
        )
    return found.from_config(config)


class Driver:
    """One driver process: owns the backend, the services and the gRPC server."""

    def __init__(self, config: Config, backend: Backend | None = None) -> None:
        failpoints.validate_environment()  # a malformed BALLAST_FAILPOINTS stops start-up, not a later step
        self.config = config
        self._socket = socket_path(config.server.endpoint)
        if self._socket:
            _prepare_socket(self._socket)  # before the backend: a refused start must not touch its state
        self.backend = backend or build_backend(config)
        self.caps = Capabilities(
            backend=self.backend.capabilities,
            serves_controller=config.runs_controller,
            serves_node=config.runs_node,
        )
        self.inflight = InFlight()
        self.metrics = None
        if config.server.metrics_address:
            from csi.metrics import Metrics

            self.metrics = Metrics(config, self.backend, self.inflight)
        observe = self.metrics.observe_rpc if self.metrics else None
        self._pool = futures.ThreadPoolExecutor(
            max_workers=pool_size(config.server.workers), thread_name_prefix="rpc"
        )
        self.server = grpc.server(
            self._pool,
            interceptors=[
                logs.LoggingInterceptor(observe),
                ErrorInterceptor(),
                AdmissionInterceptor(config.server.workers),
            ],
            options=[("grpc.so_reuseport", 0)],
        )
        self._register()
        self._stopped = threading.Event()

    def _register(self) -> None:
        cfg, backend, caps = self.config, self.backend, self.caps
        csi_pb2_grpc.add_IdentityServicer_to_server(
            IdentityService(cfg.backend.driver_name, version, backend, caps), self.server
        )
        if cfg.runs_controller:
            from csi.controller import ControllerService
            from csi.group_controller import GroupControllerService

            csi_pb2_grpc.add_ControllerServicer_to_server(
                ControllerService(backend, caps, self.inflight), self.server
            )
            csi_pb2_grpc.add_GroupControllerServicer_to_server(
                GroupControllerService(backend, caps, self.inflight), self.server
            )
        if caps.snapshot_metadata:
            from csi.snapshot_metadata import MetadataSettings, SnapshotMetadataService

            settings = MetadataSettings(
                fixed=cfg.server.snapshot_metadata_block_type == "fixed",
                block_size=cfg.server.snapshot_metadata_block_size
                or backend.capabilities.metadata_block_size,
            )
            csi_pb2_grpc.add_SnapshotMetadataServicer_to_server(
                SnapshotMetadataService(backend, settings), self.server
            )
        if cfg.runs_node:
            from csi.node import NodeService

            node = NodeService(backend, cfg, caps, self.inflight)
            if self.metrics is not None:
                self.metrics.watch_node(node)
            csi_pb2_grpc.add_NodeServicer_to_server(node, self.server)

    def start(self) -> None:
        """Bind --metrics-address, then the endpoint (socket mode 0660 regardless of umask), and start
        serving. A failure to bind either raises with nothing left bound (the socket file removed)."""
        if self.metrics is not None:
            self.metrics.start()  # first: a metrics address in use must not leave a served socket behind
        try:
            self._serve()
        except BaseException:
            if self.metrics is not None:
                self.metrics.stop()
            if self._socket:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._socket)
            raise
        log.info(
            "serving %s on %s (mode=%s, backend=%s)",
            self.config.backend.driver_name,
            self.config.server.endpoint,
            self.config.server.mode,
            self.config.backend.name,
        )

    def _serve(self) -> None:
        if self._socket:
            old = os.umask(0o117)
            try:
                self.server.add_insecure_port(f"unix://{self._socket}")
                self.server.start()
            finally:
                os.umask(old)
            os.chmod(self._socket, 0o660)
        else:
            self.server.add_insecure_port(self.config.server.endpoint[len("tcp://") :])
            self.server.start()

    def stop(self, grace: float = GRACE_SECONDS, settle: float = SETTLE_SECONDS) -> bool:
        """Stop accepting calls, let in-flight calls finish for up to `grace` seconds (gRPC then cancels
        them), wait up to `settle` seconds more for their handlers to return, then release the socket
        and the backend; True. A handler still running then keeps the backend (its data dir lock
        included): False, and the caller must end the process so no work outlives the stop. Idempotent."""
        if self._stopped.is_set():
            return True
        self._stopped.set()
        self.server.stop(grace).wait()
        if self.metrics is not None:
            self.metrics.stop()
        if not _returned(self._pool, settle):
            log.error(
                "calls still running %g s after the %g s grace (%d of them holding volumes); the "
                "backend stays open until the process ends",
                settle,
                grace,
                len(self.inflight),
            )
            return False
        if self._socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket)
        self.backend.close()
        return True


def _returned(pool: futures.ThreadPoolExecutor, timeout: float) -> bool:
    """True once every handler the pool runs has returned, False if one still runs after `timeout`."""
    waiter = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, name="rpc-drain", daemon=True)
    waiter.start()
    waiter.join(timeout)
    return not waiter.is_alive()


def _kill_children() -> None:
    """SIGKILL the programs this process runs (an mkfs of a stuck call), as the end of a pod would: they
    must not outlive the process and overlap the next driver on the same data dir."""
    for listing in glob.glob("/proc/self/task/*/children"):
        with contextlib.suppress(OSError), open(listing) as fh:
            for pid in fh.read().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _settle_collector() -> None:
    """Move what start-up built, which lives as long as the process, out of the cyclic collector's
    generations, and turn collection back on if the entry point (csi/__main__.py) held it off."""
    gc.freeze()
    gc.enable()


def run(config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    driver = Driver(config)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, draining", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    driver.start()
    remover = None
    if config.runs_node and config.node.node_name:
        from csi.taint import StartupTaintRemover

        remover = StartupTaintRemover(config.backend.driver_name, config.node.node_name)
        remover.start()
    _settle_collector()
    stop.wait()
    if remover is not None:
        remover.stop()
    if not driver.stop(GRACE_SECONDS, SETTLE_SECONDS):
        log.error("exiting without waiting for them: the process's end releases the data dir")
        logging.shutdown()
        _kill_children()
        os._exit(1)  # a normal exit would join the handler threads, that is wait for them after all
    log.info("stopped")
    return 0
