"""Shared benchmark plumbing: start the real driver, percentiles, and writing results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def deployed_python(workdir: Path) -> str:
    """An interpreter that runs this checkout the way the image does: a regular (non-editable) install.

    The dev venv's editable install puts an import hook in front of every start (about 25 ms here), and
    with PYTHONDONTWRITEBYTECODE set it never caches bytecode; `pip install` of the wheel compiles it, as
    the Dockerfile's does. Dependencies come from the dev venv through a .pth line, so nothing is fetched.
    """
    venv, src = workdir / "deployed-venv", workdir / "deployed-src"
    src.mkdir()
    for part in ("pyproject.toml", "README.md", "csi", "shim"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / part, src / part)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(src)], check=True)
    dev_site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "ballast-bench-deps.pth").write_text(dev_site + "\n")
    return str(venv / "bin" / "python")


def start_driver(
    sock: Path, data_dir: Path, *extra: str, python: str = sys.executable
) -> subprocess.Popen[bytes]:
    """The driver as a subprocess on `sock` (`python -m csi`), logging warnings to `<sock>.log`.

    A file rather than a pipe: nobody drains a pipe while the benchmark runs, and a full one hangs the driver.
    """
    argv = [python, "-m", "csi", "--endpoint", f"unix://{sock}", "--data-dir", str(data_dir),
            "--log-level", "warning", *extra]  # fmt: skip
    with open(f"{sock}.log", "ab") as log:
        return subprocess.Popen(argv, cwd=sock.parent, stdout=subprocess.DEVNULL, stderr=log)


def driver_log(sock: Path) -> str:
    """What the driver started by start_driver(sock, ...) logged."""
    path = Path(f"{sock}.log")
    return path.read_text(errors="replace") if path.exists() else ""


def removed(*directories: Path, timeout: float = 30) -> None:
    """Until the driver has removed, in `directories` (its data dir's volumes and snapshots; a missing
    one has nothing), the files of the deletes it answered: it removes them in the background, under
    their set-aside name `.deleting` (csi/backends/local/reaper.py). One still there after `timeout` is
    left as it is. Benchmarks wait untimed, so that work is never counted in, or runs into, what they
    measure next; tests wait before they read the data dir."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        p.name.endswith(".deleting") for d in directories if d.is_dir() for p in d.iterdir()
    ):
        time.sleep(0.001)


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


def _quiet_run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def filesystem(work: Path, fs_type: str, options: list[str], size: int) -> Iterator[Path]:
    """A fresh filesystem on a direct-I/O loop device over a sparse image; removed afterwards."""
    image, mnt = work / f"{fs_type}.img", work / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(size)
    _quiet_run(f"mkfs.{fs_type}", "-q", *options, str(image))
    device = _quiet_run("losetup", "--find", "--show", "--direct-io=on", str(image))
    try:
        _quiet_run("mount", device, str(mnt))
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
        image.unlink()
        mnt.rmdir()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the threads of process `pid` have used, from the scheduler's per-thread
    nanosecond counters (/proc/<pid>/task/*/schedstat), so short runs still resolve tenths of a
    millisecond. Threads that ended are not counted: the servers measured keep their thread pools."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e9


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Progress:
    """A one-line progress bar on stderr for long benchmarks: `step()` after each unit of work."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label, self.done = max(total, 1), label, 0
        self._stream = stream or sys.stderr
        self._start = time.monotonic()
        self._draw()

    def step(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        self._draw(note)
        if self.done == self.total:
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self, note: str = "") -> None:
        width = 30
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self._start
        bar = "#" * filled + "." * (width - filled)
        self._stream.write(f"\r{self.label:<28} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s {note:<24}")
        self._stream.flush()


def _provenance(load_before: list[float] | None) -> dict[str, Any]:
    """When, where, the command that is running and the load average before (if given) and now."""
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m", f"benchmarks.{Path(sys.argv[0]).stem}", *sys.argv[1:]]),
        "host": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "kernel": platform.release(),
            "load_before": load_before,
            "load_after": load_average(),
        },
    }


def write_result(name: str, figures: dict[str, Any], load_before: list[float] | None = None) -> Path:
    """benchmarks/results/<name>.json: the figures with when, where, the command that made them and the
    load average before (if given) and after the run."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, **_provenance(load_before), "figures": figures}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return path


def merge_result(
    name: str, key: str, figures: dict[str, Any], load_before: list[float] | None = None
) -> Path:
    """Replace figures[key] of the existing benchmarks/results/<name>.json by `figures`, which carry their
    own `run` (when, where, command) while the rest of the file keeps the run that made it."""
    path = RESULTS / f"{name}.json"
    doc = json.loads(path.read_text())
    doc["figures"][key] = {**figures, "run": _provenance(load_before)}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["figures"][key], indent=2))
    return path
