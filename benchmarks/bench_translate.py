"""Shim translation throughput: translations per second over a mixed batch of 10,000 objects.

The batch mixes in-tree PVs (40 %), CSI PVs (20 %), inline pod volumes (20 %) and StorageClasses (20 %)
across all seven plugins, with zone labels, node affinity and parameters, built from a fixed seed.
Run: .venv/bin/python -m benchmarks.bench_translate [--objects 10000] [--runs 5]
Writes benchmarks/results/translate.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from benchmarks.common import write_result
from shim import Translator

JSON = dict[str, Any]
GA_ZONE = "topology.kubernetes.io/zone"
GA_REGION = "topology.kubernetes.io/region"
ZONES = {"gce": ["us-central1-a", "us-central1-b"], "aws": ["us-west-2a", "us-west-2b"], "other": ["nova"]}


def in_tree_sources(rng: random.Random, i: int) -> list[tuple[str, str, JSON, str]]:
    """(in-tree plugin name, source key, source, zone family) for every plugin."""
    ro = rng.random() < 0.3
    return [
        (
            "kubernetes.io/gce-pd",
            "gcePersistentDisk",
            {"pdName": f"pd-{i}", "fsType": "ext4", "readOnly": ro},
            "gce",
        ),
        (
            "kubernetes.io/aws-ebs",
            "awsElasticBlockStore",
            {"volumeID": f"aws://us-west-2a/vol-{i:017x}"},
            "aws",
        ),
        (
            "kubernetes.io/azure-disk",
            "azureDisk",
            {
                "diskName": f"d{i}",
                "diskURI": f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d{i}",
                "cachingMode": "ReadOnly",
                "fsType": "ext4",
                "kind": "Managed",
            },
            "",
        ),
        (
            "kubernetes.io/azure-file",
            "azureFile",
            {
                "secretName": "azure-storage-account-acct-secret",
                "shareName": f"s{i}",
                "secretNamespace": "ns",
            },
            "",
        ),
        ("kubernetes.io/cinder", "cinder", {"volumeID": f"c-{i}", "fsType": "xfs"}, "other"),
        (
            "kubernetes.io/vsphere-volume",
            "vsphereVolume",
            {"volumePath": f"[ds] kubevols/v{i}.vmdk"},
            "other",
        ),
        ("kubernetes.io/portworx-volume", "portworxVolume", {"volumeID": f"px-{i}", "readOnly": ro}, ""),
    ]


def persistent_volume(rng: random.Random, i: int) -> JSON:
    _, key, source, family = rng.choice(in_tree_sources(rng, i))
    pv: JSON = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{i}", "annotations": {"pv.kubernetes.io/provisioned-by": "bench"}},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "claimRef": {"name": f"claim-{i}", "namespace": "apps"},
            key: source,
        },
    }
    if family:
        zone = rng.choice(ZONES[family])
        pv["metadata"]["labels"] = {GA_ZONE: zone}
        if rng.random() < 0.5:
            expression = {"key": GA_ZONE, "operator": "In", "values": [zone]}
            pv["spec"]["nodeAffinity"] = {
                "required": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
            }
    return pv


def storage_class(rng: random.Random, i: int) -> tuple[str, JSON]:
    plugin = rng.choice(in_tree_sources(rng, i))[0]
    params = {"fstype": "ext4", "type": "pd-ssd", "zones": "us-central1-a,us-central1-b"}
    if rng.random() < 0.5:
        del params["zones"]
    return plugin, {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": f"sc-{i}"},
        "provisioner": plugin,
        "parameters": params,
    }


Call = tuple[str, str, tuple[Any, ...]]  # (kind, Translator method, arguments)


def build_batch(count: int, seed: int) -> list[Call]:
    """The mixed batch; CSI PVs are translated up front so only the measured call runs later."""
    rng = random.Random(seed)
    prepare = Translator()
    batch: list[Call] = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.4:
            pv = persistent_volume(rng, i)
            batch.append(("pv_to_csi", "translate_in_tree_pv_to_csi", (pv,)))
        elif roll < 0.6:
            csi = prepare.translate_in_tree_pv_to_csi(persistent_volume(rng, i))
            batch.append(("csi_to_pv", "translate_csi_pv_to_in_tree", (csi,)))
        elif roll < 0.8:
            _, key, source, _ = rng.choice(in_tree_sources(rng, i))
            volume = {"name": f"vol-{i}", key: source}
            batch.append(("inline_to_csi", "translate_in_tree_inline_volume_to_csi", (volume, "apps")))
        else:
            plugin, sc = storage_class(rng, i)
            batch.append(("storageclass_to_csi", "translate_in_tree_storage_class_to_csi", (plugin, sc)))
    return batch


def run_once(batch: list[Call]) -> tuple[float, dict[str, float]]:
    translator = Translator()
    calls = [(kind, getattr(translator, method), args) for kind, method, args in batch]
    per_kind: dict[str, float] = {}
    start = time.perf_counter()
    for kind, method, args in calls:
        t0 = time.perf_counter()
        method(*args)
        per_kind[kind] = per_kind.get(kind, 0.0) + time.perf_counter() - t0
    return time.perf_counter() - start, per_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    batch = build_batch(args.objects, args.seed)
    counts: dict[str, int] = {}
    for kind, _, _ in batch:
        counts[kind] = counts.get(kind, 0) + 1
    run_once(batch)  # warm-up
    runs = [run_once(batch) for _ in range(args.runs)]
    totals = [total for total, _ in runs]
    median_total = statistics.median(totals)
    per_kind = {
        kind: {
            "objects": counts[kind],
            "translations_per_second": round(counts[kind] / statistics.median(r[1][kind] for r in runs)),
        }
        for kind in sorted(counts)
    }
    write_result(
        "translate",
        {
            "objects": args.objects,
            "runs": args.runs,
            "median_seconds": round(median_total, 4),
            "translations_per_second": round(args.objects / median_total),
            "best_translations_per_second": round(args.objects / min(totals)),
            "by_kind": per_kind,
        },
    )


if __name__ == "__main__":
    main()
