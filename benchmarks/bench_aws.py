"""EC2 API traffic of the aws backend at scale, against moto behind tests/motoproxy.py.

moto runs as its own process (`python -m moto.server`); the proxy, which counts every EC2 call by action
and holds new volumes `creating` and new attachments `attaching` for a few polls as EC2 does, runs in the
benchmark process; the driver runs as `python -m csi --mode controller --backend aws` pointed at the
proxy, and is driven over its real socket with the Python gRPC client.

Figures:
- `scale`: N volumes created and published (CreateVolume + ControllerPublishVolume, 1 GiB gp3) by C
  concurrent clients, spread over instances with free attach slots, with `--aws-describe-batch-window`
  off and on: EC2 calls per operation (all, and Describe* alone) and p50/p95 latency of one
  create+publish. Target (issue 17): at most 3 Describe calls per operation at concurrency 64 with
  batching on.
- `throttled`: the same at concurrency 64 with batching on while the proxy answers RequestLimitExceeded
  for 10% of all calls (seeded): operations that failed (target 0), calls refused by the proxy, and the
  driver's `ballast_backend_retries_total` read from its /metrics.
- `paging`: EC2 calls for paging ListVolumes through V volumes (10,000), before (the pre-issue-17
  algorithm: a full DescribeVolumes sweep for every page, `base.seek_page`, reproduced here on the same
  backend) and after (one snapshot per listing, listing.py). moto runs as benchmarks.moto_at_scale:
  moto.server with an indexed tag lookup and DescribeVolumes paged by moto, the same pages at a cost
  plain moto cannot reach at 10,000 volumes (that module says why); `--plain-moto` runs it unpatched.

Run: .venv/bin/python -m benchmarks.bench_aws [--quick] [--ops 1000] [--ops-other 200] [--concurrency 8,32,64]
     .venv/bin/python -m benchmarks.bench_aws --only listing [--paging-volumes 10000] [--page 200]
Writes benchmarks/results/aws.json (`--only listing` replaces its `paging` figures and keeps the rest).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench_controller import wait_ready
from benchmarks.common import (
    REPO,
    Progress,
    load_average,
    merge_result,
    percentile,
    start_driver,
    stop_driver,
    write_result,
)
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.aws import AwsBackend
from csi.backends.aws import params as P
from csi.backends.base import seek_page
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import REGION, ZONE, make_client, run_instance

AM = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)
WINDOW = 0.1  # --aws-describe-batch-window for the "on" runs (seconds; the flag allows up to 0.5)
PER_INSTANCE = 20  # volumes published to one instance (m5.large allows 27 besides the root)
HOLD_POLLS = 2  # polls a new volume reads `creating`, a new attachment `attaching`
TARGET_DESCRIBES = 3.0
ACCOUNT = "123456789012"  # moto's default: the driver's requests carry no account header


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_process(module: str = "moto.server") -> Iterator[str]:
    """A fresh moto server in its own process (its own interpreter lock); yields its endpoint. `module`
    is moto.server, or benchmarks.moto_at_scale: the same server, fast with 10,000 tagged volumes."""
    port = free_port()
    env = {**os.environ, "MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "-H", "127.0.0.1", "-p", str(port)],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        stop_driver(proc)


@contextmanager
def aws_driver(work: Path, proxy: MotoProxy, window: float) -> Iterator[tuple[Path, str]]:
    """The controller on `work/<window>.sock` against the proxy; yields (socket, metrics URL)."""
    sock = work / f"ctl-{window}.sock"
    metrics = f"127.0.0.1:{free_port()}"
    env_keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION}
    saved = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)
    try:
        data = work / f"data-{window}"
        data.mkdir(exist_ok=True)
        proc = start_driver(
            sock, data, "--mode", "controller", "--backend", "aws", "--aws-region", REGION,
            "--aws-endpoint-url", proxy.endpoint, "--aws-describe-batch-window", str(window),
            "--metrics-address", metrics, "--workers", "128",
        )  # fmt: skip
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        wait_ready(sock)
        yield sock, f"http://{metrics}/metrics"
    finally:
        stop_driver(proc)


def retries_total(metrics_url: str) -> int:
    """Sum of the driver's ballast_backend_retries_total over operations."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return sum(
        int(float(m.group(1)))
        for m in re.finditer(r"^ballast_backend_retries_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    )


def create_and_publish(stub: Any, name: str, node: str) -> None:
    topology = csi_pb2.TopologyRequirement(
        requisite=[csi_pb2.Topology(segments={"topology.kubernetes.io/zone": ZONE})]
    )
    volume = stub.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name=name, volume_capabilities=[CAP], parameters={"type": "gp3"},
            capacity_range=csi_pb2.CapacityRange(required_bytes=1 << 30), accessibility_requirements=topology,
        ),
        timeout=600,
    ).volume  # fmt: skip
    stub.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume.volume_id, node_id=node, volume_capability=CAP
        ),
        timeout=600,
    )


def scale_run(
    work: Path, ops: int, concurrency: int, window: float, throttle: float = 0.0, label: str = ""
) -> dict[str, Any]:
    """`ops` create+publish operations by `concurrency` clients on a fresh moto; EC2 calls and latency."""
    with moto_process() as moto, running_proxy(moto, seed=17) as proxy:
        ec2 = make_client(moto, ACCOUNT)
        nodes = [run_instance(ec2) for _ in range(-(-ops // PER_INSTANCE))]
        proxy.hold("creating", HOLD_POLLS)
        proxy.hold("attaching", HOLD_POLLS)
        with aws_driver(work, proxy, window) as (sock, metrics_url):
            proxy.calls.clear()
            if throttle:
                proxy.fail("*", "RequestLimitExceeded", rate=throttle)
            bar = Progress(ops, label or f"aws c={concurrency} w={window}")
            latencies: list[float] = []
            failed: list[str] = []
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                stub = csi_pb2_grpc.ControllerStub(channel)

                def one(i: int) -> None:
                    started = time.perf_counter()
                    try:
                        create_and_publish(stub, f"pvc-bench-{i:05d}", nodes[i // PER_INSTANCE])
                        latencies.append(time.perf_counter() - started)
                    except grpc.RpcError as exc:
                        failed.append(f"{exc.code().name}: {exc.details()}")
                    bar.step()

                started = time.perf_counter()
                with futures.ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(one, range(ops)))
                wall = time.perf_counter() - started
            retried = retries_total(metrics_url)
        calls = dict(proxy.calls)
        refused = sum(proxy.refused.values())
    describes = sum(n for action, n in calls.items() if action.startswith("Describe"))
    return {
        "ops": ops,
        "concurrency": concurrency,
        "batch_window_s": window,
        "ec2_calls": calls,
        "ec2_calls_per_op": round(sum(calls.values()) / ops, 2),
        "describe_calls_per_op": round(describes / ops, 2),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p95_ms": round(percentile(latencies, 95) * 1000, 1),
        "ops_per_s": round(ops / wall, 1),
        "failed": len(failed),
        "failures": sorted(set(failed))[:5],
        "refused_by_proxy": refused,
        "driver_retries_total": retried,
    }


def make_listed_volumes(ec2: Any, volumes: int, clients: int = 4) -> None:
    """`volumes` volumes tagged as the driver tags them, made straight in moto by a few concurrent
    clients (the listing is measured, not this)."""
    bar = Progress(volumes, f"aws paging: make {volumes}")
    drawing = threading.Lock()

    def make(i: int) -> None:
        ec2.create_volume(
            AvailabilityZone=ZONE, Size=1,
            TagSpecifications=[{"ResourceType": "volume",
                                "Tags": [{"Key": P.TAG_VOLUME_NAME, "Value": f"pvc-{i:05d}"}]}],
        )  # fmt: skip
        with drawing:
            bar.step()

    with futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(make, range(volumes)))


def page_through(
    backend: AwsBackend, proxy: MotoProxy, mode: str, volumes: int, max_entries: int
) -> dict[str, Any]:
    """One listing from the first page to the last, `before` (a full sweep per page, `base.seek_page`,
    the pre-issue-17 algorithm) or `after` (listing.py); its pages and DescribeVolumes calls."""
    proxy.calls.clear()
    bar = Progress(-(-volumes // max_entries), f"aws paging: {mode}")
    seen, pages, token = 0, 0, ""
    started = time.perf_counter()
    while True:
        if mode == "before":
            page = seek_page(backend._listed(), lambda v: str(v["VolumeId"]), max_entries, token)
        else:
            page = backend._listings.page(max_entries, token)
        seen += len(page.items)
        pages += 1
        token = page.next_token
        bar.step(note=f"{proxy.calls['DescribeVolumes']} DescribeVolumes")
        if not token:
            break
    return {
        "pages": pages,
        "listed": seen,
        "describe_volumes_calls": proxy.calls["DescribeVolumes"],
        "seconds": round(time.perf_counter() - started, 2),
    }


def paging_run(volumes: int, max_entries: int, moto: str) -> dict[str, Any]:
    """EC2 calls to page ListVolumes through `volumes` volumes, `max_entries` a page, before and after."""
    with moto_process(moto) as endpoint, running_proxy(endpoint) as proxy:
        make_listed_volumes(make_client(endpoint, ACCOUNT), volumes)
        backend = AwsBackend(make_client(proxy.endpoint, ACCOUNT), zone=ZONE, node_id="", imds=None)
        try:
            figures: dict[str, Any] = {
                "volumes": volumes,
                "max_entries": max_entries,
                "ec2_page": backend.ec2.page_size,
                "moto": moto,
            }
            for mode in ("before", "after"):
                figures[mode] = page_through(backend, proxy, mode, volumes, max_entries)
        finally:
            backend.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="40 operations at 8 and 64, 300 volumes to page 50 a page"
    )
    parser.add_argument("--ops", type=int, default=1000, help="operations at the highest concurrency")
    parser.add_argument("--ops-other", type=int, default=200, help="operations at the other levels")
    parser.add_argument("--concurrency", default="8,32,64")
    parser.add_argument("--paging-volumes", type=int, default=10_000)
    parser.add_argument("--page", type=int, default=200, help="ListVolumes max_entries")
    parser.add_argument(
        "--only", choices=["listing"],
        help="run only the ListVolumes paging, and put its figures into the existing aws.json",
    )  # fmt: skip
    parser.add_argument(
        "--plain-moto", action="store_true",
        help="page against moto.server as installed instead of benchmarks.moto_at_scale (only a few "
        "thousand volumes are feasible: one DescribeVolumes costs moto O(volumes²))",
    )  # fmt: skip
    args = parser.parse_args()
    ops, other = (40, 40) if args.quick else (args.ops, args.ops_other)
    volumes, page = (300, 50) if args.quick else (args.paging_volumes, args.page)
    moto = "moto.server" if args.plain_moto else "benchmarks.moto_at_scale"
    load_before = load_average()
    if args.only == "listing":
        merge_result("aws", "paging", paging_run(volumes, page, moto), load_before)
        return
    levels = [8, 64] if args.quick else sorted(int(c) for c in args.concurrency.split(","))
    top = levels[-1]
    figures: dict[str, Any] = {
        "setup": {
            "moto": "moto.server in its own process, behind tests/motoproxy.py",
            "hold_polls": HOLD_POLLS,
            "volumes_per_instance": PER_INSTANCE,
            "batch_window_s": WINDOW,
        },
        "complete": False,
        "scale": [],
        "target_describe_calls_per_op": TARGET_DESCRIBES,
    }
    with tempfile.TemporaryDirectory(prefix="ballast-bench-aws-") as tmp:
        work = Path(tmp)
        for c in levels:  # results are written after every run: a long run that fails keeps what it had
            for window in (0.0, WINDOW):
                figures["scale"].append(scale_run(work, ops if c == top else other, c, window))
                write_result("aws", figures, load_before)
        throttled = scale_run(work, ops, top, WINDOW, throttle=0.1, label="aws throttled 10%")
        figures["throttled"] = {**throttled, "rate": 0.1, "target_failed": 0, "met": throttled["failed"] == 0}
        write_result("aws", figures, load_before)
    figures["paging"] = paging_run(volumes, page, moto)
    on_top = next(r for r in figures["scale"] if r["concurrency"] == top and r["batch_window_s"] > 0)
    figures["describe_target_met"] = on_top["describe_calls_per_op"] <= TARGET_DESCRIBES
    figures["complete"] = True
    write_result("aws", figures, load_before)


if __name__ == "__main__":
    main()
