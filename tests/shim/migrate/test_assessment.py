"""The engine's assessment of a PV before it takes any step: why it waits (and the controller's gauge of
waiting PVs by that reason), and PVs whose new form or journal would not fit Kubernetes' annotation limit.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim import Translator
from shim.cli import build_parser, main
from shim.gates import FeatureGates
from shim.migrate import kube
from shim.migrate import objects as o
from shim.migrate.actor import Actor, build
from shim.migrate.controller import Controller
from shim.migrate.engine import (
    ANNOTATIONS_LIMIT,
    DONE,
    IN_USE,
    PHASE,
    PRE_BOUND,
    SKIPPED,
    WAIT_REASONS,
    WAITING,
    Outcome,
    annotations_size,
)
from shim.migrate.journal import CONVERT, ROLLBACK, Journal
from shim.migrate.metrics import Metrics
from shim.migrate.options import check
from shim.migrate.usage import LiveClaims, UsageFrom
from shim.objects import Location, Manifest
from shim.plan import Planner
from tests.shim.fake_kube_api import FakeKubeAPI
from tests.shim.migrate.samples import sample_pv

Obj = dict[str, Any]
CLAIM = ("apps", "data", "claim-uid-1")
USER_POD: Obj = {
    "metadata": {"name": "db-0", "namespace": "apps"},
    "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
    "status": {"phase": "Running"},
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[kube.KubeClient, Path]]:
    """A client of a fake API server holding the claim `apps/data` and CSIDriver ebs.csi.aws.com, and its
    kubeconfig."""
    claim = {"metadata": {"name": "data", "namespace": "apps", "uid": CLAIM[2]}}
    driver = {"metadata": {"name": "ebs.csi.aws.com", "uid": "cd-1"}}
    lists = {
        "/api/v1/namespaces/apps/persistentvolumeclaims": {"items": [claim], "metadata": {}},
        "/apis/storage.k8s.io/v1/csidrivers": {"items": [driver], "metadata": {}},
    }
    with FakeKubeAPI(lists) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        client = kube.connect(str(kubeconfig))
        yield client, kubeconfig
        client.close()


@pytest.fixture
def actor(cluster: tuple[kube.KubeClient, Path]) -> Actor:
    """A dry-run actor (Events are only logged) whose only pod uses claim apps/data."""
    client, kubeconfig = cluster
    args = build_parser().parse_args(["apply", "--kubeconfig", str(kubeconfig), "--dry-run"])
    check(args)
    usage = UsageFrom(
        lambda: [], lambda namespace: [USER_POD] if namespace == "apps" else [], LiveClaims(client)
    )
    return build(args, client, Metrics("test", "test"), LiveClaims(client), usage)


def pv_in(phase: str, claim: tuple[str, str, str] | None = CLAIM) -> Obj:
    pv = sample_pv("aws-ebs", name="pv-1", claim=claim)
    pv["metadata"]["uid"] = "pv-uid-1"
    pv["status"] = {"phase": phase}
    return pv


@pytest.mark.parametrize(
    ("pv", "reason", "fragment"),
    [
        pytest.param(pv_in("Failed"), PHASE, "phase Failed", id="failed"),
        pytest.param(pv_in("Pending", None), PHASE, "phase Pending", id="pending"),
        pytest.param(pv_in("Available", ("apps", "data", "")), PRE_BOUND, "pre-bound", id="pre-bound"),
        pytest.param(pv_in("Bound"), IN_USE, "in use by Pod apps/db-0 (Running)", id="in-use"),
    ],
)
def test_a_waiting_pv_says_why(actor: Actor, pv: Obj, reason: str, fragment: str) -> None:
    outcome = actor.engine.assess(pv, CONVERT)
    assert isinstance(outcome, Outcome)
    assert (outcome.result, outcome.reason) == (WAITING, reason)
    assert fragment in outcome.message


def test_the_waiting_gauge_counts_pvs_by_reason(cluster: tuple[kube.KubeClient, Path]) -> None:
    client, kubeconfig = cluster
    args = build_parser().parse_args(["controller", "--kubeconfig", str(kubeconfig)])
    check(args)
    metrics = Metrics("test", "test")
    controller = Controller(client, metrics, args)
    waits = {"pv/a": PHASE, "pv/b": PRE_BOUND, "pv/c": PHASE, "pv/d": IN_USE}
    for key, reason in waits.items():
        controller._after(key, Outcome(key[3:], CONVERT, WAITING, "waits", reason=reason))
    controller._after("pv/c", Outcome("c", CONVERT, "done", "converted"))

    def gauge(reason: str) -> float | None:
        return metrics.registry.get_sample_value("ballast_migrate_volumes_waiting", {"reason": reason})

    assert {reason: gauge(reason) for reason in WAIT_REASONS} == {
        "in-use": 1.0,
        "phase": 1.0,
        "pre-bound": 1.0,
        "changed": 0.0,
    }


def with_annotation(size: int) -> Obj:
    pv = pv_in("Available", None)
    pv["metadata"]["annotations"]["example.com/blob"] = "x" * size
    return pv


@pytest.mark.parametrize(
    ("size", "fragment"),
    [
        pytest.param(100_000, "its journal (the record of the PV and the PV to create) would", id="journal"),
        pytest.param(140_000, "the new PV would carry", id="new-pv"),
    ],
)
def test_a_pv_too_large_to_convert_is_skipped_not_failed(actor: Actor, size: int, fragment: str) -> None:
    outcome = actor.engine.assess(with_annotation(size), CONVERT)
    assert isinstance(outcome, Outcome)
    assert (outcome.result, outcome.reason) == (SKIPPED, "too-large")
    assert outcome.message.startswith(f"too-large: {fragment}")
    assert f"Kubernetes allows {ANNOTATIONS_LIMIT}" in outcome.message
    skips = actor.metrics.registry.get_sample_value("ballast_migrate_skips_total", {"reason": "too-large"})
    assert skips == 1
    journal = actor.engine.assess(with_annotation(60_000), CONVERT)  # room for both: no skip
    assert isinstance(journal, Journal)
    assert annotations_size(journal.target["metadata"]["annotations"]) < ANNOTATIONS_LIMIT
    assert len(journal.to_json()) < ANNOTATIONS_LIMIT


def test_annotation_size_counts_keys_and_values_in_utf8_bytes() -> None:
    assert annotations_size({"a/b": "é" * 10, "c": ""}) == 3 + 20 + 1
    assert annotations_size(json.loads('{"k": "\\ud83d\\ude00"}')) == 1 + 4


def converted_with_record(changes: Obj) -> Obj:
    """pv-1 converted to CSI (Available), its record annotation changed at the top level by `changes`."""
    record = o.record_of(pv_in("Available", None))
    pv = o.convert_target(Translator(), record, "j-1", "me")
    pv["metadata"].update(uid="pv-uid-2", annotations={o.ANN_ORIGINAL: json.dumps({**record, **changes})})
    pv["status"] = {"phase": "Available"}
    return pv


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"metadata": "x"}, id="metadata-string"),
        pytest.param({"spec": {**pv_in("Available", None)["spec"], "capacity": "big"}}, id="capacity-string"),
        pytest.param(
            {"spec": {**pv_in("Available", None)["spec"], "capacity": {"storage": 5}}}, id="capacity-number"
        ),
        pytest.param({"metadata": {"name": "pv-1", "annotations": ["a"]}}, id="annotations-list"),
        pytest.param({"metadata": {"name": "pv-1", "labels": {"bad key": "x"}}}, id="label-key-invalid"),
        pytest.param(
            {"spec": {**pv_in("Available", None)["spec"], "accessModes": "ReadWriteOnce"}}, id="modes-string"
        ),
    ],
)
def test_a_malformed_record_is_skipped_not_a_crash(actor: Actor, changes: Obj) -> None:
    outcome = actor.engine.assess(converted_with_record(changes), ROLLBACK)
    assert isinstance(outcome, Outcome)
    assert (outcome.result, outcome.reason) == (SKIPPED, "bad-record")
    skips = actor.metrics.registry.get_sample_value("ballast_migrate_skips_total", {"reason": "bad-record"})
    assert skips == 1


NS = "migration"


def one_shot_lists(pvs: list[Obj], claims: list[Obj], pods: list[Obj], namespace: str) -> dict[str, Obj]:
    """What `apply` reads and writes, on a fake API server holding `pvs`, and `claims` and `pods` of
    `namespace`; CSIDriver ebs.csi.aws.com is installed."""

    def listed(*items: Obj) -> Obj:
        return {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": list(items)}

    return {
        "/api/v1/persistentvolumes": listed(*pvs),
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims": listed(*claims),
        f"/api/v1/namespaces/{namespace}/pods": listed(*pods),
        "/api/v1/persistentvolumeclaims": listed(*claims),
        "/apis/storage.k8s.io/v1/volumeattachments": listed(),
        "/apis/storage.k8s.io/v1/storageclasses": listed(),
        "/apis/storage.k8s.io/v1/csidrivers": listed(
            {"metadata": {"name": "ebs.csi.aws.com", "uid": "cd-1"}}
        ),
        f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases": listed(),
    }


def apply_pv(lists: dict[str, Obj], pv: str, tmp_path: Path) -> tuple[int, Obj, FakeKubeAPI]:
    """`ballast-migrate apply --pv <pv> -o json` against a fake API server serving `lists`: exit code,
    the PV's result, and the server (stopped) to inspect."""
    with FakeKubeAPI(lists) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(
                [
                    "apply",
                    "--pv",
                    pv,
                    "--timeout",
                    "3s",
                    "-o",
                    "json",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--namespace",
                    NS,
                ]
            )
    (volume,) = json.loads(out.getvalue())["volumes"]
    return code, volume, api


def events_on(api: FakeKubeAPI, kind: str) -> list[Obj]:
    return [
        event
        for path, listed in api.lists.items()
        if path.endswith("/events")
        for event in listed["items"]
        if event["involvedObject"]["kind"] == kind
    ]


def test_a_released_pv_is_not_used_by_the_pods_of_a_newer_claim_of_the_same_name(tmp_path: Path) -> None:
    """A StatefulSet's claim deleted and created again: the old PV (Retain) is Released with the old claim's
    uid in its claimRef, and the new claim of the same name is bound to another PV and used by pod app-0.
    The old PV is free: it converts, and the new claim gets no Event about it."""
    old = sample_pv("aws-ebs", name="rv5-old", claim=("rv5", "data", "old-claim-uid"))
    old["metadata"].update(uid="pv-old-uid", resourceVersion="5")
    old["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    old["status"] = {"phase": "Released"}
    claim = {
        "metadata": {"name": "data", "namespace": "rv5", "uid": "new-claim-uid"},
        "spec": {"volumeName": "rv5-new"},
        "status": {"phase": "Bound"},
    }
    user = {**USER_POD, "metadata": {"name": "app-0", "namespace": "rv5"}}
    code, volume, api = apply_pv(one_shot_lists([old], [claim], [user], "rv5"), "rv5-old", tmp_path)
    assert (code, volume["result"]) == (0, DONE), volume["message"]
    (converted,) = api.lists["/api/v1/persistentvolumes"]["items"]
    assert converted["spec"]["csi"]["driver"] == "ebs.csi.aws.com"
    assert converted["spec"]["claimRef"]["uid"] == "old-claim-uid"
    assert events_on(api, "PersistentVolumeClaim") == []


def test_a_pv_reserved_for_a_claim_that_does_not_exist_converts_and_stays_reserved(tmp_path: Path) -> None:
    """Kubernetes' "reserving a PersistentVolume": a claimRef without uid naming a claim that does not
    exist (yet). kube-controller-manager leaves it Available until such a claim appears, which may be
    never; it converts, and the CSI PV keeps the reservation for the binder to complete."""
    pv = pv_in("Available", ("apps", "reserved", ""))
    pv["metadata"]["resourceVersion"] = "5"
    code, volume, api = apply_pv(one_shot_lists([pv], [], [], "apps"), "pv-1", tmp_path)
    assert (code, volume["result"]) == (0, DONE), volume["message"]
    (converted,) = api.lists["/api/v1/persistentvolumes"]["items"]
    assert converted["spec"]["csi"]["driver"] == "ebs.csi.aws.com"
    ref = converted["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"], ref.get("uid")) == ("apps", "reserved", None)


def test_a_pv_reserved_for_an_existing_claim_waits_for_the_binder(actor: Actor) -> None:
    outcome = actor.engine.assess(pv_in("Available", ("apps", "data", "")), CONVERT)
    assert isinstance(outcome, Outcome) and (outcome.result, outcome.reason) == (WAITING, PRE_BOUND)
    journal = actor.engine.assess(pv_in("Available", ("apps", "reserved", "")), CONVERT)
    assert isinstance(journal, Journal), journal
    assert (journal.was_bound, journal.claim) == (False, None)


def test_a_pv_whose_csi_driver_is_not_installed_is_skipped_as_plan_says(tmp_path: Path) -> None:
    """`plan` calls a PV BLOCKED when its CSI driver has no CSIDriver object; apply (and the controller)
    skip it with the same words, an Event and the skip metric, and change nothing."""
    pv = pv_in("Available", None)
    pv["metadata"]["resourceVersion"] = "5"
    lists = one_shot_lists([pv], [], [], "apps")
    lists["/apis/storage.k8s.io/v1/csidrivers"]["items"] = []
    code, volume, api = apply_pv(lists, "pv-1", tmp_path)
    blocker = "CSI driver ebs.csi.aws.com is not installed (no CSIDriver object)"
    assert (code, volume["result"]) == (1, SKIPPED)
    assert volume["message"] == f"driver-missing: {blocker}"
    assert api.lists["/api/v1/persistentvolumes"]["items"] == [pv], "nothing changed"
    (event,) = events_on(api, "PersistentVolume")
    assert (event["reason"], event["message"]) == ("MigrationSkipped", f"convert skipped: {blocker}")
    plan = Planner(Translator(), FeatureGates(), set()).plan(Manifest(Location("pv.yaml", 1), pv))
    assert [item.blockers for item in plan] == [[blocker]]
