"""The optional external-snapshot-metadata sidecar: off by default; when on, the sidecar next to the
controller with a pinned release, its TLS secret, the Service and SnapshotMetadataService that point
clients at it, the RBAC it needs, and the driver's block settings."""

from __future__ import annotations

import base64

import pytest

from tests.chart.render import (
    VALUE_SETS,
    containers,
    flag_values,
    mounts,
    of_kind,
    only,
    render,
    resolved_args,
    run_helm,
    values_of,
    volumes,
)
from tests.chart.test_rbac import flatten, rule
from tests.e2e.tools import versions

SET = "snapshot-metadata"
# The release the test bed builds the sidecar from (scripts/k8s-versions.env): the chart pins the same.
RELEASE = versions()["CSI_SNAPSHOT_METADATA_VERSION"]
SIDECAR_NEEDS = {
    rule("cbt.storage.k8s.io", "snapshotmetadataservices", "get", "list", "watch"),
    rule("authentication.k8s.io", "tokenreviews", "create"),
    rule("authorization.k8s.io", "subjectaccessreviews", "create"),
    rule("snapshot.storage.k8s.io", "volumesnapshots", "get", "list"),
    rule("snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "list"),
    rule("snapshot.storage.k8s.io", "volumesnapshotclasses", "get", "list"),
}


@pytest.mark.parametrize("set_id", [s for s in VALUE_SETS if s != SET])
def test_off_by_default_renders_nothing_of_it(set_id: str) -> None:
    objects = render(set_id)
    assert "csi-snapshot-metadata" not in containers(only(objects, "Deployment"))
    assert not of_kind(objects, "SnapshotMetadataService")
    assert not [o for o in objects if "snapshot-metadata" in o["metadata"]["name"]]
    driver = resolved_args(containers(only(objects, "Deployment"))["ballast-plugin"])
    assert not [a for a in driver if a.startswith("--snapshot-metadata")]


def test_the_sidecar_runs_the_pinned_release_on_the_driver_socket_with_tls() -> None:
    deployment = only(render(SET), "Deployment")
    sidecar = containers(deployment)["csi-snapshot-metadata"]
    assert RELEASE == "v0.2.0", "the release the Go module proxy serves"
    assert sidecar["image"] == f"registry.k8s.io/sig-storage/csi-snapshot-metadata:{RELEASE}"
    args = resolved_args(sidecar)
    assert flag_values(args, "--csi-address") == ["/csi/csi.sock"]
    assert flag_values(args, "--port") == ["50051"]
    assert (flag_values(args, "--tls-cert"), flag_values(args, "--tls-key")) == (
        ["/tls/tls.crt"],
        ["/tls/tls.key"],
    )
    assert mounts(sidecar)["snapshot-metadata-tls"] == {
        "name": "snapshot-metadata-tls",
        "mountPath": "/tls",
        "readOnly": True,
    }
    assert volumes(deployment)["snapshot-metadata-tls"] == {
        "name": "snapshot-metadata-tls",
        "secret": {"secretName": "snapshot-metadata-tls"},
    }
    assert sidecar["resources"] == {"requests": {"cpu": "10m"}}
    assert not [a for a in args if a.startswith("--leader-election")], "every replica serves its own stream"


def test_the_driver_gets_the_block_settings() -> None:
    driver = resolved_args(containers(only(render(SET), "Deployment"))["ballast-plugin"])
    assert flag_values(driver, "--snapshot-metadata-block-type") == ["fixed"]
    assert flag_values(driver, "--snapshot-metadata-block-size") == ["512Ki"]


def test_service_and_snapshot_metadata_service_point_clients_at_the_sidecar() -> None:
    objects = render(SET)
    deployment = only(objects, "Deployment")
    service = next(
        s for s in of_kind(objects, "Service") if s["metadata"]["name"].endswith("-snapshot-metadata")
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    container_ports = {
        p["name"]: p["containerPort"] for p in containers(deployment)["csi-snapshot-metadata"]["ports"]
    }
    assert port["targetPort"] in container_ports and container_ports[port["targetPort"]] == 50051
    sms = only(objects, "SnapshotMetadataService")
    assert sms["metadata"]["name"] == "ebs.csi.aws.com", "the sidecar looks it up by the driver name"
    assert "namespace" not in sms["metadata"]
    assert sms["spec"] == {
        "address": f"{service['metadata']['name']}.kube-system:{port['port']}",
        "caCert": VALUE_SETS[SET]["snapshotMetadata"]["caCert"],
        "audience": "ebs.csi.aws.com",
    }
    assert base64.b64decode(sms["spec"]["caCert"]).startswith(b"-----BEGIN CERTIFICATE-----")


def test_rbac_grants_the_sidecar_exactly_what_it_needs() -> None:
    objects = render(SET)
    roles = {r["metadata"]["name"]: r for r in of_kind(objects, "ClusterRole")}
    (name,) = [n for n in roles if n.endswith("-snapshot-metadata")]
    assert flatten(roles[name]) == SIDECAR_NEEDS
    binding = next(b for b in of_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == name)
    assert (
        binding["subjects"][0]["name"]
        == only(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    )
    client = roles[name + "-client"]
    assert rule("", "serviceaccounts/token", "create") in flatten(client)
    assert not [b for b in of_kind(objects, "ClusterRoleBinding") if b["roleRef"]["name"] == name + "-client"]


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        pytest.param("tlsSecretName", "snapshotMetadata.tlsSecretName is required", id="no-tls-secret"),
        pytest.param("caCert", "snapshotMetadata.caCert is required", id="no-ca-cert"),
    ],
)
def test_enabling_it_without_tls_material_fails_with_the_value_to_set(missing: str, message: str) -> None:
    values = values_of(SET)
    values["snapshotMetadata"] = {**values["snapshotMetadata"], missing: ""}
    result = run_helm(["template", "ballast", "--kube-version", "1.31.0"], values)
    assert result.returncode != 0 and message in result.stderr


def test_the_schema_refuses_a_bad_block_type() -> None:
    values = values_of(SET)
    values["snapshotMetadata"] = {**values["snapshotMetadata"], "blockType": "huge"}
    result = run_helm(["template", "ballast", "--kube-version", "1.31.0"], values)
    assert result.returncode != 0 and "blockType" in result.stderr
