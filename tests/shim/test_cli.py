"""`ballast-migrate`: translate and plan on sample manifests, a fake API server, and the installed script."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from shim import cli, manifests
from shim.cli import INLINE_SOURCE_ANNOTATION, main
from tests.conftest import require_tool
from tests.shim.fake_kube_api import FakeKubeAPI

DATA = Path(__file__).parent / "testdata"
MANIFESTS = DATA / "manifests"
PVS = MANIFESTS / "pvs.yaml"
SCS = MANIFESTS / "storageclasses.yaml"
WORKLOADS = MANIFESTS / "workloads.yaml"
DRIVERS = MANIFESTS / "csidrivers.yaml"
CSI_PVS = MANIFESTS / "csi-pvs.yaml"
BLOCKED = DATA / "blocked.yaml"

ALL_DRIVERS = [
    "ebs.csi.aws.com",
    "pd.csi.storage.gke.io",
    "disk.csi.azure.com",
    "file.csi.azure.com",
    "cinder.csi.openstack.org",
    "csi.vsphere.vmware.com",
    "pxd.portworx.com",
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def json_stream(text: str) -> list[dict[str, Any]]:
    decoder, pos, docs = json.JSONDecoder(), 0, []
    while text[pos:].strip():
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)
    return docs


def by_name(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs}


# ---------------------------------------------------------------- translate


@pytest.mark.parametrize(
    ("name", "in_tree_key", "driver", "handle"),
    [
        pytest.param("pv-aws", "awsElasticBlockStore", "ebs.csi.aws.com", "vol-0a1b2c3d4e5f", id="aws-ebs"),
        pytest.param(
            "pv-gce",
            "gcePersistentDisk",
            "pd.csi.storage.gke.io",
            "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-gce-1",
            id="gce-pd",
        ),
        pytest.param(
            "pv-azure-disk",
            "azureDisk",
            "disk.csi.azure.com",
            "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Compute/disks/disk-az-1",
            id="azure-disk",
        ),
        pytest.param(
            "pv-azure-file",
            "azureFile",
            "file.csi.azure.com",
            "rg-files#acct1#share-1#pv-azure-file#team-a",
            id="azure-file",
        ),
        pytest.param(
            "pv-cinder",
            "cinder",
            "cinder.csi.openstack.org",
            "3f6c1d2e-0000-4000-8000-00000000c1d0",
            id="cinder",
        ),
        pytest.param(
            "pv-vsphere",
            "vsphereVolume",
            "csi.vsphere.vmware.com",
            "[datastore1] kubevols/pv-vsphere.vmdk",
            id="vsphere",
        ),
        pytest.param("pv-portworx", "portworxVolume", "pxd.portworx.com", "px-vol-42", id="portworx"),
    ],
)
def test_translate_pv_per_plugin(
    name: str, in_tree_key: str, driver: str, handle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["translate", str(PVS), "-o", "json"], capsys)
    assert (code, err) == (0, "")
    pv = by_name(json_stream(out))[name]
    assert pv["spec"]["csi"]["driver"] == driver
    assert pv["spec"]["csi"]["volumeHandle"] == handle
    assert in_tree_key not in pv["spec"]
    assert (pv["apiVersion"], pv["kind"]) == ("v1", "PersistentVolume")


def test_translate_keeps_non_migratable_pv_and_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["translate", str(PVS), "-o", "json"], capsys)
    docs = json_stream(out)
    assert code == 0
    assert [d["metadata"]["name"] for d in docs] == [
        "pv-aws",
        "pv-gce",
        "pv-azure-disk",
        "pv-azure-file",
        "pv-cinder",
        "pv-vsphere",
        "pv-portworx",
        "pv-hostpath",
    ]
    original = list(yaml.safe_load_all(PVS.read_text()))[-1]
    assert docs[-1] == original


@pytest.mark.parametrize(
    ("name", "provisioner", "parameters"),
    [
        pytest.param(
            "sc-aws", "ebs.csi.aws.com", {"type": "gp2", "csi.storage.k8s.io/fstype": "ext4"}, id="aws-ebs"
        ),
        pytest.param(
            "sc-gce", "pd.csi.storage.gke.io", {"type": "pd-ssd", "replication-type": "none"}, id="gce-pd"
        ),
        pytest.param(
            "sc-azure-disk",
            "disk.csi.azure.com",
            {"skuName": "Premium_LRS", "kind": "Managed"},
            id="azure-disk",
        ),
        pytest.param("sc-azure-file", "file.csi.azure.com", {"skuName": "Standard_LRS"}, id="azure-file"),
        pytest.param(
            "sc-cinder",
            "cinder.csi.openstack.org",
            {"availability": "nova", "csi.storage.k8s.io/fstype": "ext4"},
            id="cinder",
        ),
        pytest.param(
            "sc-vsphere",
            "csi.vsphere.vmware.com",
            {
                "diskformat-migrationparam": "thin",
                "datastore-migrationparam": "datastore1",
                "csimigration": "true",
            },
            id="vsphere",
        ),
        pytest.param("sc-portworx", "pxd.portworx.com", {"repl": "2"}, id="portworx"),
        pytest.param("sc-csi", "ebs.csi.aws.com", {"type": "gp3"}, id="already-csi"),
    ],
)
def test_translate_storage_class_per_plugin(
    name: str, provisioner: str, parameters: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["translate", str(SCS), "-o", "json"], capsys)
    sc = by_name(json_stream(out))[name]
    assert code == 0
    assert sc["provisioner"] == provisioner
    assert sc.get("parameters") == parameters


def test_translate_storage_class_zone_becomes_csi_topology(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["translate", str(SCS), "-o", "json"], capsys)
    sc = by_name(json_stream(out))["sc-aws"]
    assert sc["allowedTopologies"] == [
        {"matchLabelExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "values": ["us-east-1a"]}]}
    ]


INLINE = [
    pytest.param("Pod shop/web volume data", "ebs.csi.aws.com", "vol-0feedbeef", id="aws-ebs-pod"),
    pytest.param(
        "Deployment shop/reports volume archive",
        "pd.csi.storage.gke.io",
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/reports-archive",
        id="gce-pd-deployment",
    ),
    pytest.param(
        "StatefulSet shop/db volume shared",
        "file.csi.azure.com",
        "#acct2#share-2#shared#shop",
        id="azure-file-sts",
    ),
    pytest.param(
        "StatefulSet shop/db volume disk",
        "disk.csi.azure.com",
        "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Compute/disks/db-disk",
        id="azure-disk-sts",
    ),
    pytest.param(
        "DaemonSet ops/agent volume cache",
        "cinder.csi.openstack.org",
        "9a9a9a9a-0000-4000-8000-000000000001",
        id="cinder-daemonset",
    ),
    pytest.param("CronJob ops/backup volume target", "pxd.portworx.com", "px-backup", id="portworx-cronjob"),
    pytest.param(
        "CronJob ops/backup volume legacy",
        "csi.vsphere.vmware.com",
        "[datastore1] kubevols/backup.vmdk",
        id="vsphere-cronjob",
    ),
]


@pytest.mark.parametrize(("origin", "driver", "handle"), INLINE)
def test_translate_inline_volumes_emit_their_in_memory_pv(
    origin: str, driver: str, handle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["translate", str(WORKLOADS), "-o", "json"], capsys)
    docs = json_stream(out)
    pvs = {
        d["metadata"]["annotations"][INLINE_SOURCE_ANNOTATION]: d
        for d in docs
        if d["kind"] == "PersistentVolume"
    }
    assert code == 0
    assert pvs[origin]["spec"]["csi"]["driver"] == driver
    assert pvs[origin]["spec"]["csi"]["volumeHandle"] == handle
    assert pvs[origin]["spec"]["volumeMode"] == "Filesystem"


def test_translate_workloads_pass_through_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["translate", str(WORKLOADS), "-o", "json"], capsys)
    originals = list(yaml.safe_load_all(WORKLOADS.read_text()))
    workloads = [d for d in json_stream(out) if d["kind"] != "PersistentVolume"]
    assert code == 0
    assert workloads == originals
    assert [d["kind"] for d in json_stream(out)] == [
        "Pod",
        "PersistentVolume",
        "Deployment",
        "PersistentVolume",
        "StatefulSet",
        "PersistentVolume",
        "PersistentVolume",
        "DaemonSet",
        "PersistentVolume",
        "CronJob",
        "PersistentVolume",
        "PersistentVolume",
        "ConfigMap",
        "Service",
    ]


def test_translate_stdin_defaults_to_yaml(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(PVS.read_text()))
    code, out, _ = run(["translate"], capsys)
    docs = list(yaml.safe_load_all(out))
    assert code == 0
    assert out.startswith("---\n")
    assert by_name(docs)["pv-cinder"]["spec"]["csi"]["driver"] == "cinder.csi.openstack.org"
    assert by_name(docs)["pv-aws"]["spec"]["csi"]["volumeAttributes"] == {"partition": "0"}


@pytest.mark.parametrize(
    ("list_kind", "items_typed"),
    [
        pytest.param("List", True, id="kubectl-list"),
        pytest.param("PersistentVolumeList", False, id="api-list-untyped-items"),
    ],
)
def test_translate_json_list_from_stdin(
    list_kind: str, items_typed: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = [
        d for d in yaml.safe_load_all(PVS.read_text()) if d["metadata"]["name"] in ("pv-aws", "pv-hostpath")
    ]
    if not items_typed:
        for item in items:
            del item["apiVersion"], item["kind"]
    listing = {"apiVersion": "v1", "kind": list_kind, "items": items}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(listing)))
    code, out, _ = run(["translate", "-", "-o", "json"], capsys)
    (result,) = json_stream(out)
    assert code == 0
    assert result["kind"] == list_kind
    assert result["items"][0]["spec"]["csi"]["volumeHandle"] == "vol-0a1b2c3d4e5f"
    assert "hostPath" in result["items"][1]["spec"]
    assert result["items"][1]["kind"] == "PersistentVolume"


def test_translate_reverse(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["translate", "--reverse", str(CSI_PVS), str(SCS), "-o", "json"], capsys)
    docs = by_name(json_stream(out))
    assert code == 0
    assert docs["csi-aws"]["spec"]["awsElasticBlockStore"]["volumeID"] == "vol-0a1b2c3d4e5f"
    assert "csi" not in docs["csi-aws"]["spec"]
    assert docs["csi-portworx"]["spec"]["portworxVolume"]["volumeID"] == "px-vol-42"
    assert docs["csi-other"]["spec"]["csi"]["driver"] == "ballast.example.com"
    assert docs["sc-aws"]["provisioner"] == "kubernetes.io/aws-ebs"
    assert "StorageClass sc-csi" in err
    assert "printed unchanged" in err


def test_translate_round_trip_restores_in_tree_sources(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, forward, _ = run(["translate", str(PVS)], capsys)
    csi_file = tmp_path / "csi.yaml"
    csi_file.write_text(forward)
    code, back, _ = run(["translate", "--reverse", str(csi_file), "-o", "json"], capsys)
    docs = by_name(json_stream(back))
    assert code == 0
    assert docs["pv-gce"]["spec"]["gcePersistentDisk"]["pdName"] == "disk-gce-1"
    assert docs["pv-cinder"]["spec"]["cinder"]["volumeID"] == "3f6c1d2e-0000-4000-8000-00000000c1d0"
    assert docs["pv-azure-file"]["spec"]["azureFile"]["shareName"] == "share-1"


def test_translate_failure_exits_1_and_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["translate", str(BLOCKED)], capsys)
    assert code == 1
    assert out == ""
    assert f"{BLOCKED}, document 2 (StorageClass sc-gce-conflict): parameters: cannot translate" in err
    assert (
        f"{BLOCKED}, document 3 (PersistentVolume pv-azure-shared): spec.azureDisk: cannot translate" in err
    )
    assert "Traceback" not in err


def test_translate_json_stream_and_timestamps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "pvs.json"
    first = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "a", "creationTimestamp": "2026-01-02T03:04:05Z"},
        "spec": {"cinder": {"volumeID": "c-1"}},
    }
    second = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}
    stream.write_text(json.dumps(first) + "\n" + json.dumps(second, indent=1))
    as_yaml = tmp_path / "pv.yaml"
    as_yaml.write_text(yaml.safe_dump(first).replace("'2026-01-02T03:04:05Z'", "2026-01-02T03:04:05Z"))
    code, out, _ = run(["translate", str(stream), str(as_yaml), "-o", "json"], capsys)
    docs = json_stream(out)
    assert code == 0
    assert [d["kind"] for d in docs] == ["PersistentVolume", "ConfigMap", "PersistentVolume"]
    assert docs[0]["spec"]["csi"]["volumeHandle"] == "c-1"
    assert docs[2]["metadata"]["creationTimestamp"] == "2026-01-02T03:04:05Z"  # not a datetime


def test_directories_are_read_recursively_in_sorted_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pvs = list(yaml.safe_load_all(PVS.read_text()))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.yml").write_text(yaml.safe_dump(pvs[0]))
    (tmp_path / "a.json").write_text(json.dumps(pvs[4]))
    (tmp_path / "notes.md").write_text("not: [a manifest")
    code, out, _ = run(["translate", str(tmp_path), "-o", "json"], capsys)
    assert code == 0
    assert [d["metadata"]["name"] for d in json_stream(out)] == ["pv-cinder", "pv-aws"]


# ---------------------------------------------------------------- bad input


BAD_INPUT = [
    pytest.param(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: name: a\n",
        ["bad.yaml, document 2: invalid YAML at line 6, column 15: mapping values are not allowed here"],
        id="invalid-yaml",
    ),
    pytest.param(
        '{"apiVersion": "v1", "kind": "Pod",}', ["bad.yaml, document 1: invalid JSON"], id="invalid-json"
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolum\nmetadata: {name: x}\n",
        ["document 1 (PersistentVolum x): kind: unknown kind 'PersistentVolum' for apiVersion 'v1'"],
        id="unknown-kind",
    ),
    pytest.param(
        "apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: x}\n",
        ["kind: unknown kind 'Deploymnet' for apiVersion 'apps/v1'"],
        id="unknown-kind-apps",
    ),
    pytest.param(
        "apiVersion: v1\nmetadata: {name: x}\n",
        ["document 1", "kind: required field is missing"],
        id="no-kind",
    ),
    pytest.param(
        "kind: Pod\nmetadata: {name: x}\n", ["apiVersion: required field is missing"], id="no-api-version"
    ),
    pytest.param(
        "- a\n- b\n", ["document 1: expected a Kubernetes object (a mapping), got list"], id="not-a-mapping"
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv-1}\n"
        "spec:\n  awsElasticBlockStore: {fsType: ext4}\n",
        ["(PersistentVolume pv-1): spec.awsElasticBlockStore.volumeID: required field is missing"],
        id="pv-missing-volume-id",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv-1}\n",
        ["(PersistentVolume pv-1): spec: must be a mapping, got null"],
        id="pv-missing-spec",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nspec: {cinder: {volumeID: v}}\n",
        ["(PersistentVolume): metadata.name: required field is missing"],
        id="pv-missing-name",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p}\n"
        "spec: {gcePersistentDisk: {pdName: d, partition: '1'}}\n",
        ["spec.gcePersistentDisk.partition: must be integer, got string '1'"],
        id="pv-partition-type",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p}\n"
        "spec: {cinder: {volumeID: a}, portworxVolume: {volumeID: b}}\n",
        ["spec: more than one volume source set: cinder, portworxVolume"],
        id="pv-two-sources",
    ),
    pytest.param(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\n"
        "spec: {volumes: [{name: v, emptyDir: {}}, {name: w, gcePersistentDisk: {readOnly: true}}]}\n",
        ["(Pod ns/p): spec.volumes[1].gcePersistentDisk.pdName: required field is missing"],
        id="pod-volume-missing-pd-name",
    ),
    pytest.param(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
        "spec: {template: {spec: {volumes: [{cinder: {volumeID: x}}]}}}\n",
        ["(Deployment d): spec.template.spec.volumes[0].name: required field is missing"],
        id="deployment-volume-missing-name",
    ),
    pytest.param(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec: {jobTemplate: {}}\n",
        ["(CronJob c): spec.jobTemplate.spec: must be a mapping, got null"],
        id="cronjob-missing-template",
    ),
    pytest.param(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: s}\nparameters: {type: gp2}\n",
        ["(StorageClass s): provisioner: required field is missing"],
        id="sc-missing-provisioner",
    ),
    pytest.param(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: s}\n"
        "provisioner: kubernetes.io/aws-ebs\nparameters: {iopsPerGB: 10}\n",
        ["(StorageClass s): parameters.iopsPerGB: must be a string (quote it), got integer 10"],
        id="sc-parameter-not-string",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p}\n"
        "spec: {csi: {driver: ebs.csi.aws.com, volumeHandle: vol-1, volumeAttributes: {partition: 1}}}\n",
        ["(PersistentVolume p): spec.csi.volumeAttributes.partition: must be a string, got integer 1"],
        id="pv-csi-attribute-not-string",
    ),
    pytest.param(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- apiVersion: v1\n  kind: PersistentVolume\n  metadata: {name: a}\n  spec: {cinder: {}}\n",
        ["document 1, items[0] (PersistentVolume a): spec.cinder.volumeID: required field is missing"],
        id="list-item",
    ),
    pytest.param(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p, labels: "
        + "{a: " * 150
        + "b"
        + "}" * 151,
        ["document 1: nests deeper than 100 levels"],
        id="nested-deeper-than-kubernetes-objects",
    ),
    pytest.param(
        '{"apiVersion": "v1", "kind": "PersistentVolume", "x": ' + "[" * 5000 + "]" * 5000 + "}",
        ["document 1: nests too deep to read"],
        id="nested-past-the-parser",
    ),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_INPUT)
@pytest.mark.parametrize(
    "command", [pytest.param("translate", id="translate"), pytest.param("plan", id="plan")]
)
def test_bad_input_exits_2_naming_document_and_field(
    command: str, text: str, fragments: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, out, err = run([command, str(bad)], capsys)
    assert code == 2
    assert out == ""
    for fragment in fragments:
        assert fragment in err
    assert err.startswith(f"ballast-migrate: {tmp_path}/bad.yaml, document")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        pytest.param(["plan", str(PVS), "--feature-gates", "Bogus=true"], "'Bogus'", id="unknown-gate"),
        pytest.param(
            ["plan", str(PVS), "--feature-gates", "CSIMigration=maybe"], "'maybe'", id="bad-gate-value"
        ),
        pytest.param(["plan"], "give manifest paths", id="plan-without-input"),
        pytest.param(["plan", str(PVS), "--kubeconfig", "kc"], "not both", id="plan-paths-and-kubeconfig"),
        pytest.param(
            ["translate", "/nonexistent/x.yaml"], "/nonexistent/x.yaml: no such file", id="missing-file"
        ),
        pytest.param(["plan", str(PVS), "-o", "xml"], "invalid choice", id="bad-output"),
        pytest.param(["migrate"], "invalid choice", id="unknown-command"),
        pytest.param([], "COMMAND", id="no-command"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert fragment in err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--help"], capsys)
    assert code == 0
    assert "--feature-gates" in out


# ---------------------------------------------------------------- plan


AWS_GCE_GATES = "CSIMigration=true,CSIMigrationAWS=true,CSIMigrationGCE=true,InTreePluginGCEUnregister=true"


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out, err = run(["plan", *argv, "-o", "json"], capsys)
    assert "Traceback" not in err
    return code, json.loads(out)


def test_plan_json_covers_all_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = plan_json([str(MANIFESTS), "--feature-gates", AWS_GCE_GATES], capsys)
    items = report["items"]
    assert code == 0
    assert report["blocked"] == 0
    assert report["featureGates"] == AWS_GCE_GATES
    assert report["installedDrivers"] == sorted(ALL_DRIVERS)
    assert {i["csiDriver"] for i in items} == set(ALL_DRIVERS)
    assert {(i["kind"], i["plugin"]) for i in items if i["kind"] in ("PersistentVolume", "StorageClass")} == {
        (kind, f"kubernetes.io/{p}")
        for kind in ("PersistentVolume", "StorageClass")
        for p in (
            "aws-ebs",
            "gce-pd",
            "azure-disk",
            "azure-file",
            "cinder",
            "vsphere-volume",
            "portworx-volume",
        )
    }
    assert len([i for i in items if i["volume"]]) == 7  # the inline volumes of workloads.yaml
    states = {i["plugin"]: i["migration"] for i in items}
    assert states["kubernetes.io/aws-ebs"] == "on"
    assert states["kubernetes.io/gce-pd"] == "complete"
    assert states["kubernetes.io/cinder"] == "off"
    assert all(i["blockers"] == [] for i in items)


@pytest.mark.parametrize(
    ("kind", "name", "volume", "becomes"),
    [
        pytest.param(
            "PersistentVolume",
            "pv-aws",
            "",
            {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0a1b2c3d4e5f"},
            id="pv",
        ),
        pytest.param(
            "StorageClass",
            "sc-portworx",
            "",
            {"provisioner": "pxd.portworx.com", "parameters": {"repl": "2"}},
            id="storageclass",
        ),
        pytest.param(
            "CronJob",
            "ops/backup",
            "legacy",
            {"driver": "csi.vsphere.vmware.com", "volumeHandle": "[datastore1] kubevols/backup.vmdk"},
            id="inline",
        ),
    ],
)
def test_plan_json_says_what_each_object_becomes(
    kind: str, name: str, volume: str, becomes: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _, report = plan_json([str(MANIFESTS)], capsys)
    (item,) = [i for i in report["items"] if (i["kind"], i["name"], i["volume"]) == (kind, name, volume)]
    assert {k: item["becomes"][k] for k in becomes} == becomes
    assert item["source"].startswith(str(MANIFESTS))


DRIVER_FLAGS = [arg for d in ALL_DRIVERS for arg in ("--csi-driver", d)]


@pytest.mark.parametrize(
    ("argv", "expected_code", "expected_blockers"),
    [
        pytest.param([str(MANIFESTS)], 0, set(), id="all-drivers-installed"),
        pytest.param([str(PVS), *DRIVER_FLAGS], 0, set(), id="drivers-from-flags"),
        pytest.param(
            [str(PVS)],
            1,
            {f"CSI driver {d} is not installed (no CSIDriver object)" for d in ALL_DRIVERS},
            id="no-drivers",
        ),
        pytest.param(
            [str(PVS), str(DRIVERS), "--feature-gates", "InTreePluginAWSUnregister=true"],
            1,
            {"InTreePluginAWSUnregister is on but migration is off: nothing would serve this volume"},
            id="unregistered-without-migration",
        ),
        pytest.param(
            [
                str(PVS),
                str(DRIVERS),
                "--feature-gates",
                "CSIMigration=true,CSIMigrationAWS=true,InTreePluginAWSUnregister=true",
            ],
            0,
            set(),
            id="migration-complete",
        ),
        pytest.param(
            [str(BLOCKED), str(DRIVERS)],
            1,
            {
                "parameter 'legacyTuning' is not accepted by ebs.csi.aws.com",
                "translation fails: cannot simultaneously set allowed topologies and zone/zones parameters",
                "translation fails: kind(Shared) is not supported in csi migration",
            },
            id="driver-rejects-parameter-and-translation-fails",
        ),
    ],
)
def test_plan_exit_codes_and_blockers(
    argv: list[str], expected_code: int, expected_blockers: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = plan_json(argv, capsys)
    blockers = {b for i in report["items"] if i["blockers"] for b in i["blockers"]}
    assert code == expected_code
    assert blockers == expected_blockers
    assert report["blocked"] == len([i for i in report["items"] if i["blockers"]])


def test_plan_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["plan", str(PVS), str(BLOCKED), str(DRIVERS), "--feature-gates", AWS_GCE_GATES], capsys
    )
    lines = out.splitlines()
    assert code == 1
    assert lines[0].split() == ["OBJECT", "PLUGIN", "MIGRATION", "BECOMES", "BLOCKED", "BY"]
    aws = next(line for line in lines if line.startswith("PersistentVolume pv-aws "))
    assert aws.split() == [
        "PersistentVolume",
        "pv-aws",
        "kubernetes.io/aws-ebs",
        "on",
        "ebs.csi.aws.com",
        "vol-0a1b2c3d4e5f",
        "-",
    ]
    assert any("StorageClass sc-aws-extra" in line and "'legacyTuning'" in line for line in lines)
    assert lines[-1] == "10 using in-tree plugins, 3 blocked"


def test_plan_yaml_matches_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, as_json = plan_json([str(MANIFESTS), "--feature-gates", AWS_GCE_GATES], capsys)
    code, out, _ = run(["plan", str(MANIFESTS), "--feature-gates", AWS_GCE_GATES, "-o", "yaml"], capsys)
    assert code == 0
    assert yaml.safe_load(out) == as_json


def test_plan_without_in_tree_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n---\n")
    code, out, _ = run(["plan", str(other)], capsys)
    assert code == 0
    assert out == "no PersistentVolume, StorageClass or pod volume uses an in-tree plugin\n"


def test_gates_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["gates", "--feature-gates", "CSIMigration=true", "-o", "json"], capsys)
    records = {r["name"]: r for r in json.loads(out)}
    assert code == 0
    assert len(records) == 15
    assert records["CSIMigration"]["value"] is True
    assert records["CSIMigrationAWS"]["value"] is False
    assert records["CSIMigrationAWS"]["kubernetesLocked"] is True
    assert records["InTreePluginAWSUnregister"]["kubernetesLocked"] is False


# ---------------------------------------------------------------- live cluster (fake API server)


LIVE_GATES = "CSIMigration=true,CSIMigrationAWS=true"


def test_plan_live_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeKubeAPI() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code, report = plan_json(["--kubeconfig", str(kubeconfig), "--feature-gates", LIVE_GATES], capsys)
    rows = {(i["kind"], i["name"], i["volume"]): i for i in report["items"]}
    assert code == 1
    assert set(rows) == {
        ("PersistentVolume", "pvc-4f1d6a2e-aws", ""),
        ("PersistentVolume", "pvc-77aa01cc-gce", ""),
        ("StorageClass", "gp2", ""),
        ("StorageClass", "standard", ""),
        ("Pod", "ops/legacy-cache-7d9f", "cache"),
    }
    assert (
        rows[("PersistentVolume", "pvc-4f1d6a2e-aws", "")]["becomes"]["volumeHandle"]
        == "vol-0123456789abcdef0"
    )
    assert rows[("PersistentVolume", "pvc-4f1d6a2e-aws", "")]["migration"] == "on"
    assert (
        rows[("PersistentVolume", "pvc-4f1d6a2e-aws", "")]["source"]
        == "cluster persistentvolumes, page 1, items[0]"
    )
    assert rows[("StorageClass", "standard", "")]["blockers"] == [
        "CSI driver pd.csi.storage.gke.io is not installed (no CSIDriver object)"
    ]
    assert report["installedDrivers"] == ["ebs.csi.aws.com"]
    assert {r.path for r in api.requests} == {
        "/api/v1/persistentvolumes",
        "/apis/storage.k8s.io/v1/storageclasses",
        "/api/v1/pods",
        "/apis/storage.k8s.io/v1/csidrivers",
    }
    assert all(r.authorization == "Bearer test-token" for r in api.requests)


def test_plan_live_cluster_follows_continue_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifests, "PAGE_SIZE", 1)
    with FakeKubeAPI() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code, report = plan_json(
            ["--kubeconfig", str(kubeconfig), "--csi-driver", "pd.csi.storage.gke.io"], capsys
        )
    pv_requests = [r.query for r in api.requests if r.path == "/api/v1/persistentvolumes"]
    assert code == 0
    assert pv_requests == [{"limit": "1"}, {"limit": "1", "continue": "1"}, {"limit": "1", "continue": "2"}]
    assert len(report["items"]) == 5


def test_plan_live_cluster_api_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeKubeAPI(failures={"/api/v1/pods": (403, "Forbidden")}) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code, out, err = run(["plan", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 2
    assert out == ""
    assert err == "ballast-migrate: cluster pods: listing failed: 403 Forbidden\n"


def test_plan_unreachable_cluster_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = FakeKubeAPI()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api._server.server_close()
    kubeconfig.write_text(kubeconfig.read_text().replace(api.url, f"http://127.0.0.1:{port}"))
    code, out, err = run(["plan", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("ballast-migrate: cluster persistentvolumes: cannot reach the cluster")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(None, "cannot use kubeconfig", id="missing-file"),
        pytest.param(
            "apiVersion: v1\nkind: Config\ncontexts: []\n", "cannot use kubeconfig", id="no-context"
        ),
    ],
)
def test_plan_bad_kubeconfig_exits_2(
    content: str | None, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    code, _, err = run(["plan", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 2
    assert fragment in err


# ---------------------------------------------------------------- the installed console script


def installed_script() -> str:
    script = Path(sys.executable).with_name("ballast-migrate")
    return str(script) if script.exists() else require_tool("ballast-migrate")


def test_script_translates_stdin() -> None:
    result = subprocess.run(
        [installed_script(), "translate", "-o", "json"],
        input=PVS.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert by_name(json_stream(result.stdout))["pv-portworx"]["spec"]["csi"]["driver"] == "pxd.portworx.com"


def test_script_plan_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: x}\nspec: [\n")
    blocked = subprocess.run(
        [installed_script(), "plan", str(PVS)], capture_output=True, text=True, timeout=60, check=False
    )
    broken = subprocess.run(
        [installed_script(), "plan", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert blocked.returncode == 1
    assert "not installed" in blocked.stdout
    assert broken.returncode == 2
    assert broken.stderr.startswith(f"ballast-migrate: {bad}, document 1: invalid YAML")
    assert "Traceback" not in broken.stderr


def test_cli_module_exposes_exit_codes() -> None:
    assert (cli.EXIT_OK, cli.EXIT_BLOCKED, cli.EXIT_USAGE) == (0, 1, 2)


# ---------------------------------------------------------------- -f / --filename (like kubectl)


@pytest.mark.parametrize("flag", ["-f", "--filename"])
def test_translate_and_plan_take_filename_flags(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["translate", flag, str(PVS), flag, str(SCS), "-o", "json"], capsys)
    assert (code, err) == (0, "")
    names = [d["metadata"]["name"] for d in json_stream(out)]
    assert names[0] == "pv-aws" and "sc-aws" in names, "both files, in order"
    code, report = plan_json([flag, str(PVS), "--csi-driver", "ebs.csi.aws.com"], capsys)
    assert code == 1  # drivers other than EBS are not installed
    assert {i["name"] for i in report["items"]} >= {"pv-aws", "pv-gce"}


def test_filename_and_paths_combine_and_kubeconfig_still_excludes_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["translate", str(PVS), "-f", str(SCS), "-o", "json"], capsys)
    assert code == 0 and len(json_stream(out)) > len(list(yaml.safe_load_all(PVS.read_text())))
    code, _, err = run(["plan", "-f", str(PVS), "--kubeconfig", "kc"], capsys)
    assert code == 2 and "not both" in err
