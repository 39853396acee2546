"""Driver start-up to first successful Probe, idle RSS, and Probe latency/throughput at concurrency 1 and 16.

The driver runs as the image runs it: a regular install of this checkout with compiled bytecode
(common.deployed_python), not the dev venv's editable install.

Probe is measured with two clients: Python's grpc client (this process) and a Go gRPC client
(benchmarks/probeclient), which is how kubelet and the sidecars call a driver. The same two clients are
also pointed at two floors, so the driver's figures can be read against them:
- `floor_grpcio`: a grpcio server with an empty Probe, no interceptors, same interpreter and pool size
  (benchmarks/floor_server.py). Driver minus this is what Ballast's own code costs per call.
- `floor_grpc_go`: a grpc-go server with an empty Probe (probeclient -serve): the transport alone.

Start-up is timed with an empty data dir and with 5,000 existing volumes, the two interleaved start by
start (issue 17: at most 1.5x); Probe is measured on the three servers in interleaved rounds (issue 17:
the driver's p50 at concurrency 1 at most 10% above the empty grpcio server's).

Run: .venv/bin/python -m benchmarks.bench_startup [--quick] [--runs 20] [--rounds 5] [--calls 3000]
Writes benchmarks/results/startup.json. Targets (issue 2): start-up median <= 300 ms, idle RSS <= 50 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import (
    Progress,
    deployed_python,
    driver_log,
    load_average,
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
TARGET_STARTUP_RATIO = 1.5  # issue 17: start-up with 5,000 volumes against start-up with none
TARGET_PROBE_RATIO = 1.10  # issue 17: Probe p50 at most 10% above the empty grpcio server


def time_to_first_probe(workdir: Path, python: str, data_dir: Path) -> tuple[float, int]:
    """Seconds from spawning the driver on `data_dir` to its first ready Probe, and its RSS (KiB) a
    second later."""
    sock = workdir / "csi.sock"
    start = time.perf_counter()
    proc = start_driver(sock, data_dir, python=python)
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


def populate(data_dir: Path, count: int) -> None:
    """`count` volumes in a local data dir, made by the driver's own backend code (32 at a time)."""
    from csi.backends.base import DiskOptions
    from csi.backends.local.backend import LocalBackend

    backend = LocalBackend.open(str(data_dir))
    try:
        with futures.ThreadPoolExecutor(32) as pool:
            list(
                pool.map(
                    lambda i: backend.create_volume(f"v{i}", DiskOptions(size_bytes=1 << 30)), range(count)
                )
            )
    finally:
        backend.close()
    os.sync()


def startup_figures(work: Path, python: str, runs: int, existing: int, bar: Progress) -> dict[str, Any]:
    """Start-up to the first ready Probe with an empty data dir and with `existing` volumes, the two
    interleaved start by start; idle RSS of the empty one."""
    empty, loaded = work / "empty-data", work / "loaded-data"
    populate(empty, 0)
    populate(loaded, existing)
    times: dict[str, list[float]] = {"empty": [], "loaded": []}
    rss: list[int] = []
    for i in range(runs):
        order = [("empty", empty), ("loaded", loaded)]
        for label, data in order if i % 2 == 0 else order[::-1]:
            run_dir = work / f"run-{label}-{i}"
            run_dir.mkdir()
            elapsed, kib = time_to_first_probe(run_dir, python, data)
            times[label].append(elapsed)
            if label == "empty":
                rss.append(kib)
        bar.step(note="start-up")
    ratio = statistics.median(times["loaded"]) / statistics.median(times["empty"])
    return {
        "startup_to_first_probe": summary_ms(times["empty"]),
        "startup_with_existing": {"existing": existing, **summary_ms(times["loaded"])},
        "startup_ratio": round(ratio, 3),
        "startup_ratio_target": TARGET_STARTUP_RATIO,
        "startup_ratio_met": ratio <= TARGET_STARTUP_RATIO,
        "idle_rss_mib": {"median": round(statistics.median(rss) / 1024, 1), "max": round(max(rss) / 1024, 1)},
    }


def probe_rounds(
    servers: dict[str, Path], rounds: int, calls: int, go_client: str | None, bar: Progress
) -> dict[str, Any]:
    """Probe p50 at concurrency 1 (Go and Python clients) and Probes/s at concurrency 16 of every
    server, in interleaved rounds; medians of the rounds."""
    names = list(servers)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            rows[name].append(probe_figures(servers[name], calls, go_client))
            bar.step(note=f"probe {name}")
    out: dict[str, Any] = {}
    for name, samples in rows.items():
        out[name] = {
            client: {
                key: round(statistics.median(s[client][key] for s in samples), 3)
                for key in ("p50_ms", "p99_ms", "calls_per_second")
            }
            for client in samples[0]
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer starts, rounds and calls")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--existing", type=int, default=5000)
    args = parser.parse_args()
    runs, rounds, calls = (6, 2, 1000) if args.quick else (args.runs, args.rounds, args.calls)
    load = load_average()
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp:
        work = Path(tmp)
        python = deployed_python(work)
        go_client = build_probeclient(work)
        bar = Progress(runs + rounds * (3 if go_client else 2), "bench_startup")
        startup = startup_figures(work, python, runs, args.existing, bar)
        with ExitStack() as stack:
            servers = {
                "probe": stack.enter_context(
                    serving(
                        start_driver(work / "driver.sock", work / "load-data", python=python),
                        work / "driver.sock",
                    )
                ),
                "floor_grpcio": stack.enter_context(
                    serving(
                        spawn([python, str(FLOOR_SERVER), str(work / "grpcio.sock"), WORKERS]),
                        work / "grpcio.sock",
                    )
                ),
            }
            if go_client:
                servers["floor_grpc_go"] = stack.enter_context(
                    serving(spawn([go_client, "-serve", str(work / "grpcgo.sock")]), work / "grpcgo.sock")
                )
            probes = probe_rounds(servers, rounds, calls, go_client, bar)
    driver, floor = probes["probe"], probes["floor_grpcio"]
    ratios = {client: round(driver[client]["p50_ms"] / floor[client]["p50_ms"], 3) for client in driver}
    write_result(
        "startup",
        {
            "quick": args.quick,
            **startup,
            "probe": driver,
            **{k: v for k, v in probes.items() if k != "probe"},
            "probe_p50_ratio_to_grpcio": ratios,
            "probe_ratio_target": TARGET_PROBE_RATIO,
            "probe_ratio_met": all(ratios[c] <= TARGET_PROBE_RATIO for c in ratios if c.endswith("_c1")),
            "method": (
                f"{runs} interleaved starts of each data dir; "
                f"{rounds} interleaved probe rounds of {calls} calls"
            ),
            "targets": {"startup_median_ms": 300, "idle_rss_mib": 50},
        },
        load,
    )


if __name__ == "__main__":
    main()
