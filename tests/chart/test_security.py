"""Privileges: a restricted, non-root controller; a privileged node plugin with Bidirectional mounts."""

from __future__ import annotations

import pytest

from tests.chart.render import (
    Obj,
    containers,
    mounts,
    only,
    pod_spec,
    render,
    render_values,
    values_of,
    volumes,
)


def effective(pod: Obj, container: Obj, key: str) -> object:
    """A security setting as the kubelet applies it: the container's, else the pod's."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


def test_controller_containers_run_restricted_and_non_root(set_id: str) -> None:
    deployment = only(render(set_id), "Deployment")
    pod = pod_spec(deployment)
    assert set(containers(deployment)) >= {"ballast-plugin", "csi-provisioner", "csi-attacher", "csi-resizer"}
    for name, container in containers(deployment).items():
        assert effective(pod, container, "runAsNonRoot") is True, name
        assert effective(pod, container, "runAsUser") not in (None, 0), name
        assert effective(pod, container, "seccompProfile") == {"type": "RuntimeDefault"}, name
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["readOnlyRootFilesystem"] is True, name
        assert context["capabilities"] == {"drop": ["ALL"]}, name
        assert "privileged" not in context, name


def test_local_controller_init_container_may_only_chown_the_data_dir() -> None:
    deployment = only(render("local-tuned"), "Deployment")
    (init,) = pod_spec(deployment)["initContainers"]
    assert init["command"] == ["chown", "-R", "1000:1000", "/srv/ballast"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_READ_SEARCH"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_aws_controller_has_no_init_container_and_no_host_paths() -> None:
    deployment = only(render("aws"), "Deployment")
    assert "initContainers" not in pod_spec(deployment)
    assert [v for v in volumes(deployment).values() if "hostPath" in v] == []


def test_node_plugin_is_privileged_with_bidirectional_kubelet_mount(set_id: str) -> None:
    daemonset = only(render(set_id), "DaemonSet")
    kubelet = values_of(set_id)["node"]["kubeletPath"]
    plugin = containers(daemonset)["ballast-plugin"]
    assert plugin["securityContext"]["privileged"] is True
    assert plugin["securityContext"]["runAsUser"] == 0
    plugin_mounts = mounts(plugin)
    assert plugin_mounts["kubelet-dir"]["mountPath"] == kubelet
    assert plugin_mounts["kubelet-dir"]["mountPropagation"] == "Bidirectional"
    assert plugin_mounts["device-dir"]["mountPath"] == "/dev"
    host = volumes(daemonset)
    assert host["kubelet-dir"]["hostPath"] == {"path": kubelet, "type": "Directory"}
    assert host["device-dir"]["hostPath"]["path"] == "/dev"
    # No other container of the node pod may propagate mounts back to the host or be privileged.
    for name, container in containers(daemonset).items():
        if name == "ballast-plugin":
            continue
        assert container["securityContext"].get("privileged") is not True, name
        assert all("mountPropagation" not in m for m in container.get("volumeMounts", [])), name


def test_node_pod_is_node_critical_and_tolerates_taints(set_id: str) -> None:
    spec = pod_spec(only(render(set_id), "DaemonSet"))
    assert spec["priorityClassName"] == "system-node-critical"
    node_values = values_of(set_id)["node"]
    if node_values["tolerateAllTaints"]:
        assert spec["tolerations"] == [{"operator": "Exists"}]
    else:
        assert spec["tolerations"][:-1] == node_values["tolerations"]


def tolerated(tolerations: list[Obj], key: str, effect: str, value: str = "") -> bool:
    """Whether a taint is tolerated, by Kubernetes' matching rule (empty key with Exists: every key;
    empty effect: every effect; Equal, the default operator, also compares the value)."""
    for t in tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists":
            if t.get("key", "") in ("", key):
                return True
        elif t.get("key") == key and t.get("value", "") == value:
            return True
    return False


@pytest.mark.parametrize(
    ("values", "taint_key"),
    [
        pytest.param({}, "local.csi.ballast.dev/agent-not-ready", id="tolerate-all-default"),
        pytest.param(
            {"node": {"tolerateAllTaints": False}},
            "local.csi.ballast.dev/agent-not-ready",
            id="own-tolerations-local",
        ),
        pytest.param(
            {"backend": {"name": "aws"}, "node": {"tolerateAllTaints": False}},
            "ebs.csi.aws.com/agent-not-ready",
            id="own-tolerations-aws",
        ),
        pytest.param(
            {
                "backend": {"driverName": "disk.example.com"},
                "node": {
                    "tolerateAllTaints": False,
                    "tolerations": [{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
            "disk.example.com/agent-not-ready",
            id="own-tolerations-custom-driver-name",
        ),
    ],
)
def test_node_pod_lands_on_nodes_that_carry_its_startup_taint(values: Obj, taint_key: str) -> None:
    """The node plugin removes <driver>/agent-not-ready:NoExecute from its Node: if the DaemonSet did
    not tolerate that taint it would never run on such a node, and the taint would never go."""
    tolerations = pod_spec(only(render_values(values), "DaemonSet"))["tolerations"]
    assert tolerated(tolerations, taint_key, "NoExecute")
    if not values.get("node", {}).get("tolerateAllTaints", True):
        # Only the startup taint (and what the user listed): no other taint is tolerated on the way.
        assert not tolerated(tolerations, "node.example.com/other", "NoExecute")
        assert not tolerated(tolerations, "other.csi.example.com/agent-not-ready", "NoExecute")


def test_node_plugin_gets_a_token_and_its_node_name_for_the_startup_taint(set_id: str) -> None:
    """The node plugin removes <driver>/agent-not-ready from its Node: it needs a token (its role is
    checked in test_rbac) and the name of the Node it runs on."""
    spec = pod_spec(only(render(set_id), "DaemonSet"))
    assert spec["automountServiceAccountToken"] is True
    plugin = next(c for c in spec["containers"] if c["name"] == "ballast-plugin")
    env = {e["name"]: e for e in plugin["env"]}
    assert env["CSI_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_local_backend_mounts_the_data_dir_in_both_pods() -> None:
    objects = render("local-tuned")
    for workload in (only(objects, "Deployment"), only(objects, "DaemonSet")):
        assert volumes(workload)["data-dir"]["hostPath"] == {
            "path": "/srv/ballast",
            "type": "DirectoryOrCreate",
        }
        assert mounts(containers(workload)["ballast-plugin"])["data-dir"]["mountPath"] == "/srv/ballast"
