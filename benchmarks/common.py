"""Shared benchmark plumbing: start the real driver, percentiles, and writing results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def start_driver(sock: Path, data_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The driver as a subprocess on `sock` (python -m csi), logging warnings to `<sock>.log`.

    A file rather than a pipe: nobody drains a pipe while the benchmark runs, and a full one hangs the driver.
    """
    argv = [sys.executable, "-m", "csi", "--endpoint", f"unix://{sock}", "--data-dir", str(data_dir),
            "--log-level", "warning", *extra]  # fmt: skip
    with open(f"{sock}.log", "ab") as log:
        return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)


def driver_log(sock: Path) -> str:
    """What the driver started by start_driver(sock, ...) logged."""
    path = Path(f"{sock}.log")
    return path.read_text(errors="replace") if path.exists() else ""


def stop_driver(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "median_ms": round(statistics.median(samples) * 1000, 3),
        "p50_ms": round(percentile(samples, 50) * 1000, 3),
        "p99_ms": round(percentile(samples, 99) * 1000, 3),
        "min_ms": round(min(samples) * 1000, 3),
    }


def write_result(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()},
        "figures": figures,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return path
