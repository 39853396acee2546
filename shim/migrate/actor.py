"""Composition of one migration actor (the controller, or a one-shot command) from parsed flags."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from shim import Translator
from shim.migrate import kube
from shim.migrate.engine import Engine
from shim.migrate.events import EventRecorder
from shim.migrate.lock import Holder, PVLocks
from shim.migrate.metrics import Metrics
from shim.migrate.options import version
from shim.migrate.steps import Context, LiveDrivers
from shim.migrate.twins import Twins
from shim.migrate.usage import Claims, Usage


class Actor(NamedTuple):
    client: kube.KubeClient
    translator: Translator
    metrics: Metrics
    events: EventRecorder
    locks: PVLocks
    engine: Engine
    twins: Twins


def connect(args: argparse.Namespace, metrics: Metrics) -> kube.KubeClient:
    """A client for --kubeconfig/--context (in-cluster without), counted in `metrics`."""
    return kube.connect(
        args.kubeconfig, args.context, pool_size=args.workers + 8, on_request=metrics.api_request
    )


def build(
    args: argparse.Namespace, client: kube.KubeClient, metrics: Metrics, claims: Claims, usage: Usage
) -> Actor:
    """Everything that moves PVs and twins for this actor; events are only logged in a dry run."""
    translator = Translator()
    events = EventRecorder(client, args.holder_identity, post=not args.dry_run)
    holder = Holder(args.holder_identity, version(), max(1, round(args.lock_duration)))
    locks = PVLocks(client, args.namespace, holder)
    context = Context(client, claims, usage, events, metrics, args.bound_timeout, LiveDrivers(client))
    engine = Engine(context, locks, translator, args.holder_identity)
    twins = Twins(client, translator, events, metrics, getattr(args, "move_default_class", False))
    return Actor(client, translator, metrics, events, locks, engine, twins)
