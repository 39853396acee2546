"""Driver start-up to first successful Probe, idle RSS, and Probe latency/throughput at concurrency 1 and 16.

The driver runs as the image runs it: a regular install of this checkout with compiled bytecode
(common.deployed_python), not the dev venv's editable install.

Probe is measured with two clients: Python's grpc client (this process) and a Go gRPC client
(benchmarks/probeclient), which is how kubelet and the sidecars call a driver. The same two clients are
also pointed at two floors, so the driver's figures can be read against them:
- `floor_grpcio`: a grpcio server with an empty Probe, no interceptors, same interpreter and pool size
  (benchmarks/floor_server.py). Driver minus this is what Ballast's own code costs per call.
- `floor_grpc_go`: a grpc-go server with an empty Probe (probeclient -serve): the transport alone.

Run: .venv/bin/python -m benchmarks.bench_startup [--runs 30] [--calls 4000]
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import (
    deployed_python,
    driver_log,
    rss_kib,
    start_driver,
    stop_driver,
    summary_ms,
    write_result,
)
from csi._proto import csi_pb2, csi_pb2_grpc

PROBE_CLIENT_DIR = Path(__file__).resolve().parent / "probeclient"
FLOOR_SERVER = Path(__file__).resolve().parent / "floor_server.py"
WORKERS = "16"  # the driver's --workers default, given to the floor server too


def time_to_first_probe(workdir: Path, python: str) -> tuple[float, int]:
    """Seconds from spawning the driver to its first ready Probe, and its RSS (KiB) a second later."""
    sock = workdir / "csi.sock"
    start = time.perf_counter()
    proc = start_driver(sock, workdir / "data", python=python)
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


def python_probe_load(sock: Path, concurrency: int, calls: int) -> dict[str, float]:
    """Probe figures from Python's grpc client: `concurrency` threads, one channel each."""
    channels = [grpc.insecure_channel(f"unix://{sock}") for _ in range(concurrency)]
    stubs = [csi_pb2_grpc.IdentityStub(c) for c in channels]
    for stub in stubs:
        stub.Probe(csi_pb2.ProbeRequest(), wait_for_ready=True, timeout=30)  # warm up
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


def build_probeclient(workdir: Path) -> str | None:
    """Path of the built Go client, or None when Go is missing (its figures are then left out)."""
    go = shutil.which("go")
    if go is None:
        return None
    binary = workdir / "probeclient"
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=PROBE_CLIENT_DIR, check=True)
    return str(binary)


def go_probe_load(binary: str, sock: Path, concurrency: int, calls: int) -> dict[str, float]:
    argv = [binary, "-endpoint", f"unix://{sock}", "-calls", str(calls), "-concurrency", str(concurrency)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout)
    return {k: round(v, 3) for k, v in figures.items()}


def probe_figures(sock: Path, calls: int, go_client: str | None) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "python_client_c1": python_probe_load(sock, 1, calls),
        "python_client_c16": python_probe_load(sock, 16, calls),
    }
    if go_client:
        figures["go_client_c1"] = go_probe_load(go_client, sock, 1, calls)
        figures["go_client_c16"] = go_probe_load(go_client, sock, 16, calls)
    return figures


@contextmanager
def serving(proc: subprocess.Popen[bytes], sock: Path) -> Iterator[Path]:
    """Wait until `proc` serves on `sock` (at most 30 s), yield it, and stop the process afterwards."""
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.args!r} did not start serving on {sock}")
            time.sleep(0.01)
        yield sock
    finally:
        stop_driver(proc)


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp:
        work = Path(tmp)
        python = deployed_python(work)
        go_client = build_probeclient(work)
        startups, rss = [], []
        for i in range(args.runs):
            run_dir = work / f"run{i}"
            run_dir.mkdir()
            elapsed, kib = time_to_first_probe(run_dir, python)
            startups.append(elapsed)
            rss.append(kib)

        sock = work / "driver.sock"
        with serving(start_driver(sock, work / "load-data", python=python), sock):
            driver = probe_figures(sock, args.calls, go_client)
        sock = work / "grpcio.sock"
        with serving(spawn([python, str(FLOOR_SERVER), str(sock), WORKERS]), sock):
            floors = {"floor_grpcio": probe_figures(sock, args.calls, go_client)}
        if go_client:
            sock = work / "grpcgo.sock"
            with serving(spawn([go_client, "-serve", str(sock)]), sock):
                floors["floor_grpc_go"] = probe_figures(sock, args.calls, go_client)
    write_result(
        "startup",
        {
            "startup_to_first_probe": summary_ms(startups),
            "idle_rss_mib": {
                "median": round(statistics.median(rss) / 1024, 1),
                "max": round(max(rss) / 1024, 1),
            },
            "probe": driver,
            **floors,
            "targets": {"startup_median_ms": 300, "idle_rss_mib": 50, "probe_p50_ms_c1": 0.5},
        },
    )


if __name__ == "__main__":
    main()
