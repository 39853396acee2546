"""The driver under Kubernetes: claim-created-to-Bound and VolumeAttachment-to-attached on the test bed.

A real control plane (etcd, kube-apiserver, kube-controller-manager) and the real sidecars, deployed
from the chart with the local backend exactly as tests/e2e deploys it (tests/e2e/deploy.py); one node
registered the way kubelet registers it.

- `pvc_to_bound`: 50 claims of an Immediate class created back to back; for each, the time from its
  create call to the first poll (every 20 ms) that sees it Bound: external-provisioner's CreateVolume,
  the PV it writes, and the PV binder binding the pair. `pvc_to_bound_one_at_a_time`: 10 claims, each
  created once the previous one is Bound (the latency of one claim on an idle system).
- `va_to_attached`: VolumeAttachments created one at a time (as the attach-detach controller creates
  them) for bound PVs; the time from the create call to `status.attached`: csi-attacher's
  ControllerPublishVolume and its status patch.

Needs the binaries of scripts/k8s-tools and etcd. Not a test: run it on an idle machine.
Run: .venv/bin/python -m benchmarks.bench_e2e [--claims 50] [--attachments 20]
Writes benchmarks/results/e2e.json.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from benchmarks.common import percentile, write_result
from tests.e2e.cluster import running_cluster
from tests.e2e.conftest import fresh_namespace
from tests.e2e.deploy import deployed_chart, install_snapshot_crds
from tests.e2e.flows.conftest import NAMESPACE, NODE, flavor_values
from tests.e2e.kube import Kube, pvcs, pvs, volume_attachments
from tests.e2e.kubelet import register_node

POLL = 0.02


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "p50_ms": round(percentile(samples, 50) * 1000, 1),
        "p95_ms": round(percentile(samples, 95) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
    }


def claims_to_bound(
    kube: Kube, namespace: str, count: int, prefix: str, one_at_a_time: bool
) -> tuple[list[float], list[str]]:
    """Create `count` claims (back to back, or each once the previous is Bound); seconds from each
    create call to Bound, and the PV names."""
    if one_at_a_time:
        samples: list[float] = []
        names: list[str] = []
        for i in range(count):
            got, pv = claims_to_bound(kube, namespace, 1, f"{prefix}{i}-", one_at_a_time=False)
            samples += got
            names += pv
        return samples, names
    created: dict[str, float] = {}
    for i in range(count):
        name = f"{prefix}{i}"
        body = {
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "immediate",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        created[name] = time.monotonic()
        kube.create(pvcs(namespace), body)
    bound: dict[str, float] = {}
    volumes: list[str] = []
    deadline = time.monotonic() + 300
    while len(bound) < count and time.monotonic() < deadline:
        now = time.monotonic()
        for claim in kube.items(pvcs(namespace)):
            name = claim["metadata"]["name"]
            if name in created and name not in bound and claim.get("status", {}).get("phase") == "Bound":
                bound[name] = now - created[name]
                volumes.append(claim["spec"]["volumeName"])
        time.sleep(POLL)
    if len(bound) < count:
        raise RuntimeError(f"only {len(bound)} of {count} claims bound within 300 s")
    return list(bound.values()), volumes


def attachments_to_attached(kube: Kube, driver: str, node: str, volumes: list[str]) -> list[float]:
    """One VolumeAttachment at a time: seconds from its create call to status.attached."""
    samples = []
    for pv in volumes:
        name = f"bench-{uuid.uuid4().hex[:10]}"
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": pv}},
        }
        start = time.monotonic()
        kube.create(volume_attachments(), body)
        while not (kube.get(volume_attachments(name)).get("status") or {}).get("attached"):
            if time.monotonic() - start > 120:
                raise RuntimeError(f"VolumeAttachment {name} not attached within 120 s")
            time.sleep(POLL)
        samples.append(time.monotonic() - start)
        kube.delete(volume_attachments(name))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--attachments", type=int, default=20)
    args = parser.parse_args()
    boot_start = time.monotonic()
    with running_cluster() as cluster:
        kube = cluster.admin()
        install_snapshot_crds(kube)
        values = flavor_values("local", "")
        with deployed_chart(cluster, values, NAMESPACE, controller_node=NODE) as deployment:
            register_node(kube, deployment, NODE)
            boot = time.monotonic() - boot_start
            with fresh_namespace(kube) as namespace:
                serial, serial_volumes = claims_to_bound(kube, namespace, 10, "one-", one_at_a_time=True)
                bound, volumes = claims_to_bound(kube, namespace, args.claims, "burst-", one_at_a_time=False)
                attached = attachments_to_attached(
                    kube, deployment.driver_name, NODE, volumes[: args.attachments]
                )
                for pv in volumes + serial_volumes:  # leave nothing behind in the backend
                    kube.delete(pvs(pv))
    figures = {
        "setup": {
            "kubernetes": cluster.kubernetes_version,
            "backend": "local",
            "cluster_and_chart_boot_s": round(boot, 1),
        },
        "pvc_to_bound": {**_summary(bound), "claims_created_back_to_back": args.claims},
        "pvc_to_bound_one_at_a_time": _summary(serial),
        "va_to_attached": _summary(attached),
    }
    path = write_result("e2e", figures)
    print(path.read_text())


if __name__ == "__main__":
    main()
