"""The migration lock: one coordination.k8s.io/v1 Lease per PV, holding that PV's journal.

Every conversion or rollback of a PV runs under its Lease `ballast-migrate-pv-<pv name>` in the
controller's namespace. The Lease says who holds it (spec.holderIdentity), with which version
(annotation migration.ballast.io/version), until when (renewTime + leaseDurationSeconds), and carries
the journal (annotation migration.ballast.io/journal). Each journal write is a conditional update
(resourceVersion), so it also proves the writer still holds the lock: a writer that lost the Lease
gets 409 and stops (LockLost) before its next step.

A Lease held by someone else counts as expired only after this process has seen it unchanged for a
whole lease duration (as Kubernetes' leader election does), so clocks of different machines never
matter. A Lease held by this identity is this process's own (a restarted container keeps its pod
name) and is taken back at once. The Lease is deleted when the journal is done; a paused journal
(waiting for something outside) keeps the Lease with no holder, so any actor can resume it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from shim.migrate.journal import Journal, JournalError
from shim.migrate.kube import LEASES, ApiError, KubeClient
from shim.migrate.objects import MANAGED_BY, MANAGER, PREFIX, JsonObj, annotations_of

LEASE_PREFIX = "ballast-migrate-pv-"
ANN_PV = PREFIX + "pv"
ANN_VERSION = PREFIX + "version"
ANN_JOURNAL = PREFIX + "journal"
ROLE = PREFIX + "role"
LOCK_SELECTOR = f"{ROLE}=pv-lock"
MAX_NAME = 253


class Holder(NamedTuple):
    """Who takes locks: identity (carries the version by default), version, lease duration."""

    identity: str
    version: str
    duration_seconds: int


class Busy(Exception):
    """Another live actor holds the PV's lock; the message names it and its version."""


class LockLost(Exception):
    """This actor's lock was taken over (it stalled past its lease); it must stop at once."""


def lease_name(pv: str) -> str:
    """`ballast-migrate-pv-<pv>`; names past 253 characters end in a hash of the PV name instead."""
    name = LEASE_PREFIX + pv
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(pv.encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME - 17].rstrip('.-')}-{digest}"


def micro_time(now: datetime | None = None) -> str:
    """A Kubernetes MicroTime."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_of(lease: JsonObj) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def journal_of(lease: JsonObj) -> Journal | None:
    """The journal a lock Lease carries, None when it carries none; JournalError when unreadable."""
    text = annotations_of(lease).get(ANN_JOURNAL)
    return None if not text else Journal.from_json(text)


class Observations:
    """When this process first saw each Lease at its current resourceVersion (monotonic clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def unchanged_for(self, lease: JsonObj) -> float:
        metadata = lease["metadata"]
        key, version = metadata["name"], metadata.get("resourceVersion", "")
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != version:
                self._seen[key] = (version, now)
                return 0.0
            return now - seen[1]


class PVLock:
    """A held lock; `journal` is what the Lease carried (None for a fresh lock)."""

    def __init__(self, locks: PVLocks, pv: str, lease: JsonObj, journal: Journal | None) -> None:
        self._locks = locks
        self.pv = pv
        self.lease = lease
        self.journal = journal

    def save(self, journal: Journal | None) -> None:
        """Write `journal` and renew; raises LockLost when another actor took the Lease."""
        self.lease = self._locks.write(self.lease, journal, holder=True)
        self.journal = journal

    def renew(self) -> None:
        self.save(self.journal)

    def release(self) -> None:
        """Give the lock up: delete the Lease, or keep it holderless when a journal is unfinished."""
        if self.journal is not None and self.journal.step != "done":
            self.lease = self._locks.write(self.lease, self.journal, holder=False)
            return
        self._locks.delete(self.lease)


class PVLocks:
    """Takes per-PV locks for one holder in one namespace."""

    def __init__(
        self, client: KubeClient, namespace: str, holder: Holder, observations: Observations | None = None
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.holder = holder
        self._observations = observations or Observations()

    def acquire(self, pv: str, create: bool = True) -> PVLock | None:
        """The PV's lock; raises Busy when another live actor holds it, JournalError (lock not
        taken) when its journal is unreadable or of a newer format. With `create=False` only an
        existing Lease is taken (None when there is none): finishing journals creates no lock."""
        name = lease_name(pv)
        lease = self._client.get_or_none(LEASES, name, self.namespace)
        if lease is None:
            return PVLock(self, pv, self._create(name, pv), None) if create else None
        journal = journal_of(lease)  # before taking it: never take what cannot be finished
        self._check_free(lease)
        try:
            taken = self.write(lease, journal, holder=True)
        except LockLost:
            raise Busy(f"another actor took the lock of PV {pv} first") from None
        return PVLock(self, pv, taken, journal)

    def _check_free(self, lease: JsonObj) -> None:
        holder = holder_of(lease)
        if not holder or holder == self.holder.identity:
            return
        duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or self.holder.duration_seconds)
        waited = self._observations.unchanged_for(lease)
        if waited < duration:
            version = annotations_of(lease).get(ANN_VERSION, "unknown")
            raise Busy(f"held by {holder} (version {version}); free in at most {duration - waited:.0f}s")

    def _create(self, name: str, pv: str) -> JsonObj:
        now = micro_time()
        body: JsonObj = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {MANAGED_BY: MANAGER, ROLE: "pv-lock"},
                "annotations": {ANN_PV: pv, ANN_VERSION: self.holder.version},
            },
            "spec": {
                "holderIdentity": self.holder.identity,
                "leaseDurationSeconds": self.holder.duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            return self._client.create(LEASES, body, self.namespace)
        except ApiError as exc:
            if exc.already_exists:
                raise Busy(f"another actor took the lock of PV {pv} first") from None
            raise

    def write(self, lease: JsonObj, journal: Journal | None, holder: bool) -> JsonObj:
        """Conditional update of `lease` (holder set or cleared, journal, renewTime)."""
        body = {**lease, "metadata": dict(lease["metadata"]), "spec": dict(lease.get("spec") or {})}
        notes = annotations_of(lease)
        notes.pop(ANN_JOURNAL, None)
        if journal is not None:
            notes[ANN_JOURNAL] = journal.to_json()
        notes[ANN_VERSION] = self.holder.version
        body["metadata"]["annotations"] = notes
        spec, now = body["spec"], micro_time()
        if holder and spec.get("holderIdentity") != self.holder.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = now
        spec["holderIdentity"] = self.holder.identity if holder else None
        spec["leaseDurationSeconds"] = self.holder.duration_seconds
        spec["renewTime"] = now
        try:
            return self._client.update(LEASES, body)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                raise LockLost(
                    f"lost the lock of PV {annotations_of(lease).get(ANN_PV, '?')}: {exc}"
                ) from None
            raise

    def delete(self, lease: JsonObj) -> None:
        metadata = lease["metadata"]
        try:
            self._client.delete(
                LEASES, metadata["name"], self.namespace, {"resourceVersion": metadata["resourceVersion"]}
            )
        except ApiError as exc:
            if exc.conflict:
                raise LockLost(f"lock {metadata['name']} changed before it was released") from None
            if not exc.not_found:
                raise

    def list_leases(self) -> list[JsonObj]:
        """Every lock Lease in the namespace (held, paused or stale)."""
        items, _ = self._client.list_all(LEASES, self.namespace, labelSelector=LOCK_SELECTOR)
        return items


def has_journal(lease: JsonObj) -> bool:
    """Whether a lock Lease carries a journal (an unreadable one counts: the engine reports it)."""
    try:
        return journal_of(lease) is not None
    except JournalError:
        return True


def pv_of(lease: JsonObj) -> str:
    """The PV a lock Lease belongs to."""
    return annotations_of(lease).get(ANN_PV, "")


__all__ = ["Busy", "Holder", "JournalError", "LockLost", "Observations", "PVLock", "PVLocks", "lease_name"]
