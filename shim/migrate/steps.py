"""The steps of a journaled conversion or rollback (journal.py lists them). Each step is idempotent:
run again after a kill anywhere inside or after it, it finds its work done and returns.

No step can delete a disk: the old PV is set to Retain before it is deleted, its pv-protection
finalizer is only released once it carries Retain, and the new PV is created with Retain. The recorded
policy comes back in the last step, and a Delete policy does not come back when the claim vanished
meanwhile (the PV would be Released, and Delete would remove the disk the user still has to decide
about).

No step interrupts a workload. Whether the PV is used is read from the API server (never a cache)
right before the DELETE, again when `delete` resumes on a PV already deleting, and right before its
pv-protection finalizer is removed: a PV deleted but still Bound is served to new pods and attachments
until that finalizer goes, so while anything uses it the step stays pending and the PV stays.

Steps raise Pending (wait for the cluster, try again later), InUse or Changed (before the old PV was
deleted, it became used, or it changed or went: nothing destructive happened, so the engine puts the
reclaim policy back and drops the journal) or Refused (after the old PV was deleted, the cluster is not
as the journal expects; a person must look; the journal is kept).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from datetime import UTC, datetime
from typing import NamedTuple

from shim.migrate.events import NORMAL, WARNING, EventRecorder, Ref
from shim.migrate.journal import Journal
from shim.migrate.kube import CSI_DRIVERS, PVS, ApiError, KubeClient
from shim.migrate.metrics import Metrics
from shim.migrate.objects import (
    ANN_JOURNAL_ID,
    DELETE,
    RETAIN,
    JsonObj,
    annotations_of,
    is_deleting,
    reclaim_policy,
    record_of,
    uid_of,
)
from shim.migrate.usage import Claims, Usage, live_usage

CONFLICT_ATTEMPTS = 8
GONE_TIMEOUT = 30.0
PV_PROTECTION = "kubernetes.io/pv-protection"


class Pending(Exception):
    """The step waits for something outside (the claim rebinding); run it again later."""


class InUse(Exception):
    """The volume became used before its old PV was deleted."""


class Changed(Exception):
    """The old PV changed, was replaced or went before it was deleted; start over from a fresh record."""


class Refused(Exception):
    """The cluster is not as the journal expects; nothing more is done until a person looks."""


class LiveDrivers:
    """The installed CSI drivers: `name in drivers` reads the CSIDriver `name` from the API server."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._client.get_or_none(CSI_DRIVERS, name) is not None


class Context(NamedTuple):
    client: KubeClient
    claims: Claims
    usage: Usage
    events: EventRecorder
    metrics: Metrics
    bound_timeout: float
    drivers: Container[str]  # names of the installed CSI drivers


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_pv(ctx: Context, name: str) -> JsonObj | None:
    return ctx.client.get_or_none(PVS, name)


def same_content(a: JsonObj, b: JsonObj) -> bool:
    """Equal records, reclaim policy aside (the retain step may already have changed it)."""

    def key(record: JsonObj) -> JsonObj:
        spec = dict(record["spec"])
        spec.pop("persistentVolumeReclaimPolicy", None)
        return {**record, "spec": spec}

    return key(a) == key(b)


def patch_fresh(
    ctx: Context,
    name: str,
    uid: str,
    change: Callable[[JsonObj], JsonObj | None],
    gone: type[Exception] | None = Refused,
) -> None:
    """Apply `change(pv)` (None: nothing to do) as a patch conditional on uid and resourceVersion;
    a 409 conflict re-reads the PV and tries again. A missing or replaced PV raises `gone` (None:
    returns, the PV's going being the point)."""
    for _ in range(CONFLICT_ATTEMPTS):
        pv = get_pv(ctx, name)
        if pv is None or uid_of(pv) != uid:
            if gone is None:
                return
            raise gone(f"PV {name} (uid {uid}) vanished or was replaced while the step ran")
        patch = change(pv)
        if patch is None:
            return
        metadata = {
            **patch.get("metadata", {}),
            "uid": uid,
            "resourceVersion": pv["metadata"]["resourceVersion"],
        }
        try:
            ctx.client.patch(PVS, name, {**patch, "metadata": metadata})
            return
        except ApiError as exc:
            if exc.not_found:
                continue  # gone between the read and the patch: the next read says what that means
            if not exc.conflict:
                raise
            ctx.metrics.conflicts.inc()
    raise Pending(f"PV {name} kept changing under {CONFLICT_ATTEMPTS} conditional updates; trying later")


def _source(ctx: Context, j: Journal, source: JsonObj) -> JsonObj:
    """The PV being replaced, checked to be the one the journal recorded."""
    pv = get_pv(ctx, j.pv)
    if pv is None:
        raise Changed(f"PV {j.pv} was deleted by someone else before the {j.direction} replaced it")
    if uid_of(pv) != j.source_uid:
        raise Changed(f"PV {j.pv} was replaced by another actor (uid {uid_of(pv)}, recorded {j.source_uid})")
    if not same_content(record_of(pv), source):
        raise Changed(f"PV {j.pv} changed after its record was taken (bound meanwhile?); starting over")
    return pv


def _claim_ref(j: Journal) -> Ref:
    claim = j.claim
    assert claim is not None  # only journals of Bound PVs have a claim
    return Ref("v1", "PersistentVolumeClaim", claim.name, claim.namespace, claim.uid)


def _set_policy(policy: str) -> Callable[[JsonObj], JsonObj | None]:
    def change(pv: JsonObj) -> JsonObj | None:
        return None if reclaim_policy(pv) == policy else {"spec": {"persistentVolumeReclaimPolicy": policy}}

    return change


def retain(ctx: Context, j: Journal, source: JsonObj) -> None:
    _source(ctx, j, source)
    patch_fresh(ctx, j.pv, j.source_uid, _set_policy(RETAIN), gone=Changed)


def users_now(ctx: Context, pv: JsonObj) -> list[str]:
    """Who uses `pv`, read from the API server: a cache may lag, or be frozen while it relists."""
    return live_usage(ctx.client).users(pv)


def wait_while_used(ctx: Context, j: Journal, pv: JsonObj) -> None:
    """Raise Pending (with MigrationWaiting Events) while the deleted, still served old PV is used."""
    users = users_now(ctx, pv)
    if not users:
        return
    message = (
        f"PV {j.pv} is deleted for the {j.direction} but in use by {', '.join(users)}; "
        "pv-protection keeps it until they are gone"
    )
    pv_ref = Ref("v1", "PersistentVolume", j.pv, uid=j.source_uid)
    ctx.events.emit(pv_ref, NORMAL, "MigrationWaiting", message)
    if j.claim is not None:
        ctx.events.emit(_claim_ref(j), NORMAL, "MigrationWaiting", message)
    raise Pending(message)


def delete(ctx: Context, j: Journal, source: JsonObj) -> None:
    """DELETE the old PV (Retain checked again, usage checked last and live, uid and resourceVersion of
    that last read as preconditions: Changed when it changed since). One
    already deleting (a resumed step) is checked for use again: Pending while anything uses it."""
    pv = get_pv(ctx, j.pv)
    if pv is None:
        return
    if uid_of(pv) == j.source_uid and is_deleting(pv):
        wait_while_used(ctx, j, pv)
        return
    pv = _source(ctx, j, source)
    if reclaim_policy(pv) != RETAIN:
        patch_fresh(ctx, j.pv, j.source_uid, _set_policy(RETAIN), gone=Changed)
        pv = _source(ctx, j, source)
    users = users_now(ctx, pv)
    if users:
        raise InUse(", ".join(users))
    # Only the PV as checked: a write since (the binder binding it to a claim that just appeared) makes
    # the API server refuse the DELETE. A binder that read it before loses its own update the same way.
    version = pv["metadata"].get("resourceVersion")
    try:
        ctx.client.delete(PVS, j.pv, preconditions={"uid": j.source_uid, "resourceVersion": version})
    except ApiError as exc:
        if exc.conflict:
            raise Changed(f"PV {j.pv} changed while it was checked for use; starting over") from None
        if not exc.not_found:
            raise


def release(ctx: Context, j: Journal, source: JsonObj) -> None:
    """Remove the deleted PV's pv-protection finalizer (only while it carries Retain and nothing uses
    it: Pending otherwise) and wait until it is gone. Other finalizers are their owners' to remove."""

    def drop_protection(pv: JsonObj) -> JsonObj | None:
        if reclaim_policy(pv) != RETAIN or not is_deleting(pv):
            raise Refused(f"PV {j.pv} is not a deleting PV with Retain; its finalizers are left alone")
        finalizers = pv["metadata"].get("finalizers") or []
        if PV_PROTECTION not in finalizers:
            return None
        wait_while_used(ctx, j, pv)  # last, right before the patch that lets the PV go
        return {"metadata": {"finalizers": [f for f in finalizers if f != PV_PROTECTION]}}

    pv = get_pv(ctx, j.pv)
    if pv is None:
        return
    if uid_of(pv) != j.source_uid:
        raise Refused(f"PV {j.pv} was replaced by another actor before the journal created it")
    patch_fresh(ctx, j.pv, j.source_uid, drop_protection, gone=None)  # gone meanwhile: that is done
    deadline, left = time.monotonic() + GONE_TIMEOUT, ""
    while time.monotonic() < deadline:
        pv = get_pv(ctx, j.pv)
        if pv is None or uid_of(pv) != j.source_uid:
            return
        time.sleep(0.2)
        left = ", ".join(pv["metadata"].get("finalizers") or []) or "none"
    raise Pending(f"PV {j.pv} is still there after pv-protection was released (finalizers: {left})")


def refusal(ctx: Context, target: JsonObj) -> str | None:
    """Why the API server would refuse to create `target` (400/422 to a server-side dry run), checked
    before anything is changed; None when it would take it or only its name is taken (by the old PV)."""
    try:
        ctx.client.create(PVS, target, dry_run=True)
    except ApiError as exc:
        if exc.status in (400, 422):
            return exc.message
        if not exc.already_exists:
            raise
    return None


def create(ctx: Context, j: Journal, source: JsonObj) -> None:
    """Create the target PV; one this journal created before (same journal id) counts as done. A
    lasting refusal (e.g. 422 Invalid) stops the journal here (Refused): retrying cannot help."""
    try:
        created = ctx.client.create(PVS, j.target)
    except ApiError as exc:
        if exc.lasting and not exc.already_exists:
            raise Refused(f"the API server refuses the PV to create: {exc}") from None
        if not exc.already_exists:
            raise
        found = get_pv(ctx, j.pv)
        if found is None or annotations_of(found).get(ANN_JOURNAL_ID) != j.id:
            raise Refused(f"a PV named {j.pv} was created by another actor; it is left alone") from None
        created = found
    j.created_uid = uid_of(created)
    j.created_at = j.created_at or _now()


def bound(ctx: Context, j: Journal, source: JsonObj) -> None:
    """Done when the claim is Bound to the new PV again; a claim that vanished is noted, not waited for."""
    assert j.claim is not None
    claim = ctx.claims.get(j.claim.namespace, j.claim.name)
    if claim is None or uid_of(claim) != j.claim.uid:
        j.claim_vanished = True
        ctx.metrics.skips.labels("claim-vanished").inc()
        message = f"claim {j.claim} vanished during the {j.direction}; PV {j.pv} is kept with policy Retain"
        ctx.events.emit(
            Ref("v1", "PersistentVolume", j.pv, uid=j.created_uid), WARNING, "ClaimVanished", message
        )
        return
    status = claim.get("status") or {}
    if status.get("phase") == "Bound" and (claim.get("spec") or {}).get("volumeName") == j.pv:
        return
    waited = (datetime.now(UTC) - datetime.fromisoformat(j.created_at)).total_seconds()
    if waited > ctx.bound_timeout:
        message = (
            f"claim not Bound to PV {j.pv} {waited:.0f}s after it was re-created (phase "
            f"{status.get('phase')}); is kube-controller-manager's PV binder running?"
        )
        ctx.events.emit(_claim_ref(j), WARNING, "ClaimNotRebound", message)
    raise Pending(f"claim {j.claim} is {status.get('phase')}, waiting for it to bind to PV {j.pv}")


def restore(ctx: Context, j: Journal, source: JsonObj) -> None:
    """The recorded reclaim policy back (kept Retain if the claim vanished and it was Delete)."""
    policy = RETAIN if j.claim_vanished and j.policy == DELETE else j.policy

    def change(pv: JsonObj) -> JsonObj | None:
        if reclaim_policy(pv) == policy and ANN_JOURNAL_ID not in annotations_of(pv):
            return None
        return {
            "metadata": {"annotations": {ANN_JOURNAL_ID: None}},
            "spec": {"persistentVolumeReclaimPolicy": policy},
        }

    patch_fresh(ctx, j.pv, j.created_uid, change)
    if policy != j.policy:
        message = f"reclaim policy {j.policy} not restored because the claim vanished; set it yourself"
        ctx.events.emit(Ref("v1", "PersistentVolume", j.pv, uid=j.created_uid), NORMAL, "PolicyKept", message)


Step = Callable[[Context, Journal, JsonObj], None]
STEP_FUNCTIONS: dict[str, Step] = {
    "retain": retain,
    "delete": delete,
    "release": release,
    "create": create,
    "bound": bound,
    "restore": restore,
}
