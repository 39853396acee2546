"""CreateVolume+DeleteVolume over the real socket with the local backend.

Figures: pair throughput at concurrency 1 and 8, and the per-call latency with 5,000 existing volumes
against the empty state (target, issue 3: median within 1.2x), measured on two drivers side by side in
alternating rounds so that host drift does not masquerade as a state-size effect.
Run: .venv/bin/python -m benchmarks.bench_controller [--pairs 400] [--existing 5000] [--rounds 8]
Writes benchmarks/results/controller.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import start_driver, stop_driver, summary_ms, write_result
from csi._proto import csi_pb2, csi_pb2_grpc

AM = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)
TARGET_RATIO = 1.2


def wait_ready(sock: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.exists():
            with grpc.insecure_channel(f"unix://{sock}") as ch:
                try:
                    if csi_pb2_grpc.IdentityStub(ch).Probe(csi_pb2.ProbeRequest(), timeout=1).ready.value:
                        return
                except grpc.RpcError:
                    pass
        time.sleep(0.01)
    raise RuntimeError("driver did not become ready")


def create_req(name: str) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name, volume_capabilities=[CAP], capacity_range=csi_pb2.CapacityRange(required_bytes=1 << 30)
    )


def pairs(sock: Path, prefix: str, count: int, concurrency: int) -> dict[str, Any]:
    """`count` CreateVolume+DeleteVolume pairs spread over `concurrency` clients (one channel each)."""
    create_s, delete_s, elapsed = timed_pairs(sock, prefix, count, concurrency)
    return {
        "concurrency": concurrency,
        "pairs": count,
        "pairs_per_s": round(count / elapsed, 1),
        "create": summary_ms(create_s),
        "delete": summary_ms(delete_s),
    }


def timed_pairs(
    sock: Path, prefix: str, count: int, concurrency: int
) -> tuple[list[float], list[float], float]:
    """(create latencies, delete latencies, wall time) of `count` pairs over `concurrency` clients."""
    create_s: list[float] = []
    delete_s: list[float] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = csi_pb2_grpc.ControllerStub(ch)
            mine_c, mine_d = [], []
            for i in range(w, count, concurrency):
                t0 = time.perf_counter()
                vid = stub.CreateVolume(create_req(f"{prefix}-{i}"), timeout=30).volume.volume_id
                t1 = time.perf_counter()
                stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid), timeout=30)
                t2 = time.perf_counter()
                mine_c.append(t1 - t0)
                mine_d.append(t2 - t1)
            with lock:
                create_s.extend(mine_c)
                delete_s.extend(mine_d)

    start = time.perf_counter()
    with futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return create_s, delete_s, time.perf_counter() - start


def alternating(empty: Path, loaded: Path, count: int, rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-call latency on both drivers, measured in alternating rounds so that drift of the host
    (page-cache writeback, other load) hits both states alike."""
    samples: dict[Path, tuple[list[float], list[float]]] = {empty: ([], []), loaded: ([], [])}
    for r in range(rounds):
        for sock in (empty, loaded) if r % 2 == 0 else (loaded, empty):
            c, d, _ = timed_pairs(sock, f"ab{r}", count // rounds, 1)
            samples[sock][0].extend(c)
            samples[sock][1].extend(d)
    return (
        {"create": summary_ms(samples[empty][0]), "delete": summary_ms(samples[empty][1])},
        {"create": summary_ms(samples[loaded][0]), "delete": summary_ms(samples[loaded][1])},
    )


def populate(sock: Path, count: int) -> float:
    start = time.perf_counter()

    def make(chunk: range) -> None:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = csi_pb2_grpc.ControllerStub(ch)
            for i in chunk:
                stub.CreateVolume(create_req(f"existing-{i}"), timeout=30)

    workers = 16
    with futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(make, [range(w, count, workers) for w in range(workers)]))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--existing", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ctl-") as tmp:
        work = Path(tmp)
        empty_sock, loaded_sock = work / "empty.sock", work / "loaded.sock"
        procs = [
            start_driver(empty_sock, work / "empty", "--mode", "controller"),
            start_driver(loaded_sock, work / "loaded", "--mode", "controller"),
        ]
        try:
            wait_ready(empty_sock)
            wait_ready(loaded_sock)
            fill_s = populate(loaded_sock, args.existing)
            os.sync()  # let the 5,000 new files reach the disk before measuring
            for sock in (empty_sock, loaded_sock):
                pairs(sock, "warmup", 100, 4)
            c1 = pairs(empty_sock, "c1", args.pairs, 1)
            c8 = pairs(empty_sock, "c8", args.pairs, 8)
            loaded_c8 = pairs(loaded_sock, "loaded-c8", args.pairs, 8)
            empty_ab, loaded_ab = alternating(empty_sock, loaded_sock, args.pairs * 2, args.rounds)
        finally:
            for proc in procs:
                stop_driver(proc)
    ratio = loaded_ab["create"]["median_ms"] / empty_ab["create"]["median_ms"]
    ratio_delete = loaded_ab["delete"]["median_ms"] / empty_ab["delete"]["median_ms"]
    write_result(
        "controller",
        {
            "throughput_empty_state": {"concurrency_1": c1, "concurrency_8": c8},
            "throughput_with_existing_volumes": {"concurrency_8": loaded_c8},
            "latency_existing_vs_empty": {
                "existing": args.existing,
                "populate_s": round(fill_s, 2),
                "method": f"concurrency 1, {args.rounds} alternating rounds on two drivers",
                "empty": empty_ab,
                "existing_volumes": loaded_ab,
                "ratio_create_median": round(ratio, 3),
                "ratio_delete_median": round(ratio_delete, 3),
                "target_ratio": TARGET_RATIO,
                "target_met": ratio <= TARGET_RATIO and ratio_delete <= TARGET_RATIO,
            },
        },
    )


if __name__ == "__main__":
    main()
