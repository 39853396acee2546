"""Flags of `ballast-migrate controller | apply | rollback | status`, and their checks.

Bad values stop argparse with exit 2 and a message naming the flag; `check()` does the cross-flag
checks after parsing (UsageError, also exit 2). Imports stay light: `ballast-migrate translate`
builds these parsers too.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from functools import cache
from pathlib import Path

from shim.gates import PLUGIN_GATES, FeatureGateError, FeatureGates, parse_bool

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
SHORT_PLUGINS = {name.removeprefix("kubernetes.io/"): name for name in PLUGIN_GATES}
SHORT_PLUGINS["portworx"] = "kubernetes.io/portworx-volume"
SHORT_PLUGINS["vsphere"] = "kubernetes.io/vsphere-volume"


class UsageError(Exception):
    """Flags that parse but do not fit together, or a cluster that cannot be used (exit 2)."""


class KubeConfigError(ValueError):
    """No usable kubeconfig or in-cluster configuration; the message says which and why."""


@cache
def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ballast-csi")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def duration(text: str) -> float:
    """Seconds from a Go duration: `15s`, `1m30s`, `500ms`, `2h`."""
    if not text or _DURATION.sub("", text) or not _DURATION.search(text):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 15s, 2m, 1m30s)")
    seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text!r}")
    return seconds


def workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 256, got {text!r}")
    return int(text)


def boolean(text: str) -> bool:
    try:
        return parse_bool(text)
    except FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def gates(text: str) -> FeatureGates:
    try:
        return FeatureGates.parse(text)
    except FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def plugin(text: str) -> str:
    name = SHORT_PLUGINS.get(text, text)
    if name not in PLUGIN_GATES:
        known = ", ".join(sorted(SHORT_PLUGINS))
        raise argparse.ArgumentTypeError(f"unknown plugin {text!r} (known: {known}, or kubernetes.io/<name>)")
    return name


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' or ':port' (all interfaces); ValueError naming the value otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be host:port or :port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def metrics_address(text: str) -> str:
    try:
        if text:
            parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def default_namespace() -> str:
    """POD_NAMESPACE, else the service account's namespace, else `default`."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def default_identity(command: str) -> str:
    """`<pod name>_<version>` for the controller (POD_NAME, else the host name); one-shot commands
    add their pid, so two runs on one host never share an identity."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    if command != "controller":
        base = f"{command}-{base}-{os.getpid()}"
    return f"{base}_{version()}"


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the in-cluster service account)")
    parser.add_argument("--context", help="kubeconfig context (default: its current context)")
    parser.add_argument(
        "--namespace",
        default=None,
        metavar="NS",
        help="namespace of the lock Leases (default: POD_NAMESPACE, the service account's, or default)",
    )


def _selector(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--selector",
        "-l",
        default="",
        metavar="LABELS",
        help="only PVs with these labels (a label selector, e.g. migrate=wave-1): migrate in waves",
    )


def _actor(parser: argparse.ArgumentParser, default_workers: int) -> None:
    parser.add_argument(
        "--holder-identity",
        default=None,
        metavar="ID",
        help="identity in the Leases (default: <pod or host name>_<version>)",
    )
    parser.add_argument("--workers", type=workers, default=default_workers, help="PVs moved at once")
    parser.add_argument(
        "--lock-duration",
        type=duration,
        default=30.0,
        metavar="DURATION",
        help="per-PV lock Lease duration: how long a dead actor's lock blocks others (30s)",
    )
    parser.add_argument(
        "--bound-timeout",
        type=duration,
        default=600.0,
        metavar="DURATION",
        help="warn (Event) when a claim is not Bound again this long after re-creation (10m)",
    )
    parser.add_argument("--dry-run", action="store_true", help="change nothing; report what would happen")


def _controller(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "controller",
        help="run the migration controller",
        description="Convert in-tree PVs of every plugin whose gate is on to CSI, roll back "
        "those whose gate is off, keep StorageClass twins, report inline volumes.",
    )
    _connection(p)
    _actor(p, 10)
    _selector(p)
    p.add_argument(
        "--feature-gates",
        type=gates,
        default=FeatureGates(),
        metavar="A=true,B=false",
        help="migration gates, Kubernetes names (all off by default)",
    )
    p.add_argument(
        "--leader-elect",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="elect a leader with a Lease (default true; --leader-elect=false turns it off)",
    )
    p.add_argument("--leader-elect-lease-duration", type=duration, default=15.0, metavar="DURATION")
    p.add_argument("--leader-elect-renew-deadline", type=duration, default=10.0, metavar="DURATION")
    p.add_argument("--leader-elect-retry-period", type=duration, default=2.0, metavar="DURATION")
    p.add_argument(
        "--metrics-address",
        type=metrics_address,
        default="",
        metavar="HOST:PORT",
        help="serve /metrics and /healthz here (default: off)",
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument(
        "--resync-period",
        type=duration,
        default=300.0,
        metavar="DURATION",
        help="re-examine every object this often, besides watch events (5m)",
    )
    p.add_argument(
        "--move-default-class",
        action="store_true",
        help="move the default-class annotation from an in-tree StorageClass to its twin",
    )


def _one_shot(commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str) -> None:
    p = commands.add_parser(
        name,
        help=text,
        description=f"{text}. Exit 0 when everything selected is done, "
        "1 when something is blocked (in use, busy, refused, skipped), 2 on bad input.",
    )
    _connection(p)
    _actor(p, 10)
    _selector(p)
    p.add_argument("--pv", action="append", default=[], metavar="NAME", help="only this PV (repeatable)")
    p.add_argument(
        "--plugin",
        action="append",
        type=plugin,
        default=[],
        metavar="NAME",
        help="only PVs and StorageClasses of this in-tree plugin (repeatable), e.g. aws-ebs",
    )
    p.add_argument(
        "--timeout",
        type=duration,
        default=900.0,
        metavar="DURATION",
        help="give up waiting for busy locks and rebinding claims after this long (15m)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    if name == "apply":
        p.add_argument(
            "--move-default-class",
            action="store_true",
            help="move the default-class annotation to the StorageClass twins",
        )


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add controller, apply, rollback and status to the `ballast-migrate` parser."""
    _controller(commands)
    _one_shot(commands, "apply", "convert in-tree PVs to CSI now (and create StorageClass twins)")
    _one_shot(commands, "rollback", "roll converted PVs back to their in-tree originals now")
    p = commands.add_parser("status", help="show each in-tree or converted PV and its state")
    _connection(p)
    _selector(p)
    p.add_argument("--pv", action="append", default=[], metavar="NAME", help="only this PV (repeatable)")
    p.add_argument("--plugin", action="append", type=plugin, default=[], metavar="NAME")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")


def check(args: argparse.Namespace) -> None:
    """Cross-flag checks and defaults; raises UsageError."""
    if args.kubeconfig is not None and not Path(args.kubeconfig).is_file():
        raise UsageError(f"--kubeconfig: no such file: {args.kubeconfig}")
    args.namespace = args.namespace or default_namespace()
    if hasattr(args, "holder_identity"):
        args.holder_identity = args.holder_identity or default_identity(args.command)
    if args.command == "controller" and args.leader_elect:
        if not args.leader_elect_renew_deadline < args.leader_elect_lease_duration:
            raise UsageError(
                "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration"
            )
        if not args.leader_elect_retry_period < args.leader_elect_renew_deadline:
            raise UsageError("--leader-elect-retry-period must be shorter than --leader-elect-renew-deadline")
    if args.command in ("controller", "apply", "rollback") and args.lock_duration < 2:
        raise UsageError("--lock-duration must be at least 2s")
