"""Driver start-up to first successful Probe, idle RSS, and Probe latency/throughput at concurrency 1 and 16.

Probe is measured twice: with Python's grpc client (this script) and with a Go gRPC client
(benchmarks/probeclient, built here with `go build`), which is how the Kubernetes sidecars call a driver.

Run: .venv/bin/python -m benchmarks.bench_startup [--runs 10] [--calls 2000]
Writes benchmarks/results/startup.json. Targets (issue 2): start-up median <= 300 ms, idle RSS <= 50 MiB,
Probe p50 at concurrency 1 <= 0.5 ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import grpc

from benchmarks.common import driver_log, rss_kib, start_driver, stop_driver, summary_ms, write_result
from csi._proto import csi_pb2, csi_pb2_grpc


def time_to_first_probe(workdir: Path) -> tuple[float, int]:
    sock = workdir / "csi.sock"
    start = time.perf_counter()
    proc = start_driver(sock, workdir / "data")
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"driver exited: {driver_log(sock)}")
            if sock.exists():
                channel = grpc.insecure_channel(f"unix://{sock}")
                try:
                    resp = csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=1)
                    if resp.ready.value:
                        break
                except grpc.RpcError:
                    pass
                finally:
                    channel.close()
            time.sleep(0.002)
        elapsed = time.perf_counter() - start
        time.sleep(1.0)  # let it settle before reading idle RSS
        return elapsed, rss_kib(proc.pid)
    finally:
        stop_driver(proc)


def probe_load(sock: Path, concurrency: int, calls: int) -> dict[str, float]:
    channels = [grpc.insecure_channel(f"unix://{sock}") for _ in range(concurrency)]
    stubs = [csi_pb2_grpc.IdentityStub(c) for c in channels]
    for stub in stubs:
        stub.Probe(csi_pb2.ProbeRequest())  # warm up
    per_thread = calls // concurrency
    samples: list[list[float]] = [[] for _ in range(concurrency)]

    def worker(i: int) -> None:
        stub, out = stubs[i], samples[i]
        request = csi_pb2.ProbeRequest()
        for _ in range(per_thread):
            t0 = time.perf_counter()
            stub.Probe(request)
            out.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for c in channels:
        c.close()
    flat = [s for chunk in samples for s in chunk]
    return {**summary_ms(flat), "calls_per_second": round(len(flat) / wall, 1)}


PROBE_CLIENT_DIR = Path(__file__).resolve().parent / "probeclient"


def go_probe_load(sock: Path, concurrency: int, calls: int, workdir: Path) -> dict[str, float] | str:
    """Probe figures from the Go client, or why they could not be taken."""
    go = shutil.which("go")
    if go is None:
        return "go not installed"
    binary = workdir / "probeclient"
    built = subprocess.run(
        [go, "build", "-o", str(binary), "."], cwd=PROBE_CLIENT_DIR, capture_output=True, text=True
    )
    if built.returncode != 0:
        return f"go build failed: {built.stderr.strip()[-300:]}"
    argv = [
        str(binary),
        "-endpoint",
        f"unix://{sock}",
        "-calls",
        str(calls),
        "-concurrency",
        str(concurrency),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout)
    return {k: round(v, 3) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp:
        work = Path(tmp)
        startups, rss = [], []
        for i in range(args.runs):
            run_dir = work / f"run{i}"
            run_dir.mkdir()
            elapsed, kib = time_to_first_probe(run_dir)
            startups.append(elapsed)
            rss.append(kib)
        sock = work / "load.sock"
        proc = start_driver(sock, work / "load-data")
        try:
            while not sock.exists():
                time.sleep(0.01)
            c1 = probe_load(sock, 1, args.calls)
            c16 = probe_load(sock, 16, args.calls)
            go_c1 = go_probe_load(sock, 1, args.calls, work)
            go_c16 = go_probe_load(sock, 16, args.calls, work)
        finally:
            stop_driver(proc)
    write_result(
        "startup",
        {
            "startup_to_first_probe": summary_ms(startups),
            "idle_rss_mib": {
                "median": round(statistics.median(rss) / 1024, 1),
                "max": round(max(rss) / 1024, 1),
            },
            "probe_concurrency_1": c1,
            "probe_concurrency_16": c16,
            "probe_go_client_concurrency_1": go_c1,
            "probe_go_client_concurrency_16": go_c16,
            "targets": {"startup_median_ms": 300, "idle_rss_mib": 50, "probe_p50_ms_c1": 0.5},
        },
    )


if __name__ == "__main__":
    main()
