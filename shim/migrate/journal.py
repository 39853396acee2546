"""The journal of one PV's conversion or rollback: enough to finish it after a kill, by anyone.

A journal is written (in the PV's lock Lease, see lock.py) before the first change to the cluster,
and advanced after each step. `step` is always the next step to run; every step is idempotent, so
an actor that finds a journal runs its `step` again and carries on. Steps, in order:

    retain   set the old PV's reclaim policy to Retain (so nothing can delete the disk)
    delete   DELETE the old PV (pv-protection and other finalizers still hold it)
    release  once nothing uses it, remove its pv-protection finalizer; wait until it is gone
    create   create the new PV (`target`, policy Retain)
    bound    a PV that was Bound: wait until its claim is Bound to the new PV again
    restore  restore the recorded reclaim policy; drop the journal-id annotation
    done     (nothing left: the lock is released)

The journal carries a format number. An actor refuses a journal of a newer format than it knows, so
an older controller never resumes what a newer one started.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from shim.migrate.objects import ClaimRef, JsonObj

FORMAT = 1
CONVERT = "convert"
ROLLBACK = "rollback"
DIRECTIONS = (CONVERT, ROLLBACK)
STEPS = ("retain", "delete", "release", "create", "bound", "restore", "done")

# Crash points (shim/failpoints.py), hit right after each step's work and before the journal records it:
# (direction, step) -> name. Spelled out so docs/recovery.md can be checked against the source.
MIGRATION_FAILPOINTS: dict[tuple[str, str], str] = {
    (CONVERT, "record"): "migrate.convert.record",
    (CONVERT, "retain"): "migrate.convert.retain",
    (CONVERT, "delete"): "migrate.convert.delete",
    (CONVERT, "release"): "migrate.convert.release",
    (CONVERT, "create"): "migrate.convert.create",
    (CONVERT, "bound"): "migrate.convert.bound",
    (CONVERT, "restore"): "migrate.convert.restore",
    (ROLLBACK, "record"): "migrate.rollback.record",
    (ROLLBACK, "retain"): "migrate.rollback.retain",
    (ROLLBACK, "delete"): "migrate.rollback.delete",
    (ROLLBACK, "release"): "migrate.rollback.release",
    (ROLLBACK, "create"): "migrate.rollback.create",
    (ROLLBACK, "bound"): "migrate.rollback.bound",
    (ROLLBACK, "restore"): "migrate.rollback.restore",
}


class JournalError(ValueError):
    """A journal that cannot be read, or one of a newer format than this version knows."""


@dataclass
class Journal:
    """One PV's conversion (or rollback) in progress; see the module docstring for the steps."""

    id: str
    direction: str
    pv: str
    plugin: str
    source_uid: str  # uid of the PV being replaced
    policy: str  # reclaim policy to restore at the end
    was_bound: bool
    claim: ClaimRef | None
    source: JsonObj  # record of the PV being replaced (objects.record_of), checked before it is touched
    target: JsonObj  # the PV the create step creates
    started_by: str
    started_at: str
    step: str = STEPS[0]
    created_uid: str = ""
    created_at: str = ""
    claim_vanished: bool = False
    notes: list[str] = field(default_factory=list)
    format: int = FORMAT

    def advance(self) -> None:
        """Move `step` to the next step (the bound step is skipped for a PV that was not Bound)."""
        index = STEPS.index(self.step) + 1
        if STEPS[index] == "bound" and not self.was_bound:
            index += 1
        self.step = STEPS[index]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Journal:
        """Parse a journal; raises JournalError naming the problem."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise JournalError(f"journal is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise JournalError("journal is not a JSON object")
        version = raw.get("format")
        if not isinstance(version, int) or version > FORMAT:
            raise JournalError(
                f"journal format {version!r} is newer than this version understands ({FORMAT}); "
                "let the actor that wrote it (a newer ballast-migrate) finish it"
            )
        return cls._checked(raw)

    @classmethod
    def _checked(cls, raw: dict[str, Any]) -> Journal:
        claim = raw.get("claim")
        try:
            journal = cls(**{**raw, "claim": ClaimRef(*claim) if claim else None})
        except TypeError as exc:
            raise JournalError(f"journal fields do not match: {exc}") from None
        if journal.direction not in DIRECTIONS or journal.step not in STEPS:
            raise JournalError(f"journal has direction {journal.direction!r} and step {journal.step!r}")
        if not isinstance(journal.target, dict) or not isinstance(journal.source, dict) or not journal.pv:
            raise JournalError("journal has no target PV")
        return journal
