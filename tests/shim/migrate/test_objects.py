"""What a conversion records, creates and checks (shim.migrate.objects), per plugin."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from shim import Translator
from shim.migrate import objects as o
from tests.shim.migrate.samples import PLUGINS, Obj, sample_pv

CLAIM = ("team-a", "data", "0b7c4a0e-5c1a-4c1e-9d55-1f1f6f6c0001")
KEPT_SPEC = ("capacity", "accessModes", "claimRef", "volumeMode", "mountOptions", "storageClassName")


def live(pv: Obj, uid: str = "1111", phase: str = "Bound") -> Obj:
    """`pv` as the API server returns it: server fields, finalizers, status."""
    pv = json.loads(json.dumps(pv))
    pv["metadata"].update(
        uid=uid,
        resourceVersion="42",
        creationTimestamp="2026-01-01T00:00:00Z",
        finalizers=["kubernetes.io/pv-protection"],
        managedFields=[{"manager": "kube-controller-manager"}],
    )
    pv["metadata"].setdefault("annotations", {})["pv.kubernetes.io/bound-by-controller"] = "yes"
    pv["status"] = {"phase": phase}
    return pv


@pytest.fixture(params=sorted(PLUGINS))
def plugin(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def test_record_keeps_the_object_and_drops_server_state(plugin: str) -> None:
    pv = live(sample_pv(plugin, claim=CLAIM))
    pv["metadata"]["annotations"][o.ANN_JOURNAL_ID] = "j-1"
    record = o.record_of(pv)
    assert set(record) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(record["metadata"]) <= {"name", "labels", "annotations"}
    assert o.ANN_JOURNAL_ID not in record["metadata"]["annotations"]
    assert record["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
    assert record["spec"] == pv["spec"] and record["spec"] is not pv["spec"]


def test_convert_target_translates_the_source_and_keeps_the_rest(plugin: str) -> None:
    source_key, _, driver = PLUGINS[plugin]
    record = o.record_of(live(sample_pv(plugin, claim=CLAIM)))
    target = o.convert_target(Translator(), record, "j-1", "ctrl-a_0.1.0")
    spec = target["spec"]
    assert source_key not in spec and spec["csi"]["driver"] == driver
    expected = Translator().translate_in_tree_pv_to_csi(record)["spec"]
    assert spec["csi"] == expected["csi"]
    assert spec.get("nodeAffinity") == expected.get("nodeAffinity")
    assert {k: spec.get(k) for k in KEPT_SPEC} == {k: record["spec"].get(k) for k in KEPT_SPEC}
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert target["metadata"]["name"] == record["metadata"]["name"]
    assert target["metadata"].get("labels") == record["metadata"].get("labels")
    notes = target["metadata"]["annotations"]
    assert json.loads(notes.pop(o.ANN_ORIGINAL)) == record
    assert notes.pop(o.ANN_CONVERTED_BY) == "ctrl-a_0.1.0" and notes.pop(o.ANN_JOURNAL_ID) == "j-1"
    assert notes == record["metadata"]["annotations"]


def test_gce_access_modes_are_kept_not_narrowed() -> None:
    """Kubernetes narrows [RWO, ROX] to [RWO] in memory; the stored PV must still match its claim."""
    record = o.record_of(live(sample_pv("gce-pd", claim=CLAIM)))
    assert Translator().translate_in_tree_pv_to_csi(record)["spec"]["accessModes"] == ["ReadWriteOnce"]
    target = o.convert_target(Translator(), record, "j", "me")
    assert target["spec"]["accessModes"] == ["ReadWriteOnce", "ReadOnlyMany"]


def converted(plugin: str) -> tuple[Obj, Obj]:
    """(record, the live converted CSI PV) for `plugin`."""
    record = o.record_of(live(sample_pv(plugin, claim=CLAIM)))
    target = o.convert_target(Translator(), record, "j-1", "me")
    target["metadata"]["annotations"].pop(o.ANN_JOURNAL_ID)
    return record, live(target, uid="2222")


def test_rollback_target_is_the_record(plugin: str) -> None:
    record, current = converted(plugin)
    assert o.recorded_original(current) == record
    target = o.rollback_target(record, current, "j-2")
    assert target["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert target["metadata"]["annotations"].pop(o.ANN_JOURNAL_ID) == "j-2"
    target["spec"]["persistentVolumeReclaimPolicy"] = record["spec"]["persistentVolumeReclaimPolicy"]
    assert target == record


def test_rollback_keeps_the_live_binding_and_a_grown_disk() -> None:
    record, current = converted("aws-ebs")
    current["spec"]["capacity"] = {"storage": "4Gi"}
    current["spec"]["claimRef"]["uid"] = "rebound"
    target = o.rollback_target(record, current, "j")
    assert target["spec"]["capacity"] == {"storage": "4Gi"}
    assert target["spec"]["claimRef"]["uid"] == "rebound"
    current["spec"]["capacity"] = {"storage": "1Gi"}  # smaller than recorded: the record wins
    assert o.rollback_target(record, current, "j")["spec"]["capacity"] == {"storage": "2Gi"}


def test_a_converted_pv_names_its_recorded_disk(plugin: str) -> None:
    record, current = converted(plugin)
    assert o.disk_difference(Translator(), current, record) is None


@pytest.mark.parametrize(
    ("plugin", "handle"),
    [
        pytest.param("aws-ebs", "vol-0ffffffffffffffff", id="aws-ebs"),
        pytest.param("gce-pd", "projects/UNSPECIFIED/zones/us-central1-a/disks/other", id="gce-pd"),
        pytest.param(
            "azure-disk", "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/disks/x", id="azure"
        ),
        pytest.param("cinder", "00000000-0000-4000-8000-000000000000", id="cinder"),
        pytest.param("vsphere-volume", "[datastore2] other.vmdk", id="vsphere-lossy"),
        pytest.param("portworx", "999", id="portworx"),
    ],
)
def test_a_changed_handle_is_named(plugin: str, handle: str) -> None:
    record, current = converted(plugin)
    current["spec"]["csi"]["volumeHandle"] = handle
    difference = o.disk_difference(Translator(), current, record)
    assert difference is not None and handle.rsplit("/", 1)[-1] in difference


def test_ebs_handle_without_zone_prefix_and_repaired_gce_project_name_the_same_disk() -> None:
    record, current = converted("aws-ebs")
    assert record["spec"]["awsElasticBlockStore"]["volumeID"].startswith("aws://")
    assert current["spec"]["csi"]["volumeHandle"] == "vol-0a1b2c3d4e5f60718"
    assert o.disk_difference(Translator(), current, record) is None
    record, current = converted("gce-pd")
    current["spec"]["csi"]["volumeHandle"] = "projects/my-project/zones/us-central1-a/disks/disk-gce-1"
    assert o.disk_difference(Translator(), current, record) is None
    current["spec"]["csi"]["volumeAttributes"]["partition"] = "2"
    assert "partition 2" in (o.disk_difference(Translator(), current, record) or "")


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param("{not json", "not JSON", id="not-json"),
        pytest.param('{"spec": 1}', "not a PersistentVolume record", id="no-spec"),
        pytest.param(
            '{"metadata": {"name": "other"}, "spec": {"awsElasticBlockStore": {}}}',
            "records PV",
            id="other-pv",
        ),
        pytest.param(
            '{"metadata": {"name": "aws-ebs"}, "spec": {"rbd": {"image": "x"}}}', "does not migrate", id="rbd"
        ),
    ],
)
def test_unusable_records_are_refused(value: str, error: str) -> None:
    _, current = converted("aws-ebs")
    current["metadata"]["annotations"][o.ANN_ORIGINAL] = value
    with pytest.raises(o.RecordError, match=error) as raised:
        o.recorded_original(current)
    assert isinstance(raised.value, o.UnknownPluginError) == (error == "does not migrate")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", Decimal(10 * 2**30)),
        ("1G", Decimal(10**9)),
        ("500M", Decimal(5 * 10**8)),
        ("1e3", Decimal(1000)),
        ("1.5Ki", Decimal(1536)),
        ("100m", Decimal("0.1")),
        ("7", Decimal(7)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert o.quantity(text) == value


def test_a_malformed_quantity_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        o.quantity("ten gigs")


def with_field(record: Obj, path: str, value: object) -> Obj:
    """A copy of `record` with the field at dotted `path` set to `value`."""
    changed: Obj = json.loads(json.dumps(record))
    *parents, last = path.split(".")
    holder = changed
    for key in parents:
        holder = holder.setdefault(key, {})
    holder[last] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        pytest.param("metadata", "x", "metadata is not an object", id="metadata-string"),
        pytest.param("metadata.name", 5, "metadata.name is not a string", id="name-number"),
        pytest.param("metadata.annotations", ["a"], "metadata.annotations is not", id="annotations-list"),
        pytest.param("metadata.annotations", {"a": 1}, "metadata.annotations is not", id="annotation-number"),
        pytest.param("metadata.labels", {"a": None}, "metadata.labels is not", id="label-null"),
        pytest.param("metadata.ownerReferences", "x", "metadata.ownerReferences is not", id="owners-string"),
        pytest.param("spec.capacity", "big", "spec.capacity is not", id="capacity-string"),
        pytest.param("spec.capacity", {"storage": 5}, "spec.capacity is not", id="capacity-number"),
        pytest.param(
            "spec.capacity",
            {"storage": "big"},
            "spec.capacity.storage: not a quantity: 'big'",
            id="capacity-word",
        ),
        pytest.param(
            "spec.capacity",
            {"storage": "NaN"},
            "spec.capacity.storage: not a quantity: 'NaN'",
            id="capacity-nan",
        ),
        pytest.param("spec.claimRef", "x", "spec.claimRef is not an object", id="claim-ref-string"),
        pytest.param("kind", "Pod", "kind is not PersistentVolume", id="other-kind"),
    ],
)
def test_wrongly_typed_records_are_refused(path: str, value: object, error: str) -> None:
    """A record the rollback would crash on (or the API server would refuse to create) is a RecordError,
    which the engine reports as a bad-record skip."""
    record, current = converted("aws-ebs")
    current["metadata"]["annotations"][o.ANN_ORIGINAL] = json.dumps(with_field(record, path, value))
    with pytest.raises(o.RecordError, match=re.escape(error)):
        o.recorded_original(current)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-inf", "Inf"])
def test_a_quantity_is_a_finite_number(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        o.quantity(text)
