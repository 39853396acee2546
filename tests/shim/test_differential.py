"""Differential test: the shim against Kubernetes' own csi-translation-lib (tests/shim/k8stranslate).

Hypothesis generates in-tree PVs, CSI PVs, inline volumes and StorageClasses for all seven plugins
(odd handles, GA/beta zone and region labels, multi-zone values, partitions, read-only, secrets,
allowedTopologies, unknown parameters) and both translators must agree exactly: both fail, or both
return objects equal under the spec's strict comparison.

Inputs are generated in the canonical form an API server returns (no empty-string struct fields, no
fields Kubernetes does not know), and avoid the cases where Kubernetes is nondeterministic or where the
shim deliberately differs (spec 1.5: two in-tree sources in one object, parameter keys colliding in one
output slot).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shim import TranslationError, Translator
from tests.conftest import require_tool
from tests.shim.test_vectors import canon

JSONDict = dict[str, Any]
TRANSLATOR = Translator()

GA_ZONE = "topology.kubernetes.io/zone"
GA_REGION = "topology.kubernetes.io/region"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
PLUGINS = {  # in-tree name -> (source key, CSI driver, CSI topology keys)
    "kubernetes.io/gce-pd": ("gcePersistentDisk", "pd.csi.storage.gke.io", ["topology.gke.io/zone"]),
    "kubernetes.io/aws-ebs": ("awsElasticBlockStore", "ebs.csi.aws.com", ["topology.ebs.csi.aws.com/zone"]),
    "kubernetes.io/azure-disk": ("azureDisk", "disk.csi.azure.com", ["topology.disk.csi.azure.com/zone"]),
    "kubernetes.io/azure-file": ("azureFile", "file.csi.azure.com", []),
    "kubernetes.io/cinder": (
        "cinder",
        "cinder.csi.openstack.org",
        ["topology.cinder.csi.openstack.org/zone"],
    ),
    "kubernetes.io/vsphere-volume": (
        "vsphereVolume",
        "csi.vsphere.vmware.com",
        ["topology.csi.vmware.com/zone", "topology.csi.vmware.com/region"],
    ),
    "kubernetes.io/portworx-volume": ("portworxVolume", "pxd.portworx.com", []),
}
IN_TREE_NAMES = sorted(PLUGINS)
CSI_KEYS = sorted({k for _, _, keys in PLUGINS.values() for k in keys})

# Example counts per test; together well over 2,000 generated inputs per run.
EXAMPLES = {"pv": 800, "csi": 600, "inline": 450, "sc": 550, "small": 150}


# -- the Go side ------------------------------------------------------------------------------------


class KubernetesTranslator:
    """One long-lived k8s-translate process answering one JSON line per request."""

    def __init__(self, binary: str) -> None:
        self.requests = 0
        self._proc = subprocess.Popen(
            [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8"
        )

    def ask(self, request: JSONDict) -> JSONDict:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, "k8s-translate exited"
        self.requests += 1
        answer: JSONDict = json.loads(line)
        assert "decodeError" not in answer, f"generator produced an invalid object: {answer['decodeError']}"
        return answer

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@pytest.fixture(scope="module")
def k8s() -> Iterator[KubernetesTranslator]:
    process = KubernetesTranslator(require_tool("k8s-translate"))
    try:
        yield process
    finally:
        process.close()


def agree(k8s: KubernetesTranslator, request: JSONDict, ours: Callable[[], Any]) -> None:
    """Both translators fail, or both succeed with strictly equal results."""
    theirs = k8s.ask(request)
    try:
        mine = ours()
    except TranslationError as err:
        assert "error" in theirs, f"shim failed ({err}) but Kubernetes returned {theirs.get('result')!r}"
        return
    assert "error" not in theirs, f"Kubernetes failed ({theirs['error']}) but the shim returned {mine!r}"
    assert canon(mine) == canon(theirs.get("result"))


# -- strategies -------------------------------------------------------------------------------------

ODD_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
WORD = st.text(st.sampled_from("abcxyz0129-_."), min_size=1, max_size=8)
NON_EMPTY = st.one_of(WORD, ODD_TEXT.filter(bool))
ANY_TEXT = st.one_of(st.just(""), WORD, ODD_TEXT)
GCE_ZONES = ["us-central1-a", "us-central1-b", "us-east1-c", "europe-west4-a"]
AWS_ZONES = ["us-west-2a", "us-west-2b", "us-east-1c", "us-gov-east-1a", "us-west-2-lax-1a",
             "us-east-1-wl1-bos-wlz-1", "eu-central-1a"]  # fmt: skip
OTHER_ZONES = ["nova", "zone-1", "1", "0", "us-west-2", "us-west-2ab", " ", "", "a-b-c-d-e-f", "us-west-é",
               "us-east-1-wl1-bos-wlz", "us-central1-a-b", "1a"]  # fmt: skip
ZONE = st.one_of(st.sampled_from(GCE_ZONES + AWS_ZONES + OTHER_ZONES), WORD)
REGION = st.sampled_from(["us-central1", "us-west-2", "us-east1", "eastus", "region-x"])
ZONE_LABEL_VALUE = st.one_of(
    ZONE,
    st.lists(ZONE, min_size=2, max_size=3).map("__".join),
    st.sampled_from(["", "__", "us-central1-a__", " __us-east1-c"]),
)
TOPOLOGY_KEYS = [
    GA_ZONE,
    BETA_ZONE,
    GA_REGION,
    BETA_REGION,
    *CSI_KEYS,
    "kubernetes.io/hostname",
    "custom/key",
]
ACCESS_MODES = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]


def mostly(good: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` three times in four, else `odd`."""
    return st.integers(0, 3).flatmap(lambda i: good if i else odd)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The value, or the key left out (None is removed by `drop_none`)."""
    return st.one_of(st.none(), strategy)


def drop_none(d: JSONDict) -> JSONDict:
    return {k: v for k, v in d.items() if v is not None}


def unique_lower(items: list[tuple[str, str]]) -> dict[str, str]:
    """Keep the first of keys equal ignoring case (Kubernetes' result would depend on map order)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for key, value in items:
        if key.lower() not in seen:
            seen.add(key.lower())
            out[key] = value
    return out


requirement = st.builds(
    lambda key, op, values: drop_none({"key": key, "operator": op, "values": values}),
    st.sampled_from(TOPOLOGY_KEYS),
    st.sampled_from(["In", "In", "In", "NotIn"]),
    maybe(st.lists(st.one_of(ZONE, REGION), max_size=3)),
)
node_affinity = st.builds(
    lambda terms: {"required": {"nodeSelectorTerms": terms}},
    st.lists(
        st.builds(
            lambda exprs: drop_none({"matchExpressions": exprs}), maybe(st.lists(requirement, max_size=3))
        ),
        max_size=3,
    ),
)
pv_labels = st.dictionaries(
    st.sampled_from([GA_ZONE, BETA_ZONE, GA_REGION, BETA_REGION, "app"]),
    st.one_of(ZONE_LABEL_VALUE, REGION),
    max_size=4,
)
pv_annotations = st.dictionaries(
    st.sampled_from(
        [
            "kubernetes.io/azure-file-resource-group",
            "openstorage.io/auth-secret-name",
            "openstorage.io/auth-secret-namespace",
            "note",
        ]
    ),
    ANY_TEXT,
    max_size=3,
)


def pv_shell(name: str | None, meta_labels: JSONDict, notes: JSONDict, spec: JSONDict) -> JSONDict:
    metadata = drop_none({"name": name, "labels": meta_labels or None, "annotations": notes or None})
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": spec}


pv_common_spec = st.fixed_dictionaries(
    {},
    optional={
        "capacity": st.sampled_from([{"storage": "10Gi"}, {"storage": "500Mi"}]),
        "accessModes": st.lists(st.sampled_from(ACCESS_MODES), max_size=3),
        "claimRef": st.builds(
            lambda n, ns: drop_none({"name": n, "namespace": ns}), NON_EMPTY, maybe(NON_EMPTY)
        ),
        "persistentVolumeReclaimPolicy": st.sampled_from(["Retain", "Delete"]),
        "storageClassName": WORD,
        "mountOptions": st.lists(WORD, max_size=2),
        "volumeMode": st.sampled_from(["Filesystem", "Block"]),
        "nodeAffinity": node_affinity,
    },
)

EBS_IDS = st.one_of(
    st.sampled_from(
        [
            "vol-0123",
            "aws://us-west-2a/vol-0123",
            "aws:///vol-0123",
            "aws://vol-0123",
            "aws://us-west-2a/0123",
            "aws://z/vol-%41bc",
            "aws://z/vol-1?x=y",
            "aws://z/vol-1#frag",
            "aws://z/vol-1#%zz",
            "aws://u:p@z:443/vol-1",
            "aws://z:abc/vol-1",
            "aws://h%zz/vol-1",
            "aws://h%41/vol-1",
            "aws://h%c3%a9/vol-1",
            "aws://a b/vol-1",
            "aws://z/vol-%zz",
            "aws://z/vol-a/b",
            "aws://z//vol-1//",
            "aws://[::1]:80/vol-1",
            "aws://[1.2.3.4]/vol-1",
            "aws://z/vol-%ff%e2%82",
            "aws://z/vol-\x01",
            "",
        ]
    ),
    st.builds(lambda host, path: f"aws://{host}/{path}", ODD_TEXT, ODD_TEXT),
    st.builds(lambda rest: f"aws://z/vol-{rest}", st.text(st.sampled_from("a%2F4/?#@:[] é"), max_size=6)),
    ODD_TEXT,
)
PARTITION = st.one_of(st.integers(-3, 5), st.integers(-(2**31), 2**31 - 1))
AZURE_DISK_URIS = st.one_of(
    st.sampled_from(
        [
            "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name",
            "https://account.blob.core.windows.net/vhds/disk.vhd",
            "HTTP://x/vhds/a",
            "http",
            "/subscriptions/1/resourcegroups/2/providers/Microsoft.Compute/disks/lower",
            "",
        ]
    ),
    ODD_TEXT,
)
AZURE_SECRET_NAMES = st.one_of(
    st.sampled_from(["azure-storage-account-acct-secret", "azure-storage-account--secret", "plain"]),
    NON_EMPTY,
)


def in_tree_source(key: str, *, inline: bool) -> st.SearchStrategy[JSONDict]:
    """Fields of one in-tree source (omitting empties, as an API server would)."""
    common_ro = maybe(st.booleans().filter(bool))
    fs = maybe(st.sampled_from(["ext4", "xfs", "ntfs"]))
    part = maybe(PARTITION.filter(bool))
    if key == "gcePersistentDisk":
        fields = {"pdName": ANY_TEXT, "fsType": fs, "partition": part, "readOnly": common_ro}
    elif key == "awsElasticBlockStore":
        fields = {"volumeID": EBS_IDS, "fsType": fs, "partition": part, "readOnly": common_ro}
    elif key == "azureDisk":
        fields = {
            "diskName": ANY_TEXT,
            "diskURI": AZURE_DISK_URIS,
            "cachingMode": maybe(st.sampled_from(["", "None", "ReadOnly", "ReadWrite"])),
            "fsType": maybe(st.sampled_from(["", "ext4"])),
            "readOnly": maybe(st.booleans()),
            "kind": maybe(st.sampled_from(["Managed", "managed", "MANAGED", "Shared", "Dedicated", ""])),
        }
    elif key == "azureFile":
        fields = {"secretName": AZURE_SECRET_NAMES, "shareName": ANY_TEXT, "readOnly": common_ro}
        if not inline:
            fields["secretNamespace"] = maybe(st.sampled_from(["", "ns1", "default"]))
    elif key == "cinder":
        fields = {
            "volumeID": ANY_TEXT,
            "fsType": fs,
            "readOnly": common_ro,
            "secretRef": maybe(st.builds(lambda n: {"name": n}, NON_EMPTY)),
        }
    elif key == "vsphereVolume":
        fields = {
            "volumePath": st.one_of(st.just("[vsanDatastore] kubevols/disk.vmdk"), ANY_TEXT),
            "fsType": fs,
            "storagePolicyName": maybe(NON_EMPTY),
            "storagePolicyID": maybe(NON_EMPTY),
        }
    else:
        fields = {"volumeID": ANY_TEXT, "fsType": fs, "readOnly": common_ro}
    return st.fixed_dictionaries(fields).map(
        lambda d: {k: v for k, v in d.items() if v is not None and (v != "" or k in _ALWAYS_EMITTED)}
    )


# Go emits these even when "" (no omitempty); everything else "" is left out of generated input.
_ALWAYS_EMITTED = {"pdName", "volumeID", "diskName", "diskURI", "secretName", "shareName", "volumePath",
                   "cachingMode", "fsType", "kind", "secretNamespace"}  # fmt: skip


@st.composite
def in_tree_pv(draw: st.DrawFn) -> JSONDict:
    plugin = draw(st.sampled_from(IN_TREE_NAMES))
    key = PLUGINS[plugin][0]
    spec = draw(pv_common_spec)
    spec[key] = draw(in_tree_source(key, inline=False))
    if draw(st.integers(0, 7)) == 0:  # a stale CSI source is replaced (Kubernetes dispatches on in-tree keys)
        spec["csi"] = {"driver": "other.csi.io", "volumeHandle": "stale"}
    return pv_shell(draw(maybe(NON_EMPTY)), draw(pv_labels), draw(pv_annotations), spec)


CSI_HANDLES = st.one_of(
    st.sampled_from(
        [
            "projects/p/zones/us-central1-a/disks/d",
            "projects/UNSPECIFIED/regions/us-central1/disks/d",
            "a/b/c/d/e",
            "a/b/c/d/e/f/g",
            "vol-1",
            "aws://z/vol-1",
            "/subscriptions/12/resourceGroups/23/providers/Microsoft.Compute/disks/name",
            "https://account.blob.core.windows.net/vhds/disk.vhd",
            "rg#acct#share#pv#ns",
            "#acct#share",
            "a#b",
            "",
        ]
    ),
    ODD_TEXT,
)
ATTRIBUTE_KEYS = ["partition", "kind", "cachingmode", "cachingMode", "fstype", "FSType", "sharename",
                  "shareName", "secretname", "secretName", "secretnamespace", "initialvolumefilepath",
                  "storagepolicyname", "other"]  # fmt: skip
ATTRIBUTE_VALUES = st.one_of(
    st.sampled_from(["", "0", "3", "+7", "-2", " 1", "1e3", "99999999999", "99999999999999999999", "٣"]),
    ANY_TEXT,
)
secret_ref = st.builds(
    lambda n, ns: drop_none({"name": n, "namespace": ns}), maybe(NON_EMPTY), maybe(NON_EMPTY)
)


GCE_HANDLE = st.builds(
    lambda p, kind, where, d: f"projects/{p}/{kind}/{where}/disks/{d}",
    st.sampled_from(["UNSPECIFIED", "p"]),
    st.sampled_from(["zones", "regions"]),
    st.sampled_from(["us-central1-a", "us-central1", "UNSPECIFIED"]),
    ANY_TEXT,
)
AZURE_DISK_HANDLE = st.one_of(
    st.builds(
        lambda sub, rg, name: (
            f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/disks/{name}"
        ),
        WORD,
        WORD,
        NON_EMPTY,
    ),
    st.builds(
        lambda scheme, name: f"{scheme}://acct.blob.core.windows.net/vhds/{name}",
        st.sampled_from(["https", "HTTP", "httpx"]),
        NON_EMPTY,
    ),
)
HANDLES_BY_DRIVER = {
    "pd.csi.storage.gke.io": mostly(GCE_HANDLE, st.builds("/".join, st.lists(WORD, max_size=8))),
    "ebs.csi.aws.com": EBS_IDS,
    "disk.csi.azure.com": mostly(AZURE_DISK_HANDLE, AZURE_DISK_URIS),
    "file.csi.azure.com": mostly(
        st.builds("#".join, st.lists(ANY_TEXT, min_size=3, max_size=6)),
        st.builds("#".join, st.lists(WORD, max_size=2)),
    ),
}
ZONES_BY_DRIVER = {"pd.csi.storage.gke.io": GCE_ZONES, "ebs.csi.aws.com": AWS_ZONES}


@st.composite
def csi_affinity(draw: st.DrawFn, driver: str) -> JSONDict:
    """Mostly requirements on the driver's own topology key(s), with zones of the matching cloud."""
    keys = next((k for _, d, k in PLUGINS.values() if d == driver), []) or CSI_KEYS
    zones = st.one_of(st.sampled_from(ZONES_BY_DRIVER.get(driver, GCE_ZONES + AWS_ZONES)), ZONE)
    own = st.builds(
        lambda key, values: {"key": key, "operator": "In", "values": values},
        st.sampled_from(keys),
        st.lists(zones, min_size=1, max_size=2),
    )
    term = st.builds(
        lambda exprs: {"matchExpressions": exprs}, st.lists(st.one_of(own, own, requirement), max_size=3)
    )
    return {"required": {"nodeSelectorTerms": draw(st.lists(term, max_size=3))}}


@st.composite
def csi_pv(draw: st.DrawFn) -> JSONDict:
    driver = draw(st.sampled_from([*(p[1] for p in PLUGINS.values()), "other.csi.io"]))
    handle = draw(mostly(HANDLES_BY_DRIVER.get(driver, CSI_HANDLES), CSI_HANDLES))
    csi = drop_none(
        {
            "driver": driver,
            "volumeHandle": handle,
            "readOnly": draw(maybe(st.just(True))),
            "fsType": draw(maybe(st.sampled_from(["ext4", "xfs"]))),
            "volumeAttributes": unique_lower(
                draw(st.lists(st.tuples(st.sampled_from(ATTRIBUTE_KEYS), ATTRIBUTE_VALUES), max_size=4))
            )
            or None,
            "nodeStageSecretRef": draw(maybe(secret_ref)),
            "controllerPublishSecretRef": draw(maybe(secret_ref)),
        }
    )
    spec = draw(pv_common_spec)
    spec["csi"] = csi
    if draw(st.booleans()):
        spec["nodeAffinity"] = draw(csi_affinity(driver))
    if draw(st.integers(0, 7)) == 0:  # an in-tree source next to the CSI one is carried over
        spec["cinder"] = {"volumeID": "kept"}
    return pv_shell(draw(maybe(NON_EMPTY)), draw(pv_labels), draw(pv_annotations), spec)


@st.composite
def inline_volume(draw: st.DrawFn) -> JSONDict:
    key = PLUGINS[draw(st.sampled_from(IN_TREE_NAMES))][0]
    return {"name": draw(ANY_TEXT), key: draw(in_tree_source(key, inline=True))}


SC_KEYS = ["fstype", "FSType", "zone", "Zone", "zones", "ZONES", "iopsPerGB", "type", "availability",
           "storagePolicyName", "datastore", "DiskFormat", "hostFailuresToTolerate", "forceProvisioning",
           "cacheReservation", "diskStripes", "objectSpaceReservation", "iopsLimit", "csimigration",
           "openstorage.io/auth-secret-name", "openstorage.io/auth-secret-namespace", "repl", "skuName",
           "kind", "unknownParam"]  # fmt: skip
SC_VALUES = st.one_of(
    st.sampled_from(
        ["", "ext4", "us-central1-a", "us-central1-a,us-central1-b", "1,eastus-2", "a, b", "0", "100"]
    ),
    ANY_TEXT,
)


def sc_parameters(items: list[tuple[str, str]]) -> dict[str, str]:
    """Unique keys ignoring case, and at most one of zone/zones (Kubernetes is random otherwise)."""
    params = unique_lower(items)
    if any(k.lower() == "zone" for k in params) and any(k.lower() == "zones" for k in params):
        params = {k: v for k, v in params.items() if k.lower() != "zones"}
    return params


topology_term = st.builds(
    lambda exprs: drop_none({"matchLabelExpressions": exprs}),
    maybe(
        st.lists(
            st.builds(
                lambda k, v: drop_none({"key": k, "values": v}),
                st.sampled_from(TOPOLOGY_KEYS),
                maybe(st.lists(st.one_of(ZONE, st.sampled_from(["0", "12"])), max_size=3)),
            ),
            max_size=2,
        )
    ),
)


@st.composite
def storage_class(draw: st.DrawFn) -> JSONDict:
    sc = drop_none(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": draw(NON_EMPTY)},
            "provisioner": draw(st.one_of(st.sampled_from(IN_TREE_NAMES), WORD)),
            "parameters": sc_parameters(
                draw(st.lists(st.tuples(st.sampled_from(SC_KEYS), SC_VALUES), max_size=5))
            )
            or None,
            "allowedTopologies": draw(maybe(st.lists(topology_term, max_size=2))),
            "reclaimPolicy": draw(maybe(st.sampled_from(["Delete", "Retain"]))),
            "volumeBindingMode": draw(maybe(st.just("WaitForFirstConsumer"))),
            "allowVolumeExpansion": draw(maybe(st.booleans())),
            "mountOptions": draw(maybe(st.lists(WORD, min_size=1, max_size=2))),
        }
    )
    return sc


def examples(count: int) -> settings:
    """Hypothesis settings for `count` examples; the Go round trip makes per-example deadlines meaningless."""
    return settings(
        max_examples=count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- tests ------------------------------------------------------------------------------------------


@examples(EXAMPLES["pv"])
@given(pv=st.one_of(in_tree_pv(), st.just(None)))
def test_in_tree_pv_to_csi_matches_kubernetes(k8s: KubernetesTranslator, pv: JSONDict | None) -> None:
    agree(k8s, {"op": "pv_to_csi", "object": pv}, lambda: TRANSLATOR.translate_in_tree_pv_to_csi(pv))
    agree(k8s, {"op": "is_pv_migratable", "object": pv}, lambda: TRANSLATOR.is_pv_migratable(pv))
    agree(
        k8s,
        {"op": "get_intree_plugin_name_from_spec", "pv": pv, "volume": None},
        lambda: TRANSLATOR.get_in_tree_plugin_name_from_spec(pv, None),
    )


@examples(EXAMPLES["csi"])
@given(pv=csi_pv())
def test_csi_pv_to_in_tree_matches_kubernetes(k8s: KubernetesTranslator, pv: JSONDict) -> None:
    agree(k8s, {"op": "csi_to_pv", "object": pv}, lambda: TRANSLATOR.translate_csi_pv_to_in_tree(pv))
    agree(k8s, {"op": "is_pv_migratable", "object": pv}, lambda: TRANSLATOR.is_pv_migratable(pv))


@examples(EXAMPLES["pv"] // 2)
@given(pv=in_tree_pv())
def test_translated_pv_back_to_in_tree_matches_kubernetes(k8s: KubernetesTranslator, pv: JSONDict) -> None:
    theirs = k8s.ask({"op": "pv_to_csi", "object": pv})
    if "error" in theirs:
        return
    csi = canon(theirs["result"])
    agree(k8s, {"op": "csi_to_pv", "object": csi}, lambda: TRANSLATOR.translate_csi_pv_to_in_tree(csi))


@examples(EXAMPLES["inline"])
@given(volume=st.one_of(inline_volume(), st.just(None)), namespace=st.sampled_from(["", "ns1", "default"]))
def test_inline_volume_to_csi_matches_kubernetes(
    k8s: KubernetesTranslator, volume: JSONDict | None, namespace: str
) -> None:
    agree(
        k8s,
        {"op": "inline_to_csi", "object": volume, "podNamespace": namespace},
        lambda: TRANSLATOR.translate_in_tree_inline_volume_to_csi(volume, namespace),
    )
    agree(
        k8s, {"op": "is_inline_migratable", "object": volume}, lambda: TRANSLATOR.is_inline_migratable(volume)
    )
    agree(
        k8s,
        {"op": "get_intree_plugin_name_from_spec", "pv": None, "volume": volume},
        lambda: TRANSLATOR.get_in_tree_plugin_name_from_spec(None, volume),
    )


@examples(EXAMPLES["sc"])
@given(
    sc=st.one_of(storage_class(), st.just(None)),
    plugin=st.one_of(st.sampled_from(IN_TREE_NAMES), st.just("kubernetes.io/unknown")),
)
def test_storage_class_to_csi_matches_kubernetes(
    k8s: KubernetesTranslator, sc: JSONDict | None, plugin: str
) -> None:
    agree(
        k8s,
        {"op": "storageclass_to_csi", "object": sc, "inTreePluginName": plugin},
        lambda: TRANSLATOR.translate_in_tree_storage_class_to_csi(plugin, sc),
    )


@examples(EXAMPLES["small"])
@given(
    driver=st.one_of(st.sampled_from([p[1] for p in PLUGINS.values()]), WORD),
    handle=st.one_of(
        st.sampled_from(
            [
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                "projects/UNSPECIFIED/zones/us-east1-b/disks/d",
                "projects/p/zones/UNSPECIFIED/disks/d",
                "projects/UNSPECIFIED/other/x/disks/d",
            ]
        ),
        CSI_HANDLES,
    ),
    node=st.one_of(
        st.sampled_from(
            ["projects/bing/zones/us-central1-c/instances/boom", "projects/b/zones/bada/instances/x", "foo"]
        ),
        ODD_TEXT,
    ),
)
def test_repair_volume_handle_matches_kubernetes(
    k8s: KubernetesTranslator, driver: str, handle: str, node: str
) -> None:
    agree(
        k8s,
        {"op": "repair_handle", "driverName": driver, "volumeHandle": handle, "nodeID": node},
        lambda: TRANSLATOR.repair_volume_handle(driver, handle, node),
    )


@examples(EXAMPLES["small"])
@given(name=st.one_of(st.sampled_from(IN_TREE_NAMES + [p[1] for p in PLUGINS.values()]), ANY_TEXT))
def test_name_lookups_match_kubernetes(k8s: KubernetesTranslator, name: str) -> None:
    t = TRANSLATOR
    agree(
        k8s,
        {"op": "get_csi_name_from_intree_name", "name": name},
        lambda: t.get_csi_name_from_in_tree_name(name),
    )
    agree(
        k8s,
        {"op": "get_intree_name_from_csi_name", "name": name},
        lambda: t.get_in_tree_name_from_csi_name(name),
    )
    agree(
        k8s,
        {"op": "is_migratable_intree_plugin_by_name", "name": name},
        lambda: t.is_migratable_in_tree_plugin_by_name(name),
    )
    agree(
        k8s,
        {"op": "is_migrated_csi_driver_by_name", "name": name},
        lambda: t.is_migrated_csi_driver_by_name(name),
    )


@pytest.mark.parametrize(
    ("name", "namespace"),
    [
        pytest.param("", "", id="both-empty"),
        pytest.param("auth", "", id="namespace-empty"),
        pytest.param("auth", "px", id="both-set"),
    ],
)
def test_portworx_auth_secret_refs_match_kubernetes_exactly(
    k8s: KubernetesTranslator, name: str, namespace: str
) -> None:
    """Kubernetes' secret refs are pointers: annotations present make all five, {} when both are empty.
    Compared without canon(), which would drop the {}."""
    annotations = {"openstorage.io/auth-secret-name": name, "openstorage.io/auth-secret-namespace": namespace}
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "px-pv", "annotations": annotations},
        "spec": {"portworxVolume": {"volumeID": "v1"}},
    }
    theirs = k8s.ask({"op": "pv_to_csi", "object": json.loads(json.dumps(pv))})["result"]["spec"]["csi"]
    mine = TRANSLATOR.translate_in_tree_pv_to_csi(pv)["spec"]["csi"]
    assert mine == theirs
    assert len([k for k in mine if k.endswith("SecretRef")]) == 5
