"""Entry points of `ballast-migrate controller | apply | rollback | status` (after flag parsing).

Exit codes: 0 done; 1 something blocked (or, for the controller, its leader lease was lost, so the
pod restarts as Kubernetes' own components do); 2 bad input: flags that do not fit (a --namespace that
is not a valid namespace name and a --selector the API server cannot parse included), an unusable
kubeconfig, an API server that cannot be reached or refuses the first request. A later API error of
`apply`, `rollback` or `status` that stops the command raises oneshot.ClusterError: exit 2 when the
credentials are refused (401, 403) or no response came, else 1.
"""

from __future__ import annotations

import argparse
import re
import signal
import threading
from typing import TextIO

from shim import failpoints
from shim.migrate import logs, oneshot, status
from shim.migrate.actor import build, connect
from shim.migrate.controller import Controller
from shim.migrate.journal import CONVERT, ROLLBACK
from shim.migrate.kube import PVS, ApiError, KubeClient
from shim.migrate.leader import ElectionConfig, LeaderElector
from shim.migrate.lock import Holder, PVLocks
from shim.migrate.metrics import Metrics, MetricsServer
from shim.migrate.oneshot import ClusterError
from shim.migrate.options import KubeConfigError, UsageError, check, version
from shim.migrate.usage import LiveClaims, live_usage

LEADER_LEASE = "ballast-migrate-controller"
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label, as Kubernetes wants


def _check_namespace(namespace: str) -> None:
    """UsageError unless `namespace` can name a namespace (the API server would list nothing in it)."""
    if not NAMESPACE_NAME.fullmatch(namespace):
        raise UsageError(
            f"--namespace: {namespace!r} is not a valid namespace name (at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit)"
        )


def _elector(args: argparse.Namespace, client: KubeClient, metrics: Metrics) -> LeaderElector:
    config = ElectionConfig(
        args.namespace,
        LEADER_LEASE,
        args.holder_identity,
        version(),
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    )
    return LeaderElector(client, config, lambda leading: metrics.leader.set(1 if leading else 0))


def run_controller(args: argparse.Namespace) -> int:
    logs.setup(args.log_format)
    metrics = Metrics(version(), args.holder_identity)
    client = connect(args, metrics)
    if args.selector:
        _probe(client, args.selector, reachable=False)
    controller = Controller(client, metrics, args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = (
        MetricsServer(args.metrics_address, metrics, controller.healthy) if args.metrics_address else None
    )
    if server is not None:
        server.start()
    try:
        if args.leader_elect and not args.dry_run:
            return 0 if _elector(args, client, metrics).run(controller.run, stop) else 1
        metrics.leader.set(1)
        controller.run(stop)
        return 0
    finally:
        if server is not None:
            server.stop()
        client.close()


def _probe(client: KubeClient, selector: str | None, *, reachable: bool) -> None:
    """Fail early (exit 2) when the API server refuses --selector (400: it parses it as every later list
    would), or, when `reachable` is asked, when it cannot be reached or refuses us. The controller asks
    only about its selector: a cluster it cannot reach yet it keeps retrying, as Kubernetes' own do."""
    try:
        client.list_page(PVS, limit=1, **({"labelSelector": selector} if selector else {}))
    except ApiError as exc:
        if exc.status == 400 and selector:
            raise UsageError(
                f"--selector: {selector!r} is not a valid label selector: {exc.message}"
            ) from None
        if reachable:
            raise UsageError(f"cannot use the cluster: {exc}") from None


def run_one_shot(args: argparse.Namespace, out: TextIO) -> int:
    metrics = Metrics(version(), getattr(args, "holder_identity", "") or "status")
    if args.command == "status":
        args.workers = 4
    client = connect(args, metrics)
    try:
        _probe(client, args.selector, reachable=True)
        usage = live_usage(client)
        if args.command == "status":
            locks = PVLocks(client, args.namespace, Holder("status", version(), 30))
            return status.run(args, client, locks, usage, out)
        actor = build(args, client, metrics, LiveClaims(client), usage)
        return oneshot.run(args, actor, CONVERT if args.command == "apply" else ROLLBACK, out)
    finally:
        client.close()


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run a migration subcommand; UsageError / KubeConfigError propagate (exit 2 in the CLI), and
    ClusterError (its exit_code)."""
    check(args)
    _check_namespace(args.namespace)
    failpoints.validate_environment()
    if args.command == "controller":
        return run_controller(args)
    return run_one_shot(args, out)


__all__ = ["ClusterError", "KubeConfigError", "UsageError", "run"]
