"""The engine: one call moves one PV towards CSI (convert) or back (rollback), under its lock.

`Engine.run(pv, direction)` takes the PV's lock, finishes any journal the lock carries (whatever its
direction), or else assesses the PV and, when it may move, records a journal and runs the steps
(steps.py). It returns an Outcome instead of raising: bad input, a busy lock or a PV in use is a result
the callers count, report and retry, never a crash. `direction=None` only finishes journals.

Results: done; noop (nothing to do); pending (waits for the claim to rebind: the lock is kept, call
again); waiting (in use: Events on the PV and its claim, try later); busy (another actor holds the
lock); skipped (bad input: Event + metric; not retried until the object changes); refused (the cluster
differs from the record or journal: Event, left for a person); failed (API error, including one taking
the lock: retry later); planned (dry run: what would be created). Waiting and skipped outcomes carry a
`reason` (WAIT_REASONS for waiting; the skip metric's label for skipped).

A PV whose CSI driver is not installed (no CSIDriver object: what `plan` reports as a blocker, by the
same function) is skipped ("driver-missing") before anything is written.

A PV whose CSI form or journal would not fit Kubernetes' 256 KiB limit on an object's annotations is
skipped ("too-large"): the CSI PV carries the PV's annotations plus its record, and the journal in the
lock Lease carries the record and the new PV, so either write would fail on every attempt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from shim import TranslationError, Translator, failpoints
from shim.migrate import objects as o
from shim.migrate.events import NORMAL, WARNING, Ref
from shim.migrate.journal import CONVERT, MIGRATION_FAILPOINTS, ROLLBACK, Journal, JournalError
from shim.migrate.kube import ApiError
from shim.migrate.lock import Busy, LockLost, PVLock, PVLocks
from shim.migrate.steps import (
    STEP_FUNCTIONS,
    Changed,
    Context,
    InUse,
    Pending,
    Refused,
    get_pv,
    patch_fresh,
    refusal,
)
from shim.migrate.usage import current_claim
from shim.plan import missing_driver

log = logging.getLogger(__name__)

DONE, NOOP, PENDING, WAITING, BUSY = "done", "noop", "pending", "waiting", "busy"
SKIPPED, REFUSED, FAILED, PLANNED = "skipped", "refused", "failed", "planned"
RETRY_LATER = frozenset({PENDING, WAITING, BUSY, FAILED})
ELIGIBLE_PHASES = frozenset({"Bound", "Available", "Released"})
# Why a PV waits (Outcome.reason of waiting outcomes; the label of ballast_migrate_volumes_waiting):
# used by a pod or attachment; a phase that cannot move (Pending, Failed); pre-bound to an existing
# claim, waiting for the PV binder; changed under a conversion that had not deleted it yet (it starts
# over from a fresh record).
IN_USE, PHASE, PRE_BOUND, CHANGED = "in-use", "phase", "pre-bound", "changed"
WAIT_REASONS = (IN_USE, PHASE, PRE_BOUND, CHANGED)
ANNOTATIONS_LIMIT = 256 * 1024  # Kubernetes' limit on an object's annotations: keys plus values, in bytes
JOURNAL_HEADROOM = 4 * 1024  # the Lease's other annotations, and what the journal records as it runs


class Outcome(NamedTuple):
    pv: str
    direction: str
    result: str
    message: str
    target: o.JsonObj | None = None
    reason: str = ""
    lasting: bool = False  # FAILED on a refusal a retry meets again (ApiError.lasting)


def annotations_size(annotations: Mapping[str, str]) -> int:
    """Bytes Kubernetes counts against ANNOTATIONS_LIMIT: every key and value, UTF-8 encoded."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


def _pv_ref(pv: o.JsonObj) -> Ref:
    return Ref.of(pv, "v1", "PersistentVolume")


class Engine:
    """Runs conversions and rollbacks for one actor (identity + version)."""

    def __init__(self, ctx: Context, locks: PVLocks, translator: Translator, identity: str) -> None:
        self.ctx = ctx
        self._locks = locks
        self._translator = translator
        self._identity = identity
        self._held: dict[str, PVLock] = {}  # locks kept across calls while a journal is pending
        self._held_lock = threading.Lock()

    # ---------------------------------------------------------------- assessment

    def _skip(self, pv: o.JsonObj, direction: str, reason: str, message: str) -> Outcome:
        self.ctx.metrics.skips.labels(reason).inc()
        self.ctx.events.emit(_pv_ref(pv), WARNING, "MigrationSkipped", f"{direction} skipped: {message}")
        return Outcome(o.name_of(pv), direction, SKIPPED, f"{reason}: {message}", reason=reason)

    def _blocked(self, pv: o.JsonObj, direction: str) -> Outcome | None:
        """Why `pv` cannot move now (phase, deletion, vanished claim, users), or None."""
        name, phase = o.name_of(pv), o.phase(pv)
        if o.is_deleting(pv):
            return Outcome(name, direction, NOOP, "the PV is being deleted")
        if phase == "Released" and o.reclaim_policy(pv) == o.DELETE:
            return Outcome(name, direction, NOOP, "Released with policy Delete: its disk is being reclaimed")
        claim = o.claim_ref(pv)
        if phase == "Available" and claim is not None and not claim.uid and self._claim_exists(claim):
            message = f"pre-bound to claim {claim}; waiting for the PV binder"
            return Outcome(name, direction, WAITING, message, reason=PRE_BOUND)
        if phase not in ELIGIBLE_PHASES:
            message = f"phase {phase or 'unknown'}; waiting for Bound, Available or Released"
            return Outcome(name, direction, WAITING, message, reason=PHASE)
        if phase == "Bound" and claim is not None:
            found = self.ctx.claims.get(claim.namespace, claim.name)
            if found is None or o.uid_of(found) != claim.uid:
                return self._skip(pv, direction, "claim-vanished", f"its claim {claim} no longer exists")
        users = self.ctx.usage.users(pv)
        if not users:
            return None
        message = f"waiting to {direction}: in use by {', '.join(users)}"
        self.ctx.events.emit(_pv_ref(pv), NORMAL, "MigrationWaiting", message)
        claim = current_claim(pv, self.ctx.claims)  # not a newer claim that only shares the name
        if claim is not None:
            claim_ref = Ref("v1", "PersistentVolumeClaim", claim.name, claim.namespace, claim.uid)
            self.ctx.events.emit(claim_ref, NORMAL, "MigrationWaiting", f"PV {name}: {message}")
        return Outcome(name, direction, WAITING, message, reason=IN_USE)

    def _claim_exists(self, claim: o.ClaimRef) -> bool:
        """Whether a claim of that name exists. A PV "reserved" for a claim that does not (claimRef without
        uid) stays Available until one appears, maybe never: it moves like any Available PV, keeping its
        claimRef. The delete step's last read and its DELETE preconditions (uid, resourceVersion) stop
        the conversion if a claim appears and the binder binds the PV before the DELETE; after it, the
        binder skips the deleting PV and binds the claim to the new one."""
        return bool(claim.namespace) and self.ctx.claims.get(claim.namespace, claim.name) is not None

    def _journal(
        self, pv: o.JsonObj, direction: str, plugin: str, journal_id: str, target: o.JsonObj
    ) -> Journal | Outcome:
        journal = Journal(
            id=journal_id,
            direction=direction,
            pv=o.name_of(pv),
            plugin=plugin,
            source_uid=o.uid_of(pv),
            policy=o.reclaim_policy(pv),
            was_bound=o.phase(pv) == "Bound",
            claim=o.claim_ref(pv) if o.phase(pv) == "Bound" else None,
            source=o.record_of(pv),
            target=target,
            started_by=self._identity,
            started_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        return self._fits(pv, journal)

    def _fits(self, pv: o.JsonObj, journal: Journal) -> Journal | Outcome:
        """The journal, or a skip: "too-large" when the new PV or the journal's Lease would exceed
        ANNOTATIONS_LIMIT (the API server would refuse every attempt with 422 Too long); "bad-record"
        (rollback) or "translation-failed" (convert) when a server-side dry run of the new PV's create
        is refused, found before the old PV is touched rather than after it is deleted."""
        direction, limit = journal.direction, ANNOTATIONS_LIMIT
        target = annotations_size(o.annotations_of(journal.target))
        if target > limit:
            kept = "its annotations" + (" and the record of the original" if direction == CONVERT else "")
            message = (
                f"the new PV would carry {target} bytes of annotations ({kept}); "
                f"Kubernetes allows {limit}: remove large annotations from the PV"
            )
            return self._skip(pv, direction, "too-large", message)
        journal_size = len(journal.to_json().encode()) + JOURNAL_HEADROOM
        if journal_size > limit:
            message = (
                f"its journal (the record of the PV and the PV to create) would take {journal_size} bytes "
                f"of its lock Lease's annotations; Kubernetes allows {limit}: remove large annotations "
                "from the PV"
            )
            return self._skip(pv, direction, "too-large", message)
        refused = refusal(self.ctx, journal.target)
        if refused is not None:
            reason = "bad-record" if direction == ROLLBACK else "translation-failed"
            return self._skip(
                pv, direction, reason, f"the API server would refuse the PV to create: {refused}"
            )
        return journal

    def assess_convert(self, pv: o.JsonObj, journal_id: str) -> Journal | Outcome:
        name, plugin = o.name_of(pv), o.in_tree_plugin(pv)
        if plugin is None:
            done = o.ANN_ORIGINAL in o.annotations_of(pv)
            return Outcome(
                name, CONVERT, NOOP, "already converted" if done else "no in-tree source to convert"
            )
        blocked = self._blocked(pv, CONVERT)
        if blocked is not None:
            return blocked
        record = o.record_of(pv)
        try:
            target = o.convert_target(self._translator, record, journal_id, self._identity)
        except TranslationError as exc:
            return self._skip(pv, CONVERT, "translation-failed", f"translation fails: {exc}")
        missing = missing_driver(o.csi_driver(target) or "", self.ctx.drivers)  # what `plan` says too
        if missing is not None:
            return self._skip(pv, CONVERT, "driver-missing", missing)
        return self._journal(pv, CONVERT, plugin, journal_id, target)

    def assess_rollback(self, pv: o.JsonObj, journal_id: str) -> Journal | Outcome:
        name = o.name_of(pv)
        if o.in_tree_plugin(pv) is not None:
            return Outcome(name, ROLLBACK, NOOP, "already in-tree")
        try:
            record = o.recorded_original(pv)
        except o.UnknownPluginError as exc:
            return self._skip(pv, ROLLBACK, "unknown-plugin", str(exc))
        except o.RecordError as exc:
            return self._skip(pv, ROLLBACK, "bad-record", str(exc))
        if record is None:
            return Outcome(name, ROLLBACK, NOOP, "a CSI PV without a record was never converted; not touched")
        difference = o.disk_difference(self._translator, pv, record)
        if difference is not None:
            self.ctx.events.emit(_pv_ref(pv), WARNING, "RollbackRefused", difference)
            return Outcome(name, ROLLBACK, REFUSED, difference)
        blocked = self._blocked(pv, ROLLBACK)
        if blocked is not None:
            return blocked
        plugin = o.in_tree_plugin(record) or ""
        return self._journal(pv, ROLLBACK, plugin, journal_id, o.rollback_target(record, pv, journal_id))

    def assess(self, pv: o.JsonObj, direction: str) -> Journal | Outcome:
        journal_id = str(uuid.uuid4())
        if direction == CONVERT:
            return self.assess_convert(pv, journal_id)
        return self.assess_rollback(pv, journal_id)

    def plan(self, name: str, direction: str) -> Outcome:
        """Dry run: what `run` would do, without taking a lock or changing anything."""
        try:
            pv = get_pv(self.ctx, name)
            if pv is None:
                return Outcome(name, direction, NOOP, "the PV does not exist")
            planned = self.assess(pv, direction)
        except ApiError as exc:
            return Outcome(name, direction, FAILED, f"API error: {exc}", lasting=exc.lasting)
        if isinstance(planned, Outcome):
            return planned
        return Outcome(name, direction, PLANNED, f"would {direction}", planned.target)

    # ---------------------------------------------------------------- running

    def run(self, name: str, direction: str | None) -> Outcome:
        """Move PV `name` towards `direction` (None: only finish a journal); see the module docstring."""
        try:
            lock = self._locks.acquire(name, create=direction is not None)
        except Busy as exc:
            return self._count(Outcome(name, direction or "", BUSY, str(exc)))
        except JournalError as exc:
            self.ctx.metrics.skips.labels("bad-journal").inc()
            ref = Ref("v1", "PersistentVolume", name)
            self.ctx.events.emit(ref, WARNING, "MigrationStuck", f"its journal cannot be used: {exc}")
            return self._count(Outcome(name, direction or "", REFUSED, str(exc)))
        except ApiError as exc:  # e.g. no such namespace, or RBAC: nothing was changed
            failed = Outcome(name, direction or "", FAILED, f"taking its lock: API error: {exc}")
            return self._count(failed._replace(lasting=exc.lasting))
        if lock is None:
            return Outcome(name, "", NOOP, "no journal to finish")
        return self._count(self._under_lock(lock, name, direction))

    def _count(self, outcome: Outcome) -> Outcome:
        if outcome.direction and outcome.result != NOOP:
            self.ctx.metrics.operations.labels(outcome.direction, outcome.result).inc()
        log.log(
            logging.DEBUG if outcome.result in (NOOP, PENDING, BUSY) else logging.INFO,
            "PV %s: %s %s: %s",
            outcome.pv,
            outcome.direction or "resume",
            outcome.result,
            outcome.message,
        )
        return outcome

    def _under_lock(self, lock: PVLock, name: str, direction: str | None) -> Outcome:
        outcome: Outcome
        try:
            if lock.journal is None:
                started = self._start(lock, name, direction)
                if isinstance(started, Outcome):
                    outcome = started
                    self._release(lock)
                    return outcome
            outcome = self._drive(lock)
        except LockLost as exc:
            return Outcome(name, direction or "", BUSY, str(exc))
        except ApiError as exc:
            outcome = Outcome(name, direction or "", FAILED, f"API error: {exc}", lasting=exc.lasting)
        except Exception:  # a bug: give the lock up (a journal stays, holderless) so others need not wait
            with self._held_lock:
                self._held.pop(name, None)
            self._release(lock)
            raise
        with self._held_lock:
            if outcome.result == PENDING:
                self._held[name] = lock
            else:
                self._held.pop(name, None)
        if outcome.result != PENDING:
            self._release(lock)
        return outcome

    def release_held(self) -> None:
        """On shutdown: give up the locks of pending journals (kept, holderless) for others to finish."""
        with self._held_lock:
            held, self._held = self._held, {}
        for lock in held.values():
            self._release(lock)

    def _release(self, lock: PVLock) -> None:
        try:
            lock.release()
        except (ApiError, LockLost) as exc:
            log.warning("PV %s: releasing its lock failed: %s", lock.pv, exc)

    def _start(self, lock: PVLock, name: str, direction: str | None) -> Journal | Outcome:
        pv = get_pv(self.ctx, name)
        if pv is None or direction is None:
            return Outcome(name, direction or "", NOOP, "nothing to do")
        planned = self.assess(pv, direction)
        if isinstance(planned, Outcome):
            return planned
        lock.save(planned)
        failpoints.hit(MIGRATION_FAILPOINTS[direction, "record"])
        return planned

    def _drive(self, lock: PVLock) -> Outcome:
        journal = lock.journal
        assert journal is not None
        name, direction = journal.pv, journal.direction
        try:
            while journal.step != "done":
                step = journal.step
                STEP_FUNCTIONS[step](self.ctx, journal, journal.source)
                failpoints.hit(MIGRATION_FAILPOINTS[direction, step])
                journal.advance()
                if journal.step != "done":
                    lock.save(journal)
        except Pending as exc:
            lock.save(journal)
            return Outcome(name, direction, PENDING, str(exc))
        except InUse as exc:
            return self._abort(lock, journal, f"in use by {exc}; nothing was changed", IN_USE)
        except Changed as exc:
            return self._abort(lock, journal, str(exc), CHANGED)
        except Refused as exc:
            return self._stuck(journal, exc)
        return self._finish(journal)

    def _stuck(self, journal: Journal, exc: Refused) -> Outcome:
        name, direction = journal.pv, journal.direction
        ref = Ref("v1", "PersistentVolume", name)
        self.ctx.events.emit(
            ref, WARNING, "MigrationStuck", f"{direction} stopped at step {journal.step}: {exc}"
        )
        return Outcome(name, direction, REFUSED, f"stopped at step {journal.step}: {exc}")

    def _finish(self, journal: Journal) -> Outcome:
        started = datetime.fromisoformat(journal.started_at)
        self.ctx.metrics.seconds.labels(journal.direction).observe(
            (datetime.now(UTC) - started).total_seconds()
        )
        verb = "converted to CSI" if journal.direction == CONVERT else "rolled back to its in-tree original"
        driver = o.csi_driver(journal.target) or journal.plugin
        message = f"{verb} ({driver}) by {self._identity}"
        self.ctx.events.emit(
            Ref("v1", "PersistentVolume", journal.pv, uid=journal.created_uid),
            NORMAL,
            "Converted" if journal.direction == CONVERT else "RolledBack",
            message,
        )
        return Outcome(journal.pv, journal.direction, DONE, message)

    def _abort(self, lock: PVLock, journal: Journal, why: str, reason: str) -> Outcome:
        """Stopped before the old PV was deleted: put its policy back (when it is still there) and drop
        the journal, so the next attempt starts from a fresh record."""

        def put_back(pv: o.JsonObj) -> o.JsonObj | None:
            if o.reclaim_policy(pv) == journal.policy:
                return None
            return {"spec": {"persistentVolumeReclaimPolicy": journal.policy}}

        with contextlib.suppress(Changed):  # the old PV is gone or replaced: no policy of ours to put back
            patch_fresh(self.ctx, journal.pv, journal.source_uid, put_back, gone=Changed)
        lock.save(None)
        return Outcome(journal.pv, journal.direction, WAITING, why, reason=reason)
