"""Every reference vector (derived from Kubernetes' own tests) under the spec's strict comparison,
plus the guarantee that the public API never mutates its arguments."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shim import TranslationError, Translator, topology
from shim.plugins import aws_ebs, azure_disk, azure_file, gce_pd

# Derived from Kubernetes' csi-translation-lib tests, plus inputs the differential test rarely generates
# answered by k8s-translate (their `source` says which); kept in the repository, so a checkout that lost
# them fails at import instead of running no case.
VECTORS_PATH = Path(__file__).parent / "testdata" / "translation-vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text())
TRANSLATOR = Translator()
REGION_PARSERS: dict[str | None, topology.RegionParser | None] = {
    "gce": gce_pd.region_from_zones,
    "aws": aws_ebs.region_from_zones,
    None: None,
}


def canon(value: Any) -> Any:
    """Spec 1.4 strict form: recursively drop entries whose canonical value is None, {} or []."""
    if isinstance(value, dict):
        out = {k: canon(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [canon(v) for v in value]
    return value


def _helper_topology_csi_to_intree(i: dict[str, Any]) -> Any:
    pv = i["pv"]
    topology.translate_topology_csi_to_in_tree(pv, i["csiTopologyKey"], REGION_PARSERS[i.get("regionParser")])
    return pv


def _helper_topology_intree_to_csi(i: dict[str, Any]) -> Any:
    topology.translate_topology_in_tree_to_csi(i["pv"], i["csiTopologyKey"])
    return i["pv"]


def _helper_add_topology(i: dict[str, Any]) -> Any:
    topology.add_topology(i["pv"], i["topologyKey"], i["zones"])
    return i["pv"]


def _helper_replace_topology(i: dict[str, Any]) -> Any:
    topology.replace_topology(i["pv"], i["oldKey"], i["newKey"])
    return i["pv"]


def _share_info(i: dict[str, Any]) -> Any:
    info = azure_file.file_share_info(i["volumeHandle"])
    return {
        "resourceGroup": info.resource_group,
        "accountName": info.account_name,
        "shareName": info.share_name,
        "diskName": info.disk_name,
    }


T = TRANSLATOR
CALLS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "pv_to_csi": lambda i, a: T.translate_in_tree_pv_to_csi(i),
    "csi_to_pv": lambda i, a: T.translate_csi_pv_to_in_tree(i),
    "inline_to_csi": lambda i, a: T.translate_in_tree_inline_volume_to_csi(i, a["podNamespace"]),
    "storageclass_to_csi": lambda i, a: T.translate_in_tree_storage_class_to_csi(a["inTreePluginName"], i),
    "repair_handle": lambda i, a: {
        "volumeHandle": T.repair_volume_handle(i["driverName"], i["volumeHandle"], i["nodeID"])
    },
    "get_csi_name_from_intree_name": lambda i, a: {
        "result": T.get_csi_name_from_in_tree_name(i["pluginName"])
    },
    "get_intree_name_from_csi_name": lambda i, a: {
        "result": T.get_in_tree_name_from_csi_name(i["pluginName"])
    },
    "is_migratable_intree_plugin_by_name": lambda i, a: {
        "result": T.is_migratable_in_tree_plugin_by_name(i["pluginName"])
    },
    "is_migrated_csi_driver_by_name": lambda i, a: {
        "result": T.is_migrated_csi_driver_by_name(i["pluginName"])
    },
    "is_pv_migratable": lambda i, a: {"result": T.is_pv_migratable(i)},
    "is_inline_migratable": lambda i, a: {"result": T.is_inline_migratable(i)},
    "get_intree_plugin_name_from_spec": lambda i, a: {
        "result": T.get_in_tree_plugin_name_from_spec(i.get("pv"), i.get("volume"))
    },
    "topology_csi_to_intree": lambda i, a: _helper_topology_csi_to_intree(i),
    "topology_intree_to_csi": lambda i, a: _helper_topology_intree_to_csi(i),
    "translate_allowed_topologies": lambda i, a: {
        "terms": topology.translate_allowed_topologies(i["terms"], i["key"])
    },
    "add_topology": lambda i, a: _helper_add_topology(i),
    "replace_topology": lambda i, a: _helper_replace_topology(i),
    "backward_compatible_access_modes": lambda i, a: {
        "accessModes": gce_pd.backward_compatible_access_modes(i["accessModes"])
    },
    "aws_ebs_volume_id": lambda i, a: {
        "volumeID": aws_ebs.kubernetes_volume_id_to_ebs_volume_id(i["kubernetesID"])
    },
    "aws_region_from_zones": lambda i, a: {"region": aws_ebs.region_from_zones(i["zones"])},
    "gce_region_from_zones": lambda i, a: {"region": gce_pd.region_from_zones(i["zones"])},
    "azure_disk_name": lambda i, a: {"diskName": azure_disk.disk_name(i["diskURI"])},
    "azure_is_managed_disk": lambda i, a: {"result": azure_disk.is_managed_disk(i["diskURI"])},
    "azure_file_share_info": lambda i, a: _share_info(i),
    "azure_storage_account_name": lambda i, a: {
        "accountName": azure_file.storage_account_name(i["secretName"])
    },
    "gce_pd_name_from_volume_id": lambda i, a: {"pdName": gce_pd.pd_name_from_volume_id(i["volumeHandle"])},
}
# Public Translator functions whose input must come back untouched.
API_FUNCTIONS = {"pv_to_csi", "csi_to_pv", "inline_to_csi", "storageclass_to_csi", "is_pv_migratable",
                 "is_inline_migratable", "get_intree_plugin_name_from_spec"}  # fmt: skip


def _params(only_api: bool = False) -> list[Any]:
    return [
        pytest.param(v, id=v["id"])
        for v in VECTORS
        if not only_api or (v["function"] in API_FUNCTIONS and v["input"] is not None)
    ]


def _expects_error(expected: Any) -> bool:
    return isinstance(expected, dict) and (expected.get("error") is True or expected.get("panic") is True)


def test_vectors_are_present() -> None:
    assert len(VECTORS) >= 247, f"expected the 247 reference vectors at {VECTORS_PATH}"
    assert {v["function"] for v in VECTORS} <= set(CALLS)


@pytest.mark.parametrize("vector", _params())
def test_vector(vector: dict[str, Any]) -> None:
    call = CALLS[vector["function"]]
    given = copy.deepcopy(vector["input"])
    args = vector.get("args") or {}
    if _expects_error(vector["expected"]):
        with pytest.raises(TranslationError):
            call(given, args)
        return
    assert canon(call(given, args)) == canon(vector["expected"])


@pytest.mark.parametrize("vector", _params(only_api=True))
def test_api_never_mutates_its_input(vector: dict[str, Any]) -> None:
    given = copy.deepcopy(vector["input"])
    try:
        result = CALLS[vector["function"]](given, vector.get("args") or {})
    except TranslationError:
        result = None
    assert given == vector["input"]
    _scribble(result)  # the result shares no mutable part with the input
    assert given == vector["input"]


def _scribble(value: Any) -> None:
    if isinstance(value, dict):
        for child in list(value.values()):
            _scribble(child)
        value["__probe__"] = True
    elif isinstance(value, list):
        for child in list(value):
            _scribble(child)
        value.append("__probe__")


# -- Ballast's rules where Kubernetes crashes, is random, or gets malformed JSON (spec 1.5) ----------

TWO_SOURCES_PV = {
    "metadata": {"name": "pv"},
    "spec": {"gcePersistentDisk": {"pdName": "d"}, "awsElasticBlockStore": {"volumeID": "vol-1"}},
}
TWO_SOURCES_VOLUME = {"name": "v", "cinder": {"volumeID": "c"}, "portworxVolume": {"volumeID": "p"}}


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: T.translate_in_tree_pv_to_csi(TWO_SOURCES_PV), id="pv-two-sources"),
        pytest.param(
            lambda: T.translate_in_tree_inline_volume_to_csi(TWO_SOURCES_VOLUME, "ns"), id="inline-two"
        ),
        pytest.param(
            lambda: T.get_in_tree_plugin_name_from_spec(TWO_SOURCES_PV, None), id="name-two-sources"
        ),
        pytest.param(
            lambda: T.translate_in_tree_storage_class_to_csi("kubernetes.io/gce-pd", None), id="gce-nil-sc"
        ),
        pytest.param(
            lambda: T.translate_in_tree_storage_class_to_csi("kubernetes.io/cinder", None), id="cinder-nil-sc"
        ),
        pytest.param(
            lambda: T.translate_in_tree_inline_volume_to_csi(
                {"name": "v", "vsphereVolume": {"volumePath": "p", "storagePolicyName": "gold"}}, ""
            ),
            id="vsphere-inline-policy",
        ),
        pytest.param(lambda: T.translate_in_tree_pv_to_csi(["not", "an", "object"]), id="pv-not-object"),  # type: ignore[arg-type]
        pytest.param(
            lambda: T.translate_in_tree_pv_to_csi({"spec": {"gcePersistentDisk": {"pdName": 7}}}),
            id="pd-name-int",
        ),
        pytest.param(
            lambda: T.translate_in_tree_pv_to_csi({"spec": {"awsElasticBlockStore": {"partition": 2**31}}}),
            id="partition-beyond-int32",
        ),
        pytest.param(
            lambda: T.translate_csi_pv_to_in_tree(
                {"spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeAttributes": {"partition": 1}}}}
            ),
            id="attribute-not-string",
        ),
    ],
)
def test_crashes_ambiguity_and_malformed_input_raise(call: Callable[[], Any]) -> None:
    with pytest.raises(TranslationError):
        call()


def test_ambiguous_objects_are_not_migratable() -> None:
    assert not T.is_pv_migratable(TWO_SOURCES_PV)
    assert not T.is_inline_migratable(TWO_SOURCES_VOLUME)
    assert T.is_pv_migratable({"spec": {"gcePersistentDisk": {"pdName": "d"}}})


def test_azure_file_nil_storage_class_is_nil() -> None:
    assert T.translate_in_tree_storage_class_to_csi("kubernetes.io/azure-file", None) is None


def test_later_parameter_wins_when_keys_collide() -> None:
    sc = {"provisioner": "kubernetes.io/gce-pd", "parameters": {"zone": "a", "zones": "b,c", "FSType": "xfs"}}
    out = T.translate_in_tree_storage_class_to_csi("kubernetes.io/gce-pd", sc)
    assert out["allowedTopologies"] == [
        {"matchLabelExpressions": [{"key": "topology.gke.io/zone", "values": ["b", "c"]}]}
    ]
    assert out["parameters"] == {"csi.storage.k8s.io/fstype": "xfs"}


def test_in_tree_source_wins_over_a_stale_csi_source() -> None:
    """Kubernetes v0.37.2 dispatches on in-tree keys only and replaces `csi` (the spec says "error")."""
    pv = {"spec": {"csi": {"driver": "x", "volumeHandle": "h"}, "cinder": {"volumeID": "c"}}}
    assert T.translate_in_tree_pv_to_csi(pv)["spec"] == {
        "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "c"}
    }
    with pytest.raises(TranslationError):
        T.translate_in_tree_pv_to_csi({"spec": {"csi": {"driver": "x", "volumeHandle": "h"}}})
