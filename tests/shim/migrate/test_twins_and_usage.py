"""StorageClass twins (naming rule, translated content) and what counts as a volume in use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shim import Translator
from shim.migrate.twins import (
    ANN_PLUGIN,
    ANN_TWIN_OF,
    DEFAULT_CLASS,
    MAX_NAME,
    build_twin,
    is_twin,
    twin_name,
)
from shim.migrate.usage import UsageFrom, attached_to, claims_of_pod, pods_using
from tests.shim.migrate.samples import Obj

CLASSES = Path(__file__).parents[1] / "testdata" / "manifests" / "storageclasses.yaml"


def storage_classes() -> dict[str, Obj]:
    docs = [d for d in yaml.safe_load_all(CLASSES.read_text()) if d]
    return {
        d["metadata"]["name"]: d
        for d in docs
        if Translator().is_migratable_in_tree_plugin_by_name(d["provisioner"])
    }


def test_twin_name_rule() -> None:
    assert twin_name("gp2") == "gp2-csi"
    long_name = "c" * 252
    name = twin_name(long_name)
    assert len(name) == MAX_NAME and name.startswith("c" * 200) and "-csi-" in name
    assert twin_name(long_name[:-1] + "d") != name


@pytest.mark.parametrize("name", sorted(storage_classes()))
def test_twin_has_the_translated_parameters_and_the_csi_provisioner(name: str) -> None:
    sc = storage_classes()[name]
    sc.setdefault("metadata", {}).setdefault("annotations", {})[DEFAULT_CLASS] = "true"
    twin = build_twin(Translator(), sc)
    translated = Translator().translate_in_tree_storage_class_to_csi(sc["provisioner"], sc)
    assert twin["metadata"]["name"] == twin_name(name)
    assert twin["provisioner"] == Translator().get_csi_name_from_in_tree_name(sc["provisioner"])
    assert twin.get("parameters") == (translated.get("parameters") or None)
    assert twin.get("allowedTopologies") == (translated.get("allowedTopologies") or None)
    for key in ("reclaimPolicy", "volumeBindingMode", "allowVolumeExpansion", "mountOptions"):
        assert twin.get(key) == sc.get(key), key
    annotations = twin["metadata"]["annotations"]
    assert annotations == {ANN_TWIN_OF: name, ANN_PLUGIN: sc["provisioner"]}, (
        "the default mark moves only on request"
    )
    assert is_twin(twin) and not is_twin(sc)


def pod(name: str, phase: str, *volumes: Obj) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"volumes": list(volumes)},
        "status": {"phase": phase},
    }


CLAIM = {"name": "v", "persistentVolumeClaim": {"claimName": "data"}}


@pytest.mark.parametrize(
    ("pods", "users"),
    [
        pytest.param([pod("p", "Running", CLAIM)], ["Pod ns/p (Running)"], id="running"),
        pytest.param([pod("p", "Pending", CLAIM)], ["Pod ns/p (Pending)"], id="pending-counts"),
        pytest.param([pod("p", "Succeeded", CLAIM), pod("q", "Failed", CLAIM)], [], id="terminated-do-not"),
        pytest.param([pod("p", "Running", {"name": "other", "emptyDir": {}})], [], id="other-volume"),
        pytest.param(
            [pod("web", "Running", {"name": "cache", "ephemeral": {"volumeClaimTemplate": {}}})],
            [],
            id="ephemeral-other-claim",
        ),
    ],
)
def test_pods_using_a_claim(pods: list[Obj], users: list[str]) -> None:
    assert pods_using("data", pods) == users


def test_generic_ephemeral_volumes_name_their_claim() -> None:
    ephemeral = pod("web", "Running", {"name": "cache", "ephemeral": {"volumeClaimTemplate": {}}})
    assert claims_of_pod(ephemeral) == {"web-cache"}
    assert pods_using("web-cache", [ephemeral]) == ["Pod ns/web (Running)"]


def test_attachments_of_a_pv() -> None:
    attachments = [
        {
            "metadata": {"name": "csi-1"},
            "spec": {"nodeName": "n1", "source": {"persistentVolumeName": "pv-a"}},
        },
        {
            "metadata": {"name": "csi-2"},
            "spec": {"nodeName": "n2", "source": {"persistentVolumeName": "pv-b"}},
        },
        {"metadata": {"name": "csi-3"}, "spec": {"nodeName": "n3", "source": {"inlineVolumeSpec": {}}}},
    ]
    assert attached_to("pv-a", attachments) == ["VolumeAttachment csi-1 (node n1)"]
    assert attached_to("pv-c", attachments) == []


class ClaimsIn:
    """Claims looked up in a list (as the controller's cache or the API server has them)."""

    def __init__(self, *claims: Obj) -> None:
        self._claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._claims.get((namespace, name))


def claim_data(uid: str) -> Obj:
    return {"metadata": {"name": "data", "namespace": "ns", "uid": uid}}


def pv_of_claim(uid: str, phase: str = "Released") -> Obj:
    ref = {
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        **({"uid": uid} if uid else {}),
    }
    return {"metadata": {"name": "pv-a"}, "spec": {"claimRef": ref}, "status": {"phase": phase}}


VA = {"metadata": {"name": "csi-1"}, "spec": {"nodeName": "n1", "source": {"persistentVolumeName": "pv-a"}}}


@pytest.mark.parametrize(
    ("pv", "claims", "attachments", "users"),
    [
        pytest.param(
            pv_of_claim("c-1", "Bound"), [claim_data("c-1")], [], ["Pod ns/p (Running)"], id="its-claim"
        ),
        pytest.param(pv_of_claim("c-1"), [claim_data("c-2")], [], [], id="newer-claim-same-name"),
        pytest.param(
            pv_of_claim("c-1"),
            [claim_data("c-2")],
            [VA],
            ["VolumeAttachment csi-1 (node n1)"],
            id="newer-attached",
        ),
        pytest.param(pv_of_claim("c-1"), [], [], [], id="claim-gone"),
        pytest.param(
            pv_of_claim("", "Available"), [claim_data("c-2")], [], ["Pod ns/p (Running)"], id="pre-bound"
        ),
    ],
)
def test_pods_count_only_through_the_claim_the_pv_names(
    pv: Obj, claims: list[Obj], attachments: list[Obj], users: list[str]
) -> None:
    """Kubernetes' PV binder treats a claim whose uid differs from claimRef.uid as another claim: the pods
    of a newer claim of the same name do not use this PV."""
    usage = UsageFrom(lambda: attachments, lambda namespace: [pod("p", "Running", CLAIM)], ClaimsIn(*claims))
    assert usage.users(pv) == users
