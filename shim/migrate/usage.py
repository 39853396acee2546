"""Whether a PV is in use, which stops its conversion or rollback.

A PV is in use when a VolumeAttachment references it (spec.source.persistentVolumeName), or when a Pod
that has not terminated (phase neither Succeeded nor Failed, deleting or not) uses its claim, directly
(persistentVolumeClaim.claimName) or as a generic ephemeral volume (claim `<pod>-<volume>`).
Pods count only through the claim the PV names as it exists now: when claimRef has a uid, only if the claim
of that name has that uid. Kubernetes' PV binder (pv_controller.go syncVolume) treats a claim of the same
name and another uid as another claim: a StatefulSet claim deleted and created again is bound to another
PV, and its pods use that one, not the Released PV of the old claim. `current_claim` says which claim
that is. `users()` names each user, for the Events and the CLI output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from shim.migrate.kube import PODS, PVCS, VOLUME_ATTACHMENTS, KubeClient
from shim.migrate.objects import ClaimRef, JsonObj, claim_ref, name_of, uid_of

TERMINATED = frozenset({"Succeeded", "Failed"})


def claims_of_pod(pod: JsonObj) -> set[str]:
    """Names of the claims (in the pod's namespace) the pod's volumes use."""
    found: set[str] = set()
    pod_name = name_of(pod)
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, dict) and claim.get("claimName"):
            found.add(str(claim["claimName"]))
        elif volume.get("ephemeral") is not None:
            found.add(f"{pod_name}-{volume.get('name', '')}")
    return found


def is_terminated(pod: JsonObj) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINATED


def attached_to(pv_name: str, attachments: Iterable[JsonObj]) -> list[str]:
    """`VolumeAttachment <name> (node <node>)` for each attachment of the PV."""
    return [
        f"VolumeAttachment {name_of(va)} (node {(va.get('spec') or {}).get('nodeName', '?')})"
        for va in attachments
        if ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName") == pv_name
    ]


def pods_using(claim: str, pods: Iterable[JsonObj]) -> list[str]:
    """`Pod <ns>/<name> (<phase>)` for each non-terminated pod using `claim` (pods of its namespace)."""
    return [
        f"Pod {(p.get('metadata') or {}).get('namespace', '')}/{name_of(p)} "
        f"({(p.get('status') or {}).get('phase') or 'Pending'})"
        for p in pods
        if not is_terminated(p) and claim in claims_of_pod(p)
    ]


class Usage(Protocol):
    def users(self, pv: JsonObj) -> list[str]: ...


class Claims(Protocol):
    def get(self, namespace: str, name: str) -> JsonObj | None: ...


def current_claim(pv: JsonObj, claims: Claims) -> ClaimRef | None:
    """The claim `pv`'s claimRef names, when a claim of that name exists and is that claim (its uid is
    claimRef.uid, when claimRef has one); None otherwise (no claimRef, the claim is gone, or a newer
    claim of the same name has taken its place)."""
    ref = claim_ref(pv)
    if ref is None or not ref.namespace:
        return None
    found = claims.get(ref.namespace, ref.name)
    if found is None or (ref.uid and uid_of(found) != ref.uid):
        return None
    return ref


class UsageFrom:
    """Usage over three lookups: every VolumeAttachment, the pods of one namespace, and claims."""

    def __init__(
        self,
        attachments: Callable[[], Iterable[JsonObj]],
        pods: Callable[[str], Iterable[JsonObj]],
        claims: Claims,
    ) -> None:
        self._attachments = attachments
        self._pods = pods
        self._claims = claims

    def users(self, pv: JsonObj) -> list[str]:
        """Everything that uses `pv` now; empty when it is free to move."""
        found = attached_to(name_of(pv), self._attachments())
        claim = current_claim(pv, self._claims)
        if claim is not None:
            found += pods_using(claim.name, self._pods(claim.namespace))
        return found


def live_usage(client: KubeClient) -> UsageFrom:
    """Usage read from the API server at each call (one-shot commands, and the steps' last checks)."""
    return UsageFrom(
        lambda: client.list_all(VOLUME_ATTACHMENTS)[0],
        lambda namespace: client.list_all(PODS, namespace)[0],
        LiveClaims(client),
    )


class LiveClaims:
    """Claims read from the API server at each call (list + field selector: RBAC grants no get)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def get(self, namespace: str, name: str) -> JsonObj | None:
        page = self._client.list_page(PVCS, namespace, fieldSelector=f"metadata.name={name}")
        items = page.get("items") or []
        return items[0] if items else None
