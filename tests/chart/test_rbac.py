"""Each sidecar's ClusterRole grants exactly what it needs, bound to the controller's ServiceAccount only;
the node plugin's role (startup taint removal) is bound to the node's ServiceAccount only."""

from __future__ import annotations

import pytest

from tests.chart.render import Obj, component, of_kind, only, pod_spec, render, render_values, values_of

R = tuple[str, str, frozenset[str]]  # (apiGroup, resource, verbs)


def rule(group: str, resource: str, *verbs: str) -> R:
    return (group, resource, frozenset(verbs))


EVENTS = rule("", "events", "list", "watch", "create", "update", "patch")
WATCH = ("get", "list", "watch")
EXPECTED: dict[str, set[R]] = {
    "provisioner": {
        rule("", "persistentvolumes", *WATCH, "create", "patch", "delete"),
        rule("", "persistentvolumeclaims", *WATCH, "update"),
        rule("storage.k8s.io", "storageclasses", *WATCH),
        EVENTS,
        rule("snapshot.storage.k8s.io", "volumesnapshots", *WATCH, "update"),
        rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "list"),
        rule("storage.k8s.io", "csinodes", *WATCH),
        rule("", "nodes", *WATCH),
        rule("storage.k8s.io", "volumeattachments", *WATCH),
        rule("storage.k8s.io", "volumeattributesclasses", "get"),
    },
    "attacher": {
        rule("", "persistentvolumes", *WATCH, "patch"),
        rule("storage.k8s.io", "csinodes", *WATCH),
        rule("storage.k8s.io", "volumeattachments", *WATCH, "patch"),
        rule("storage.k8s.io", "volumeattachments/status", "patch"),
    },
    "resizer": {
        rule("", "persistentvolumes", *WATCH, "patch"),
        rule("", "persistentvolumeclaims", *WATCH),
        rule("", "persistentvolumeclaims/status", "patch"),
        rule("", "pods", *WATCH),
        EVENTS,
        rule("storage.k8s.io", "volumeattributesclasses", *WATCH),
    },
    "snapshotter": {
        EVENTS,
        rule("snapshot.storage.k8s.io", "volumesnapshotclasses", *WATCH),
        rule("snapshot.storage.k8s.io", "volumesnapshotcontents", *WATCH, "update", "patch"),
        rule("snapshot.storage.k8s.io", "volumesnapshotcontents/status", "update", "patch"),
        # Group snapshots: without these csi-snapshotter turns the feature off at start-up.
        rule("groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", *WATCH),
        rule("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", *WATCH, "update", "patch"),
        rule("groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "update", "patch"),
    },
    # The node plugin: reads its CSINode, removes <driver>/agent-not-ready from its own Node.
    "node": {
        rule("storage.k8s.io", "csinodes", "get"),
        rule("", "nodes", "get", "patch"),
    },
}
LEASES = {rule("coordination.k8s.io", "leases", "get", "watch", "list", "delete", "update", "create")}


def flatten(role: Obj) -> set[R]:
    out: set[R] = set()
    for r in role["rules"]:
        for group in r["apiGroups"]:
            for resource in r["resources"]:
                out.add((group, resource, frozenset(r["verbs"])))
    return out


def roles_by_sidecar(objects: list[Obj]) -> dict[str, Obj]:
    return {r["metadata"]["name"].rsplit("-", 1)[1]: r for r in of_kind(objects, "ClusterRole")}


@pytest.mark.parametrize("sidecar", sorted(EXPECTED))
def test_cluster_role_grants_exactly_what_the_sidecar_needs(sidecar: str) -> None:
    role = roles_by_sidecar(render("defaults"))[sidecar]
    assert flatten(role) == EXPECTED[sidecar]


REFERENCE_GRANTS = rule("gateway.networking.k8s.io", "referencegrants", *WATCH)


@pytest.mark.parametrize(
    ("gates", "granted"),
    [
        pytest.param({}, False, id="gate-absent"),
        pytest.param({"ExampleGate": True}, False, id="other-gate-only"),
        pytest.param({"CrossNamespaceVolumeDataSource": False}, False, id="gate-false"),
        pytest.param({"CrossNamespaceVolumeDataSource": True}, True, id="gate-true"),
    ],
)
def test_provisioner_reads_reference_grants_only_with_cross_namespace_sources(
    gates: dict[str, bool], granted: bool
) -> None:
    """With CrossNamespaceVolumeDataSource on, csi-provisioner waits for a ReferenceGrant informer."""
    objects = render_values({"sidecars": {"provisioner": {"featureGates": gates}}})
    extra = {REFERENCE_GRANTS} if granted else set()
    assert flatten(roles_by_sidecar(objects)["provisioner"]) == EXPECTED["provisioner"] | extra


def test_no_wildcards_and_no_secrets(set_id: str) -> None:
    for role in of_kind(render(set_id), "ClusterRole") + of_kind(render(set_id), "Role"):
        for group, resource, verbs in flatten(role):
            assert "*" not in verbs and "*" not in (group, resource), role["metadata"]["name"]
            assert resource != "secrets", role["metadata"]["name"]


def test_leases_role_is_namespaced_and_only_for_leases(set_id: str) -> None:
    objects = render(set_id)
    role = only(objects, "Role")
    assert role["metadata"]["namespace"] == "kube-system"
    assert flatten(role) == LEASES


def test_every_binding_names_the_service_account_of_its_pod_only(set_id: str) -> None:
    """The driver's bindings (the migration controller's own are checked in test_migration)."""
    objects = [o for o in render(set_id) if component(o) != "migration"]
    account = pod_spec(only(objects, "Deployment"))["serviceAccountName"]
    node_account = pod_spec(only(objects, "DaemonSet"))["serviceAccountName"]
    assert node_account != account
    bindings = of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding")
    roles = {r["metadata"]["name"] for r in of_kind(objects, "ClusterRole") + of_kind(objects, "Role")}
    values = values_of(set_id)
    optional = values["sidecars"]["snapshotter"]["enabled"] + values["snapshotMetadata"]["enabled"]
    assert len(of_kind(objects, "ClusterRoleBinding")) == 4 + optional
    for binding in bindings:
        expected = node_account if binding["roleRef"]["name"].endswith("-node") else account
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": expected, "namespace": "kube-system"}
        ]
        assert binding["roleRef"]["name"] in roles
    assert {s.get("name") for b in bindings for s in b["subjects"]} == {account, node_account}
