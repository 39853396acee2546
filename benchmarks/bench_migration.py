"""The migration controller on the test bed: PVs converted per minute, API calls per conversion, and
how long a claim takes to re-bind once its PV is re-created.

A real control plane (etcd, kube-apiserver, kube-controller-manager with its default PV binder resync of
15 s) as tests/e2e runs it; the controller runs as the chart deploys it (its Deployment's args, its
ServiceAccount and RBAC, leader election on, default --workers).

- `rebind`: the issue's observation, measured: a Bound in-tree PV is deleted (Retain, DELETE, finalizer
  released) and re-created with the same name and claimRef (uid included) but a `csi` source, one PV at
  a time, each at a random moment of the binder's 15 s resync; the time from the create call to the
  claim being Bound to it again (Bound -> Lost -> Bound).
- `convert`: `--pvs` (500) unused, bound in-tree EBS PVs; the time from the controller's start to the
  last one converted and its claim Bound again, as PVs per minute; API requests the controller made
  (its own metric, start-up lists and watches included) per conversion.
- `rollback`: the same PVs back to in-tree with the gate off.

Needs the binaries of scripts/k8s-tools and etcd. Not a test: run it on an idle machine.
Run: .venv/bin/python -m benchmarks.bench_migration [--pvs 500] [--rebind 10]
Writes benchmarks/results/migration.json.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.common import summary_ms, write_result
from shim import Translator
from tests.e2e.cluster import running_cluster
from tests.e2e.conftest import fresh_namespace
from tests.e2e.kube import Kube, pvcs, pvs
from tests.e2e.migration.harness import (
    ALL_GATES,
    NO_GATES,
    Controller,
    MigrationRelease,
    cleanup,
    ebs_batch,
    migration_release,
)

POLL = 0.05


def wait_all(
    kube: Kube, namespace: str, names: list[str], done: Callable[[Any], bool], timeout: float
) -> float:
    """Poll the PV list until `done(pv)` holds for every name and its claim is Bound to it; seconds."""
    start, wanted = time.monotonic(), set(names)
    while time.monotonic() - start < timeout:
        claims = {c["metadata"]["name"]: c for c in kube.items(pvcs(namespace))}
        ok = {
            p["metadata"]["name"]
            for p in kube.items(pvs())
            if p["metadata"]["name"] in wanted
            and done(p)
            and claims.get(p["metadata"]["name"], {}).get("status", {}).get("phase") == "Bound"
        }
        if ok == wanted:
            return time.monotonic() - start
        time.sleep(1.0)
    raise TimeoutError(f"{len(wanted)} PVs not done after {timeout:.0f}s")


def rebind_once(kube: Kube, namespace: str, name: str, offset: float) -> tuple[float, bool]:
    """Delete and re-create one Bound PV in CSI form `offset` seconds from now (spread over the binder's
    resync period, so samples are not in step with it); seconds from the create to Bound, Lost seen."""
    time.sleep(offset)
    pv = kube.get(pvs(name))
    kube.patch(pvs(name), {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    kube.delete(pvs(name))
    kube.patch(pvs(name), {"metadata": {"finalizers": None}})
    kube.wait_gone(pvs(name), 30, name)
    target = Translator().translate_in_tree_pv_to_csi(
        {k: pv[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": name}}
    )
    kube.create(pvs(), target)
    created, lost = time.monotonic(), False
    while time.monotonic() - created < 120:
        phase = kube.get(pvcs(namespace, name)).get("status", {}).get("phase")
        lost = lost or phase == "Lost"
        if phase == "Bound" and kube.get(pvs(name)).get("status", {}).get("phase") == "Bound":
            return time.monotonic() - created, lost
        time.sleep(POLL)
    raise TimeoutError(f"claim {name} did not re-bind")


def run_controller(release: MigrationRelease, name: str, gates: str, selector: str) -> Controller:
    return release.start(name, f"--feature-gates={gates}", f"--selector={selector}")


def moved(
    release: MigrationRelease, kube: Kube, names: list[str], gates: str, converted: bool
) -> dict[str, Any]:
    started = time.monotonic()
    controller = run_controller(
        release, f"bench-{uuid.uuid4().hex[:4]}", gates, f"e2e-run={names[0].rsplit('-', 1)[0]}"
    )
    wait_all(kube, release.namespace, names, lambda p: ("csi" in p["spec"]) is converted, 3600)
    seconds = time.monotonic() - started
    requests = controller.metrics()
    release.stop_all()
    total = sum(v for k, v in requests.items() if k.startswith("ballast_migrate_api_requests_total"))
    by_verb: dict[str, float] = {}
    for key, value in requests.items():
        if key.startswith("ballast_migrate_api_requests_total"):
            verb = key.split('verb="', 1)[1].split('"', 1)[0]
            by_verb[verb] = by_verb.get(verb, 0) + value
    return {
        "pvs": len(names),
        "seconds": round(seconds, 1),
        "pvs_per_minute": round(len(names) / seconds * 60, 1),
        "api_requests": int(total),
        "api_requests_per_pv": round(total / len(names), 2),
        "api_requests_per_pv_by_verb": {k: round(v / len(names), 2) for k, v in sorted(by_verb.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pvs", type=int, default=500)
    parser.add_argument("--rebind", type=int, default=10)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    boot = time.monotonic()
    with running_cluster() as cluster:
        kube = cluster.admin()
        with fresh_namespace(kube) as namespace:
            release = migration_release(cluster, namespace)
            figures["setup"] = {
                "kubernetes": cluster.kubernetes_version,
                "cluster_boot_s": round(time.monotonic() - boot, 1),
                "binder_claim_resync": "15s (kube-controller-manager default)",
                "workers": 10,
            }
            try:
                spread = random.Random(14)
                rebind_pvs = ebs_batch(kube, namespace, "rebind", args.rebind, timeout=1800)
                rebinds = [rebind_once(kube, namespace, n, spread.uniform(0, 15)) for n in rebind_pvs]
                samples = [seconds for seconds, _ in rebinds]
                figures["rebind"] = {
                    **summary_ms(samples),
                    "max_ms": round(max(samples) * 1000, 1),
                    "lost_seen": sum(1 for _, lost in rebinds if lost),
                }
                start = time.monotonic()
                names = ebs_batch(kube, namespace, "batch", args.pvs, timeout=1800)
                figures["setup"]["create_and_bind_s"] = round(time.monotonic() - start, 1)
                figures["convert"] = moved(release, kube, names, ALL_GATES, converted=True)
                figures["rollback"] = moved(release, kube, names, NO_GATES, converted=False)
            finally:
                cleanup(release)
    write_result("migration", figures)


if __name__ == "__main__":
    main()
