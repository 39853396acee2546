"""How the containers find each other and what the driver is told: sockets, names, gates, metrics."""

from __future__ import annotations

import pytest

from tests.chart.render import (
    Obj,
    containers,
    flag_values,
    mounts,
    of_kind,
    only,
    render,
    render_values,
    resolved_args,
    values_of,
    volumes,
)

CONTROLLER_SIDECARS = (
    "csi-provisioner",
    "csi-attacher",
    "csi-snapshotter",
    "csi-resizer",
    "liveness-probe",
    "csi-snapshot-metadata",
)
EXPECTED_DRIVER = {"local": "local.csi.ballast.dev", "aws": "ebs.csi.aws.com"}


def socket_dir_of(workload: Obj, container: Obj, socket: str) -> str:
    """Name of the volume that holds `socket` inside `container` (asserts there is one)."""
    directory = socket.rsplit("/", 1)[0]
    names = [m["name"] for m in container["volumeMounts"] if m["mountPath"].rstrip("/") == directory]
    assert len(names) == 1, f"{container['name']}: no volume mounted at {directory}"
    assert names[0] in volumes(workload)
    return str(names[0])


def test_controller_sidecars_dial_the_driver_socket(set_id: str) -> None:
    deployment = only(render(set_id), "Deployment")
    by_name = containers(deployment)
    driver_args = resolved_args(by_name["ballast-plugin"])
    (endpoint,) = flag_values(driver_args, "--endpoint")
    assert endpoint == "unix:///csi/csi.sock"
    driver_volume = socket_dir_of(deployment, by_name["ballast-plugin"], "/csi/csi.sock")
    assert "emptyDir" in volumes(deployment)[driver_volume]
    sidecars = [n for n in CONTROLLER_SIDECARS if n in by_name]
    values = values_of(set_id)
    assert (
        len(sidecars)
        == 4 + values["sidecars"]["snapshotter"]["enabled"] + values["snapshotMetadata"]["enabled"]
    )
    for name in sidecars:
        (address,) = flag_values(resolved_args(by_name[name]), "--csi-address")
        assert address == "/csi/csi.sock", name
        assert socket_dir_of(deployment, by_name[name], address) == driver_volume, name


def test_node_registrar_registers_the_socket_kubelet_will_dial(set_id: str) -> None:
    daemonset = only(render(set_id), "DaemonSet")
    values = values_of(set_id)
    plugin_dir = f"{values['node']['kubeletPath']}/plugins/{EXPECTED_DRIVER[values['backend']['name']]}/"
    by_name = containers(daemonset)
    assert volumes(daemonset)["plugin-dir"]["hostPath"]["path"] == plugin_dir
    (endpoint,) = flag_values(resolved_args(by_name["ballast-plugin"]), "--endpoint")
    assert endpoint == "unix:///csi/csi.sock"
    assert mounts(by_name["ballast-plugin"])["plugin-dir"]["mountPath"] == "/csi"
    registrar_args = resolved_args(by_name["node-driver-registrar"])
    assert flag_values(registrar_args, "--csi-address") == ["/csi/csi.sock"]
    assert flag_values(registrar_args, "--kubelet-registration-path") == [plugin_dir + "csi.sock"]
    assert mounts(by_name["node-driver-registrar"])["plugin-dir"]["mountPath"] == "/csi"
    registration = mounts(by_name["node-driver-registrar"])["registration-dir"]
    assert registration["mountPath"] == "/registration"
    assert (
        volumes(daemonset)["registration-dir"]["hostPath"]["path"]
        == f"{values['node']['kubeletPath']}/plugins_registry/"
    )
    assert flag_values(resolved_args(by_name["liveness-probe"]), "--csi-address") == ["/csi/csi.sock"]


def test_driver_name_follows_the_backend(set_id: str) -> None:
    objects = render(set_id)
    backend = values_of(set_id)["backend"]["name"]
    name = EXPECTED_DRIVER[backend]
    csidriver = only(objects, "CSIDriver")
    assert csidriver["metadata"]["name"] == name
    assert csidriver["spec"] == {
        "attachRequired": True,
        "podInfoOnMount": False,
        "fsGroupPolicy": "File",
        "volumeLifecycleModes": ["Persistent"],
        "seLinuxMount": True,
    }
    for workload in (only(objects, "Deployment"), only(objects, "DaemonSet")):
        args = resolved_args(containers(workload)["ballast-plugin"])
        assert flag_values(args, "--driver-name") == [name]
        assert flag_values(args, "--backend") == [backend]
    assert {c["provisioner"] for c in of_kind(objects, "StorageClass")} <= {name}
    assert {c["driver"] for c in of_kind(objects, "VolumeSnapshotClass")} <= {name}


def test_driver_modes(set_id: str) -> None:
    objects = render(set_id)
    assert flag_values(
        resolved_args(containers(only(objects, "Deployment"))["ballast-plugin"]), "--mode"
    ) == ["controller"]
    assert flag_values(resolved_args(containers(only(objects, "DaemonSet"))["ballast-plugin"]), "--mode") == [
        "node"
    ]


def test_no_migration_gate_reaches_the_driver_or_a_sidecar(set_id: str) -> None:
    """The gates are the migration controller's (test_migration); the driver has no --feature-gates and
    the sidecars refuse gates they do not know."""
    objects = render(set_id)
    for workload in (only(objects, "Deployment"), only(objects, "DaemonSet")):
        for name, container in containers(workload).items():
            args = resolved_args(container)
            assert not any("CSIMigration" in a or "InTreePlugin" in a for a in args), name


@pytest.mark.parametrize(
    ("gates", "flags"),
    [
        pytest.param(None, [], id="default-renders-no-flag"),
        pytest.param({}, [], id="empty-renders-no-flag"),
        pytest.param(
            {"CrossNamespaceVolumeDataSource": True, "ExampleGate": False},
            ["CrossNamespaceVolumeDataSource=true,ExampleGate=false"],
            id="set-gates-render-as-one-flag",
        ),
    ],
)
def test_provisioner_feature_gates_render_only_when_set(
    gates: dict[str, bool] | None, flags: list[str]
) -> None:
    """No default gate: Topology is GA in the provisioner (on anyway) and naming it only logs a
    deprecation warning until upstream removes it and the provisioner refuses to start."""
    values = {} if gates is None else {"sidecars": {"provisioner": {"featureGates": gates}}}
    provisioner = containers(only(render_values(values), "Deployment"))["csi-provisioner"]
    assert flag_values(resolved_args(provisioner), "--feature-gates") == flags


def test_controller_sidecars_elect_a_leader(set_id: str) -> None:
    deployment = only(render(set_id), "Deployment")
    for name in ("csi-provisioner", "csi-attacher", "csi-snapshotter", "csi-resizer"):
        container = containers(deployment).get(name)
        if container is None:
            continue
        args = resolved_args(container)
        assert flag_values(args, "--leader-election") == ["true"], name
        assert flag_values(args, "--leader-election-namespace") == ["kube-system"], name


def test_the_sidecars_pass_the_names_tag_templates_read(set_id: str) -> None:
    """The claim's and the VolumeSnapshot's names fill aws tag templates (DiskOptions.metadata, the
    metadata of create_snapshot and modify_volume)."""
    sidecars = containers(only(render(set_id), "Deployment"))
    flags = {
        "csi-provisioner": "--extra-create-metadata",
        "csi-snapshotter": "--extra-create-metadata",
        "csi-resizer": "--extra-modify-metadata",
    }
    for name, flag in flags.items():
        if name in sidecars:
            assert flag in resolved_args(sidecars[name]), name
    assert "csi-provisioner" in sidecars


@pytest.mark.parametrize(
    ("set_id", "replicas"),
    [
        pytest.param("defaults", 1, id="local-single-replica"),
        pytest.param("aws", 2, id="aws-two-replicas"),
    ],
)
def test_controller_replicas_follow_the_backend(set_id: str, replicas: int) -> None:
    assert only(render(set_id), "Deployment")["spec"]["replicas"] == replicas


@pytest.mark.parametrize(
    ("set_id", "max_surge"),
    [
        pytest.param("defaults", 0, id="local-never-overlaps-the-data-dir-owner"),
        pytest.param("aws", None, id="aws-default-surge"),
    ],
)
def test_controller_rollout_overlap_follows_the_backend(set_id: str, max_surge: int | None) -> None:
    rolling = only(render(set_id), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling.get("maxSurge") == max_surge
    assert rolling["maxUnavailable"] == 1


def test_metrics_off_by_default_means_no_endpoints() -> None:
    objects = render("defaults")
    assert of_kind(objects, "Service") == []
    for workload in (only(objects, "Deployment"), only(objects, "DaemonSet")):
        for container in containers(workload).values():
            args = resolved_args(container)
            assert flag_values(args, "--metrics-address") == []
            assert not [a for a in args if a.startswith("--http-endpoint") and ":33" in a]


def test_metrics_services_target_ports_the_containers_open() -> None:
    objects = render("metrics")
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    assert set(services) == {"ballast-ballast-csi-controller-metrics", "ballast-ballast-csi-node-metrics"}
    for workload, service in (
        (only(objects, "Deployment"), services["ballast-ballast-csi-controller-metrics"]),
        (only(objects, "DaemonSet"), services["ballast-ballast-csi-node-metrics"]),
    ):
        open_ports = {
            p["name"]: p["containerPort"] for c in containers(workload).values() for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert open_ports[port["targetPort"]] == port["port"], port
        selector = service["spec"]["selector"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    plugin = containers(only(objects, "Deployment"))["ballast-plugin"]
    assert flag_values(resolved_args(plugin), "--metrics-address") == ["0.0.0.0:3301"]
    for monitor in of_kind(objects, "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        service = services[f"ballast-ballast-csi-{component}-metrics"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert {e["port"] for e in monitor["spec"]["endpoints"]} == {
            p["name"] for p in service["spec"]["ports"]
        }


def test_pod_disruption_budget_selects_the_controller(set_id: str) -> None:
    objects = render(set_id)
    budgets = of_kind(objects, "PodDisruptionBudget")
    if not values_of(set_id)["controller"]["podDisruptionBudget"]["enabled"]:
        assert budgets == []
        return
    (budget,) = budgets
    labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1


def test_aws_credentials_come_from_the_named_secret() -> None:
    plugin = containers(only(render("aws"), "Deployment"))["ballast-plugin"]
    env = {e["name"]: e for e in plugin["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "aws-secret", "key": "key_id"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "aws-secret",
        "key": "access_key",
    }
    assert flag_values(resolved_args(plugin), "--aws-region") == ["eu-west-1"]
    node_plugin = containers(only(render("aws"), "DaemonSet"))["ballast-plugin"]
    assert not any(e["name"].startswith("AWS_SECRET") for e in node_plugin.get("env", []))
