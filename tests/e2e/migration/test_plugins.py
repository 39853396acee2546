"""Convert and roll back, per plugin, at the object level: one bound in-tree PV of each of the seven
plugins, converted by the controller (as the chart runs it) with every gate on, then rolled back with
the gates off. Nothing serves these disks here; the PV binder and the protection controllers do run.
"""

from __future__ import annotations

import json

import pytest

from shim import Translator
from shim.migrate.objects import ANN_CONVERTED_BY, ANN_ORIGINAL, record_of
from shim.migrate.options import version
from tests.e2e.kube import Kube, pvcs, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    MOVE_TIMEOUT,
    NO_GATES,
    MigrationRelease,
    back_in_tree,
    converted_and_bound,
    events_about,
    no_lock,
    plugin_pvs,
    unique,
)
from tests.shim.migrate.samples import PLUGINS, Obj

pytestmark = pytest.mark.slow
KEPT_SPEC = ("capacity", "accessModes", "claimRef", "volumeMode", "mountOptions", "storageClassName")


def check_converted(kube: Kube, namespace: str, plugin: str, original: Obj, converted: Obj) -> None:
    source_key, _, driver = PLUGINS[plugin]
    record = record_of(original)
    notes = converted["metadata"]["annotations"]
    assert json.loads(notes[ANN_ORIGINAL]) == record, "the record is the PV as it was"
    assert notes[ANN_CONVERTED_BY] == f"forward_{version()}", "pod name plus version"
    expected = Translator().translate_in_tree_pv_to_csi(record)["spec"]
    spec = converted["spec"]
    assert source_key not in spec and spec["csi"] == expected["csi"] and spec["csi"]["driver"] == driver
    assert spec.get("nodeAffinity") == expected.get("nodeAffinity")
    assert {k: spec.get(k) for k in KEPT_SPEC} == {k: original["spec"].get(k) for k in KEPT_SPEC}
    assert spec["claimRef"]["uid"] == original["spec"]["claimRef"]["uid"]
    assert spec["persistentVolumeReclaimPolicy"] == original["spec"]["persistentVolumeReclaimPolicy"]
    assert converted["metadata"].get("labels") == original["metadata"].get("labels")
    assert {k: v for k, v in notes.items() if k not in (ANN_ORIGINAL, ANN_CONVERTED_BY)} == record[
        "metadata"
    ].get("annotations", {})
    assert converted["metadata"]["uid"] != original["metadata"]["uid"], "a new object, same name"
    claim = kube.get(pvcs(namespace, plugin))
    assert claim["metadata"]["uid"] == original["spec"]["claimRef"]["uid"], "the same claim, re-bound"


def test_each_plugin_converts_and_rolls_back_to_exactly_its_original(
    release: MigrationRelease, kube: Kube, namespace: str
) -> None:
    run = unique("pp")
    names = plugin_pvs(kube, namespace, run, list(PLUGINS))
    originals = {plugin: kube.get(pvs(name)) for plugin, name in names.items()}
    selector = f"--selector=e2e-run={run}"
    release.start("forward", f"--feature-gates={ALL_GATES}", selector, "--leader-elect=false")
    for plugin, name in names.items():
        converted = kube.wait(
            pvs(name), converted_and_bound(kube, namespace, plugin), MOVE_TIMEOUT, f"{name} converted"
        )
        check_converted(kube, namespace, plugin, originals[plugin], converted)
        assert no_lock(kube, namespace, name)
        assert [e["type"] for e in events_about(kube, "default", name, "Converted")] == ["Normal"]
    release.stop_all()
    release.start("back", f"--feature-gates={NO_GATES}", selector, "--leader-elect=false")
    for plugin, name in names.items():
        source_key = PLUGINS[plugin][0]
        back = kube.wait(
            pvs(name), back_in_tree(kube, namespace, plugin, source_key), MOVE_TIMEOUT, f"{name} back"
        )
        assert record_of(back) == record_of(originals[plugin]), f"{plugin}: not exactly the original"
        assert no_lock(kube, namespace, name)
        assert events_about(kube, "default", name, "RolledBack")
