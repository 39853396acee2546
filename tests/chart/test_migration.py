"""The migration controller's part of the chart: Deployment, flags, security and least-privilege RBAC."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from shim.cli import build_parser
from shim.gates import FeatureGates
from tests.chart.render import (
    RENDER_KUBE_VERSION,
    Obj,
    component,
    containers,
    of_kind,
    only,
    pod_spec,
    render,
    resolved_args,
    run_helm,
    values_of,
)
from tests.chart.test_rbac import flatten, rule

MIGRATION_RULES = {
    rule("", "persistentvolumes", "get", "list", "watch", "create", "delete", "patch"),
    rule("", "persistentvolumeclaims", "list", "watch"),
    rule("", "pods", "list", "watch"),
    rule("storage.k8s.io", "volumeattachments", "list", "watch"),
    rule("storage.k8s.io", "csidrivers", "get"),
    rule("storage.k8s.io", "storageclasses", "get", "list", "create", "delete"),
    rule("", "events", "create"),
}


def render_with(values: dict[str, Any]) -> list[Obj]:
    result = run_helm(
        ["template", "ballast", "-n", "kube-system", "--kube-version", RENDER_KUBE_VERSION], values
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def migration_objects(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if component(o) == "migration"]


def controller_args(objects: list[Obj]) -> Any:
    container = containers(only(objects, "Deployment", of="migration"))["ballast-migrate"]
    assert container["command"] == ["ballast-migrate"]
    return build_parser().parse_args(resolved_args(container))


def test_nothing_is_deployed_while_migration_is_off(set_id: str) -> None:
    objects = render(set_id)
    assert migration_objects(objects) == [] or values_of(set_id)["migration"]["enabled"]


def test_the_deployment_runs_the_controller_with_two_replicas_and_leader_election() -> None:
    objects = render("migration")
    deployment = only(objects, "Deployment", of="migration")
    assert deployment["spec"]["replicas"] == 2
    args = controller_args(objects)
    assert args.command == "controller"
    assert args.leader_elect is True
    assert args.workers == 10
    assert args.feature_gates == FeatureGates.parse(
        "CSIMigration=true,CSIMigrationAWS=true,InTreePluginAWSUnregister=false"
    )
    assert args.feature_gates.is_migration_enabled("kubernetes.io/aws-ebs")
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in containers(deployment)["ballast-migrate"]["env"]
    }
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert args.namespace == "$(POD_NAMESPACE)"  # expanded by the kubelet from the env above
    values = values_of("migration")["leaderElection"]
    assert (
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    ) == (
        15.0,
        10.0,
        5.0,
    ), values


def test_the_controller_runs_non_root_on_a_read_only_root() -> None:
    deployment = only(render("migration"), "Deployment", of="migration")
    pod = pod_spec(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] not in (None, 0)
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "volumes" not in pod, "the controller needs no volume at all"


def test_liveness_probe_reads_healthz_where_the_controller_serves_it() -> None:
    objects = render("migration")
    container = containers(only(objects, "Deployment", of="migration"))["ballast-migrate"]
    port = container["ports"][0]["containerPort"]
    assert controller_args(objects).metrics_address == f"0.0.0.0:{port}"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


@pytest.mark.parametrize(
    ("move", "expected"),
    [
        pytest.param(False, MIGRATION_RULES, id="default"),
        pytest.param(
            True,
            (MIGRATION_RULES - {rule("storage.k8s.io", "storageclasses", "get", "list", "create", "delete")})
            | {rule("storage.k8s.io", "storageclasses", "get", "list", "create", "delete", "patch")},
            id="move-default-class",
        ),
    ],
)
def test_cluster_role_grants_exactly_what_the_controller_needs(move: bool, expected: set[Any]) -> None:
    objects = render_with({"migration": {"enabled": True, "moveDefaultClass": move}})
    (role,) = [r for r in of_kind(objects, "ClusterRole") if component(r) == "migration"]
    assert flatten(role) == expected
    assert controller_args(objects).move_default_class is move


def test_bindings_name_the_migration_service_account_and_leases_stay_namespaced() -> None:
    objects = render("migration")
    account = pod_spec(only(objects, "Deployment", of="migration"))["serviceAccountName"]
    driver_account = pod_spec(only(objects, "Deployment"))["serviceAccountName"]
    assert account != driver_account
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}]
    (cluster_binding,) = [b for b in of_kind(objects, "ClusterRoleBinding") if component(b) == "migration"]
    assert cluster_binding["subjects"] == subject
    (lease_binding,) = [b for b in of_kind(objects, "RoleBinding") if component(b) == "migration"]
    assert lease_binding["subjects"] == subject and lease_binding["metadata"]["namespace"] == "kube-system"
    leases_role = only(objects, "Role")
    assert lease_binding["roleRef"] == {
        "kind": "Role",
        "name": leases_role["metadata"]["name"],
        "apiGroup": "rbac.authorization.k8s.io",
    }
    assert {resource for _, resource, _ in flatten(leases_role)} == {"leases"}


def test_optional_flags_follow_their_values() -> None:
    objects = render_with(
        {
            "migration": {
                "enabled": True,
                "selector": "migrate=wave-1",
                "dryRun": True,
                "workers": 3,
                "lockDuration": "45s",
                "featureGates": {"CSIMigration": True, "CSIMigrationGCE": True, "CSIMigrationAWS": False},
            }
        }
    )
    args = controller_args(objects)
    assert (args.selector, args.dry_run, args.workers, args.lock_duration) == (
        "migrate=wave-1",
        True,
        3,
        45.0,
    )
    assert args.feature_gates.is_migration_enabled("kubernetes.io/gce-pd")
    assert not args.feature_gates.is_migration_enabled("kubernetes.io/aws-ebs")


def test_metrics_service_selects_the_migration_pods() -> None:
    objects = render_with({"migration": {"enabled": True}, "metrics": {"enabled": True}})
    (service,) = [s for s in of_kind(objects, "Service") if component(s) == "migration"]
    deployment = only(objects, "Deployment", of="migration")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert (
        service["spec"]["ports"][0]["port"]
        == containers(deployment)["ballast-migrate"]["ports"][0]["containerPort"]
    )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        pytest.param(
            {"migration": {"featureGates": {"CSIMigrationNope": True}}}, "CSIMigrationNope", id="unknown-gate"
        ),
        pytest.param({"migration": {"workers": 0}}, "minimum", id="zero-workers"),
        pytest.param({"migration": {"lockDuration": "soon"}}, "soon", id="bad-duration"),
    ],
)
def test_schema_refuses_bad_migration_values(values: dict[str, Any], named: str) -> None:
    result = run_helm(["template", "ballast", "--kube-version", RENDER_KUBE_VERSION], values)
    assert result.returncode != 0
    assert named in result.stderr
