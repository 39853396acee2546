"""The destructive steps check use live, on the API server, every time: right before the DELETE (a cache
may lag or be frozen), when `delete` resumes on a PV already deleting, and right before `release` lets
the PV go. While it is used the step stays pending and the PV stays; `release` removes only the
kubernetes.io/pv-protection finalizer. Run against the fake API server (tests/shim/fake_kube_api.py)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import pytest

from shim.migrate import kube, steps
from shim.migrate.events import EventRecorder
from shim.migrate.journal import Journal
from shim.migrate.kube import KubeClient
from shim.migrate.metrics import Metrics
from shim.migrate.objects import record_of
from shim.migrate.usage import LiveClaims, UsageFrom
from tests.shim.fake_kube_api import FakeKubeAPI
from tests.shim.migrate.samples import Obj, sample_journal, sample_pv

PVS = "/api/v1/persistentvolumes"
PODS = "/api/v1/namespaces/ns/pods"
CLAIMS = "/api/v1/namespaces/ns/persistentvolumeclaims"
ATTACHMENTS = "/apis/storage.k8s.io/v1/volumeattachments"
PROTECTION = "kubernetes.io/pv-protection"
OTHER = "example.com/keep-me"


def bound_pv(deleting: bool, finalizers: tuple[str, ...] = (PROTECTION,)) -> Obj:
    """pv-1 Bound to claim ns/data with policy Retain (the retain step ran), as the API server has it."""
    pv = sample_pv("aws-ebs", name="pv-1", claim=("ns", "data", "c-1"))
    pv["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    pv["metadata"].update(uid="u-1", resourceVersion="7", finalizers=list(finalizers))
    if deleting:
        pv["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    pv["status"] = {"phase": "Bound"}
    return pv


def journal(pv: Obj, step: str) -> Journal:
    """The shared sample journal, at `step`, recording `pv` as its source."""
    source = record_of(pv)
    source["spec"]["persistentVolumeReclaimPolicy"] = "Delete"
    return dataclasses.replace(sample_journal(), source=source, step=step)


def pod_using_claim() -> Obj:
    """A pod not scheduled yet (no phase: Pending), which counts as a user."""
    volume = {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}
    return {"metadata": {"name": "app", "namespace": "ns"}, "spec": {"volumes": [volume]}, "status": {}}


def attachment() -> Obj:
    return {
        "metadata": {"name": "csi-1"},
        "spec": {"nodeName": "n1", "source": {"persistentVolumeName": "pv-1"}},
    }


USERS = {
    "pod": ([pod_using_claim()], [], "Pod ns/app (Pending)"),
    "attachment": ([], [attachment()], "VolumeAttachment csi-1 (node n1)"),
}


def cluster(api: FakeKubeAPI, pv: Obj, pods: Sequence[Obj] = (), attachments: Sequence[Obj] = ()) -> None:
    """`pv`, its claim ns/data, and the pods and attachments that use it."""
    claim = {"metadata": {"name": "data", "namespace": "ns", "uid": "c-1"}, "spec": {"volumeName": "pv-1"}}
    api.lists[PVS] = {"kind": "List", "metadata": {}, "items": [pv]}
    api.lists[CLAIMS] = {"kind": "List", "metadata": {}, "items": [claim]}
    api.lists[PODS] = {"kind": "List", "metadata": {}, "items": list(pods)}
    api.lists[ATTACHMENTS] = {"kind": "List", "metadata": {}, "items": list(attachments)}


def context(client: KubeClient) -> steps.Context:
    """A step context whose cached usage sees nothing, as a frozen or lagging cache would."""
    stale = UsageFrom(lambda: [], lambda namespace: [], LiveClaims(client))
    events = EventRecorder(client, "test")
    drivers = {"ebs.csi.aws.com"}
    return steps.Context(client, LiveClaims(client), stale, events, Metrics("test", "test"), 600.0, drivers)


def the_pv(api: FakeKubeAPI) -> Obj | None:
    return next(iter(api.lists[PVS]["items"]), None)


def waiting_events(api: FakeKubeAPI) -> list[str]:
    """Kinds of the objects that got a MigrationWaiting Event."""
    found = []
    for namespace in ("default", "ns"):
        for event in api.lists.get(f"/api/v1/namespaces/{namespace}/events", {}).get("items", []):
            if event["reason"] == "MigrationWaiting":
                found.append(event["involvedObject"]["kind"])
    return found


@pytest.mark.parametrize("user", sorted(USERS))
def test_delete_reads_use_live_not_from_the_cache(api: FakeKubeAPI, client: KubeClient, user: str) -> None:
    pods, attachments, who = USERS[user]
    pv = bound_pv(deleting=False)
    cluster(api, pv, pods, attachments)
    with pytest.raises(steps.InUse, match=re.escape(who)):
        steps.delete(context(client), journal(pv, "delete"), journal(pv, "delete").source)
    assert "deletionTimestamp" not in (the_pv(api) or {})["metadata"]


@pytest.mark.parametrize("step", ["delete", "release"])
@pytest.mark.parametrize("user", sorted(USERS))
def test_a_deleted_pv_in_use_stays_and_the_step_waits_until_it_is_free(
    api: FakeKubeAPI, client: KubeClient, step: str, user: str
) -> None:
    pods, attachments, who = USERS[user]
    pv = bound_pv(deleting=True)
    cluster(api, pv, pods, attachments)
    j = journal(pv, step)
    with pytest.raises(steps.Pending, match=re.escape(f"in use by {who}")):
        steps.STEP_FUNCTIONS[step](context(client), j, j.source)
    left = the_pv(api)
    assert left is not None and left["metadata"]["finalizers"] == [PROTECTION]
    assert waiting_events(api) == ["PersistentVolume", "PersistentVolumeClaim"]
    cluster(api, left)  # the pod and the attachment went
    steps.STEP_FUNCTIONS[step](context(client), j, j.source)
    assert (the_pv(api) is None) is (step == "release"), "released once free (delete has nothing to do)"


def test_release_removes_only_pv_protection(
    api: FakeKubeAPI, client: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "GONE_TIMEOUT", 0.5)
    pv = bound_pv(deleting=True, finalizers=(PROTECTION, OTHER))
    cluster(api, pv)
    j = journal(pv, "release")
    with pytest.raises(
        steps.Pending, match=f"still there after pv-protection was released .finalizers: {OTHER}"
    ):
        steps.release(context(client), j, j.source)
    assert (the_pv(api) or {})["metadata"]["finalizers"] == [OTHER], "other finalizers are their owners'"


def test_delete_is_refused_when_the_pv_changes_after_its_last_check(
    api: FakeKubeAPI, client: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PV reserved for a claim that does not exist is converted; if the claim appears and the binder
    binds the PV after the delete step read it, the DELETE (preconditions uid and resourceVersion) is
    refused and the conversion starts over: the PV is not deleted under its new claim."""
    pv = sample_pv("aws-ebs", name="pv-1", claim=("ns", "reserved", ""))
    pv["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    pv["metadata"].update(uid="u-1", resourceVersion="7")
    pv["status"] = {"phase": "Available"}
    cluster(api, pv)
    j = dataclasses.replace(journal(pv, "delete"), was_bound=False, claim=None)
    checked = steps.users_now

    def binder_binds_after_the_check(ctx: steps.Context, found: Obj) -> list[str]:
        users = checked(ctx, found)
        bound = {"spec": {"claimRef": {"uid": "c-9"}}, "status": {"phase": "Bound"}}
        client.patch(kube.PVS, "pv-1", bound)
        return users

    monkeypatch.setattr(steps, "users_now", binder_binds_after_the_check)
    with pytest.raises(steps.Changed, match="changed"):
        steps.delete(context(client), j, j.source)
    left = the_pv(api)
    assert left is not None and "deletionTimestamp" not in left["metadata"]


def test_a_pv_the_api_server_refuses_to_create_stops_the_journal(
    api: FakeKubeAPI, client: KubeClient
) -> None:
    """A lasting refusal (422 Invalid) is Refused (a MigrationStuck Event, no hot retry), not an error
    retried for ever; the dry run the assessment makes finds it before anything changes."""
    api.lists[PVS] = {"kind": "List", "metadata": {}, "items": []}
    j = journal(bound_pv(deleting=False), "create")
    j.target["metadata"]["labels"] = {"bad key": "x"}
    assert "bad key" in (steps.refusal(context(client), j.target) or "")
    with pytest.raises(steps.Refused, match="refuses the PV to create: 422 Invalid"):
        steps.create(context(client), j, j.source)
    assert api.lists[PVS]["items"] == [] and steps.refusal(context(client), j.source) is None
