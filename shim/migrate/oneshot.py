"""`ballast-migrate apply` and `ballast-migrate rollback`: the engine run once over selected PVs.

Selection: `--pv NAME` (repeatable), else every PV of the `--plugin`s given (all seven without one):
in-tree PVs for apply, converted PVs (they carry a record) for rollback; PVs whose lock Lease holds an
unfinished journal are always included, so a killed run is finished by the next. Without --pv, apply
also creates the StorageClass twins of those plugins and rollback removes the unused ones.

Busy locks are waited for and claims that rebind are waited for, up to --timeout; a PV in use is not
waited for (it is reported, exit 1; run again once it is free), nor is one the API refused in a way a
retry meets again (a missing namespace, RBAC: ApiError.lasting). Exit 0 when everything selected ended
done, noop or planned; 1 otherwise. A PV whose run raised something unexpected, or that got no result
at all, counts as failed (logged once; the traceback only at debug level).

The cluster is read (PVs, lock Leases, StorageClasses) before anything changes; an API error there
raises ClusterError, naming what failed, with the exit code: 2 when the cluster or the credentials
cannot be used (401, 403, no response), else 1. Once PVs move, API errors become failed results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from shim import TranslationError
from shim.migrate import kube
from shim.migrate import objects as o
from shim.migrate.actor import Actor
from shim.migrate.engine import BUSY, DONE, FAILED, NOOP, PENDING, PLANNED, Engine, Outcome
from shim.migrate.journal import CONVERT
from shim.migrate.kube import ApiError
from shim.migrate.lock import has_journal, pv_of
from shim.migrate.options import UsageError
from shim.migrate.table import render_table
from shim.migrate.twins import ANN_PLUGIN, ANN_TWIN_OF, TwinResult, is_twin, twin_name
from shim.migrate.workqueue import WorkQueue

log = logging.getLogger(__name__)
OK_RESULTS = frozenset({DONE, NOOP, PLANNED})
RETRY_DELAYS = {PENDING: 1.0, FAILED: 5.0}
UNUSABLE = frozenset({0, 401, 403})  # no response, credentials refused, not allowed


class ClusterError(Exception):
    """A request a command cannot go on without failed; `exit_code` 2 for UNUSABLE statuses, else 1."""

    def __init__(self, what: str, cause: ApiError) -> None:
        super().__init__(f"{what}: {cause}")
        self.exit_code = 2 if cause.status in UNUSABLE else 1


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Raise an ApiError inside as a ClusterError saying `what` failed."""
    try:
        yield
    except ApiError as exc:
        raise ClusterError(what, exc) from None


class Runner:
    """Runs the engine over PV names with a worker pool, retrying busy/pending/failed until a deadline."""

    def __init__(
        self, engine: Engine, workers: int, timeout: float, lock_seconds: float, dry_run: bool
    ) -> None:
        self._engine = engine
        self._workers = workers
        self._deadline = time.monotonic() + timeout
        self._busy_delay = max(1.0, lock_seconds / 2)
        self._dry_run = dry_run
        self._queue = WorkQueue()
        self._results: dict[str, Outcome] = {}
        self._lock = threading.Lock()

    def run(self, names: Iterable[str], direction: str) -> list[Outcome]:
        ordered = list(dict.fromkeys(names))
        for name in ordered:
            self._queue.add(name)
        threads = [threading.Thread(target=self._work, args=(direction,)) for _ in range(self._workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._engine.release_held()
        lost = Outcome("", direction, FAILED, "no result: its worker stopped before it finished")
        return [self._results.get(name, lost._replace(pv=name)) for name in ordered]

    def _work(self, direction: str) -> None:
        while True:
            key = self._queue.get(timeout=0.2)
            if key is None:
                if self._queue.idle() or time.monotonic() > self._deadline:
                    self._queue.shutdown()
                    return
                continue
            try:
                outcome = self._one(key, direction)
            except Exception as exc:  # a bug or an unforeseen error: this PV failed, the others go on
                debug = log.isEnabledFor(logging.DEBUG)  # the traceback only when debugging
                log.error("PV %s: %s failed: %r", key, direction, exc, exc_info=debug)
                outcome = Outcome(key, direction, FAILED, f"unexpected error: {exc!r}")
            finally:
                self._queue.done(key)
            with self._lock:
                self._results[key] = outcome

    def _one(self, name: str, direction: str) -> Outcome:
        if self._dry_run:
            return self._engine.plan(name, direction)
        outcome = self._engine.run(name, direction)
        delay = self._busy_delay if outcome.result == BUSY else RETRY_DELAYS.get(outcome.result)
        if delay is not None and not outcome.lasting and time.monotonic() + delay < self._deadline:
            self._queue.add_after(name, delay)
        return outcome


def _plugin_of(pv: o.JsonObj, actor: Actor, direction: str) -> str | None:
    if direction == CONVERT:
        return o.in_tree_plugin(pv)
    if o.ANN_ORIGINAL not in o.annotations_of(pv):
        return None
    try:
        return actor.translator.get_in_tree_name_from_csi_name(o.csi_driver(pv) or "")
    except TranslationError:
        return None


def select(args: argparse.Namespace, actor: Actor, direction: str) -> list[str]:
    """PV names to run, in name order (see the module docstring); unfinished journals included."""
    with doing("listing PersistentVolumes"):
        pvs, _ = actor.client.list_all(kube.PVS, labelSelector=args.selector or None)
    with doing(f"listing the lock Leases in namespace {actor.locks.namespace}"):
        leases = actor.locks.list_leases()
    names = {o.name_of(pv) for pv in pvs}
    missing = [n for n in args.pv if n not in names]
    journals = {pv_of(lease) for lease in leases if has_journal(lease)}
    if args.pv:
        unknown = [n for n in missing if n not in journals]
        if unknown:
            raise UsageError(f"--pv: no such PersistentVolume: {', '.join(unknown)}")
        return sorted(set(args.pv))
    plugins = set(args.plugin)
    chosen = {
        o.name_of(pv)
        for pv in pvs
        if (p := _plugin_of(pv, actor, direction)) and (not plugins or p in plugins)
    }
    return sorted(chosen | journals)


def storage_classes(args: argparse.Namespace, actor: Actor) -> list[o.JsonObj]:
    """Every StorageClass, read before any PV moves; none with --pv (twins are left alone then)."""
    if args.pv:
        return []
    with doing("listing StorageClasses"):
        classes, _ = actor.client.list_all(kube.STORAGE_CLASSES)
    return classes


def twins(
    args: argparse.Namespace, actor: Actor, direction: str, classes: list[o.JsonObj]
) -> list[TwinResult]:
    """Create (apply) or remove unused (rollback) twins of the selected plugins among `classes`; an
    API error fails that twin only."""
    plugins = set(args.plugin) or None
    if direction == CONVERT:
        chosen = [
            sc for sc in classes if not is_twin(sc) and _wanted(str(sc.get("provisioner")), plugins, actor)
        ]
        if args.dry_run:
            return [_planned(actor, sc) for sc in chosen]
        return [_guarded(o.name_of(sc), twin_name(o.name_of(sc)), actor.twins.ensure, sc) for sc in chosen]
    ours = [
        sc
        for sc in classes
        if is_twin(sc) and _wanted(o.annotations_of(sc).get(ANN_PLUGIN, ""), plugins, actor)
    ]
    try:
        claims, _ = actor.client.list_all(kube.PVCS) if ours else ([], "")
    except ApiError as exc:
        failed = f"listing PersistentVolumeClaims: API error: {exc}"
        return [TwinResult(_twin_of(twin), o.name_of(twin), FAILED, failed) for twin in ours]
    results = []
    for twin in ours:
        users = [
            o.name_of(c) for c in claims if (c.get("spec") or {}).get("storageClassName") == o.name_of(twin)
        ]
        if args.dry_run:
            message = f"would remove once unused ({len(users)} use it)"
            results.append(TwinResult(_twin_of(twin), o.name_of(twin), "planned", message))
        else:
            results.append(_guarded(_twin_of(twin), o.name_of(twin), actor.twins.remove, twin, users))
    return results


def _twin_of(twin: o.JsonObj) -> str:
    return o.annotations_of(twin).get(ANN_TWIN_OF, "")


def _guarded(original: str, twin: str, action: Callable[..., TwinResult], *args: Any) -> TwinResult:
    """`action(*args)`, or a failed result when it meets an API error."""
    try:
        return action(*args)
    except ApiError as exc:
        return TwinResult(original, twin, FAILED, f"API error: {exc}")


def _wanted(plugin: str, plugins: set[str] | None, actor: Actor) -> bool:
    known = actor.translator.is_migratable_in_tree_plugin_by_name(plugin)
    return known and (plugins is None or plugin in plugins)


def _planned(actor: Actor, sc: o.JsonObj) -> TwinResult:
    desired = actor.twins.desired(sc)
    if isinstance(desired, TwinResult):
        return desired
    return TwinResult(
        o.name_of(sc), desired["metadata"]["name"], "planned", f"would create {desired['provisioner']} twin"
    )


def write(outcomes: list[Outcome], twin_results: list[TwinResult], output: str, out: TextIO) -> None:
    if output == "json":
        doc = {
            "volumes": [
                {
                    "pv": x.pv,
                    "direction": x.direction,
                    "result": x.result,
                    "message": x.message,
                    **({"target": x.target} if x.target else {}),
                }
                for x in outcomes
            ],
            "storageClasses": [t._asdict() for t in twin_results],
        }
        out.write(json.dumps(doc, indent=2) + "\n")
        return
    if outcomes:
        rows = [[x.pv, x.direction, x.result, x.message] for x in outcomes]
        out.write(render_table(["PV", "DIRECTION", "RESULT", "MESSAGE"], rows))
    if twin_results:
        rows = [[t.storage_class, t.twin, t.result, t.message] for t in twin_results]
        out.write(render_table(["STORAGECLASS", "TWIN", "RESULT", "MESSAGE"], rows))
    if not outcomes and not twin_results:
        out.write("nothing selected\n")


def run(args: argparse.Namespace, actor: Actor, direction: str, out: TextIO) -> int:
    names = select(args, actor, direction)
    classes = storage_classes(args, actor)
    runner = Runner(actor.engine, args.workers, args.timeout, args.lock_duration, args.dry_run)
    outcomes = runner.run(names, direction)
    twin_results = twins(args, actor, direction, classes)
    write(outcomes, twin_results, args.output, out)
    blocked = [x for x in outcomes if x.result not in OK_RESULTS]
    blocked_twins = [t for t in twin_results if t.result not in OK_RESULTS]
    return 1 if blocked or blocked_twins else 0
