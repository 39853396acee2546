"""docs/performance.md and its plots, from benchmarks/results/*.json.

`python -m benchmarks.report` runs the benchmarks of the suite (each with a progress bar; `--quick`
runs their quick modes, under two minutes together) and then renders; `--from-results` renders what
benchmarks/results/ already holds. Results other issues write there (e2e, cbt, soak, translate,
migration) are rendered when present and said to be "not measured" otherwise; the results this page's
targets rest on (startup, controller, node, aws) are required: a missing or malformed one stops the
report with a ReportError naming the file and the key.

Every figure stands beside the command that measured it, the machine, the date and the side-by-side
reference; a target that was missed is written as missed, with the measured reason.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, RESULTS
from csi.filesystems import mke2fs_version, zeroed_flags

DOC = REPO / "docs" / "performance.md"
PLOTS = "img"  # under docs/: docs/img/perf-*.png


MOTO_AT_SCALE = (
    "moto as installed costs O(N²) per DescribeVolumes over N tagged volumes (every volume's tags are found "
    "by scanning every tag in the region, once to filter and once to answer) and renders every match on "
    "every page, so the paging runs against `benchmarks/moto_at_scale.py`: the same moto server with the "
    "tag lookup indexed and DescribeVolumes paged by moto itself instead of by the proxy, a change to moto's "
    "speed and not to the answers the driver reads (tests/aws/test_moto_at_scale.py holds the two to the "
    "same answers on one state; only the NextToken text differs)"
)
PAGING_TARGET = 10_000


class ReportError(Exception):
    """A results file the report needs is missing or malformed."""


@dataclass(frozen=True)
class Bench:
    name: str  # results/<name>.json
    module: str  # benchmarks.<module>
    required: bool  # the issue-17 targets rest on it
    in_suite: bool  # run by `python -m benchmarks.report` (the others need a test bed or many minutes)
    quick: tuple[str, ...] = ("--quick",)
    root: bool = False


BENCHES = (
    Bench("startup", "bench_startup", True, True),
    Bench("controller", "bench_controller", True, True),
    Bench("node", "bench_node", True, True, root=True),
    Bench("aws", "bench_aws", True, True),
    Bench("translate", "bench_translate", False, True, quick=("--objects", "2000", "--runs", "2")),
    Bench("e2e", "bench_e2e", False, False),
    Bench("cbt", "bench_cbt", False, False),
    Bench("soak", "soak", False, False),
    Bench("migration", "bench_migration", False, False),
)


# ---------------------------------------------------------------------------- reading results


class Result:
    """One results file: `get("a.b.c")` reads a figure, raising ReportError when it is absent."""

    def __init__(self, bench: Bench, doc: dict[str, Any], path: Path) -> None:
        self.bench, self.doc, self.path = bench, doc, path

    def get(self, dotted: str) -> Any:
        node: Any = self.doc.get("figures", {})
        for part in dotted.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise ReportError(f"{self.path.name}: figure {dotted!r} is missing")
        return node

    def num(self, dotted: str) -> float:
        value = self.get(dotted)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ReportError(f"{self.path.name}: figure {dotted!r} is not a number: {value!r}")
        return float(value)

    @property
    def command(self) -> str:
        return str(self.doc.get("command") or f"python -m benchmarks.{self.bench.module}")

    @property
    def when(self) -> str:
        return str(self.doc.get("when", "unknown date"))

    @property
    def machine(self) -> str:
        host = self.doc.get("host") or {}
        if not host:
            return "machine not recorded"
        parts = [f"{host.get('cpus', '?')} CPUs {host.get('machine', '')}".strip()]
        if host.get("kernel"):
            parts.append(f"Linux {host['kernel']}")
        if host.get("python"):
            parts.append(f"Python {host['python']}")
        if host.get("load_before"):
            parts.append(f"load before {host['load_before'][0]}")
        return ", ".join(parts)

    def provenance(self) -> str:
        return f"`{self.command}` · {self.machine} · {self.when} · `benchmarks/results/{self.path.name}`"


def load(bench: Bench, results: Path) -> Result | None:
    """The bench's results, None when an optional one is absent; ReportError when unusable."""
    path = results / f"{bench.name}.json"
    if not path.exists():
        if bench.required:
            raise ReportError(f"{path.name} is missing: run `python -m benchmarks.{bench.module}`")
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("figures"), dict):
        raise ReportError(f"{path.name}: no 'figures' object")
    return Result(bench, doc, path)


# ---------------------------------------------------------------------------- formatting


def ms(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def one_sweep(paging: dict[str, Any]) -> int:
    """DescribeVolumes calls of one listing sweep in the paging run: its volumes all carry the first
    listed tag key (N / EC2's page, rounded up) and none the second (one call)."""
    return -(-int(paging["volumes"]) // int(paging["ec2_page"])) + 1


def verdict(met: bool, reason: str = "") -> str:
    return "met" if met else f"**missed**{': ' + reason if reason else ''}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def concurrency_levels(node: dict[str, Any]) -> list[int]:
    return sorted(int(k.split("_")[-1]) for k in node if k.startswith("concurrency_"))


# ---------------------------------------------------------------------------- sections


def section_targets(r: dict[str, Result | None]) -> list[str]:
    """The issue-17 scoreboard: one line per target, each with its measured figure."""
    ctl, node, start, aws = r["controller"], r["node"], r["startup"], r["aws"]
    assert ctl and node and start and aws
    rows = []
    over = {c: ctl.num(f"create_cpu_overhead_ms.concurrency_{c}") for c in (1, 8)}
    target = ctl.num("target_overhead_ms")
    rows.append(
        (
            "driver CPU per CreateVolume above the grpcio floor",
            f"<= {target} ms",
            f"{over[1]:.2f} ms (c=1), {over[8]:.2f} ms (c=8)",
            verdict(max(over.values()) <= target, _controller_reason(ctl)),
        )
    )
    for fs in ("ext4", "xfs"):
        ratio = node.num(f"{fs}.ratio_median")
        rows.append(
            (
                f"node cycle / tool floor, {fs} 1 GiB",
                f"<= {node.num('target_ratio')}x",
                f"{ratio:.3f}x",
                verdict(ratio <= node.num("target_ratio"), _cycle_reason(node, fs)),
            )
        )
        over_mkfs = node.num(f"{fs}.stage_minus_mkfs_ms")
        limit = node.num("target_stage_over_mkfs_ms")
        rows.append(
            (
                f"NodeStageVolume - mkfs, {fs}",
                f"<= {limit} ms",
                f"{over_mkfs:.2f} ms",
                verdict(over_mkfs <= limit, _stage_reason(node, fs)),
            )
        )
    ratio = start.num("startup_ratio")
    rows.append(
        (
            "start-up with 5,000 volumes / with none",
            f"<= {start.num('startup_ratio_target')}x",
            f"{ratio:.2f}x",
            verdict(bool(start.get("startup_ratio_met"))),
        )
    )
    top = max(aws.get("scale"), key=lambda s: (s["concurrency"], s["batch_window_s"]))
    rows.append(
        (
            f"EC2 Describe calls per create+publish, c={top['concurrency']}, batching on",
            f"<= {aws.num('target_describe_calls_per_op')}",
            f"{top['describe_calls_per_op']}",
            verdict(bool(aws.get("describe_target_met"))),
        )
    )
    throttled = aws.get("throttled")
    rows.append(
        (
            f"operations failed with {throttled['rate']:.0%} RequestLimitExceeded",
            "0",
            f"{throttled['failed']} of {throttled['ops']}",
            verdict(throttled["failed"] == 0),
        )
    )
    paging = aws.get("paging")
    before, after = paging["before"]["describe_volumes_calls"], paging["after"]["describe_volumes_calls"]
    sweep = one_sweep(paging)
    rows.append(
        (
            f"EC2 calls to page ListVolumes through {paging['volumes']:,} volumes",
            "O(N/500), not O(N²/page)",
            f"{before} before, {after} after",
            verdict(
                paging["volumes"] >= PAGING_TARGET and after <= sweep < before,
                f"measured at {paging['volumes']:,}, not {PAGING_TARGET:,}"
                if paging["volumes"] < PAGING_TARGET
                else f"{after} calls after, more than one sweep ({sweep})",
            ),
        )
    )
    ratios = start.get("probe_p50_ratio_to_grpcio")
    at_1 = {k: v for k, v in ratios.items() if k.endswith("_c1")}
    rows.append(
        (
            "Probe p50 at concurrency 1 / empty grpcio server",
            f"<= {start.num('probe_ratio_target')}x",
            ", ".join(f"{v:.3f}x ({k.replace('_', ' ')})" for k, v in ratios.items()),
            verdict(max(at_1.values()) <= start.num("probe_ratio_target")),
        )
    )
    return ["## Targets (issue 17)", "", *table(("target", "bound", "measured", "verdict"), rows)]


def _controller_reason(ctl: Result) -> str:
    floor = ctl.doc["figures"].get("durable_floor", {}).get("data_dir")
    if floor:
        over = ctl.num("create_cpu_overhead_ms.concurrency_1")
        return (
            f"the system calls that make a create durable cost {floor['total']:.2f} ms of CPU by themselves "
            f"on this machine (a plain loop in the same run: {_phases(floor)}), more than the bound before "
            f"any driver code runs; the driver's own code adds {over - floor['total']:.2f} ms at c=1"
            f"{_batched_clause(floor, ctl.num('target_overhead_ms'))} (see Controller)"
        )
    profile = ctl.doc["figures"].get("profile")
    if not profile:
        return "no profile in controller.json"
    kinds = ", ".join(f"{p['where']} {p['cpu_ms']:.2f} ms" for p in profile["by_kind"][:4])
    return f"the profiled create spends {kinds} (see Controller)"


def _batched_clause(floor: dict[str, Any], target: float) -> str:
    """At c=8 group commit shares the directory fsync and the WAL commit among a batch; what each create
    still makes alone is its own file: whether that alone exceeds the bound."""
    alone = floor["create file"] + floor["fsync file"]
    if alone <= target:
        return ""
    return (
        f"; at c=8, where group commit shares the directory fsync and the WAL commit among the calls of a "
        f"batch, the calls each create makes alone (create file and fsync file, {alone:.2f} ms) still "
        "exceed the bound"
    )


def _phases(floor: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in floor.items() if k not in ("total", "filesystem"))


def _fs_label(name: str, facts: dict[str, Any]) -> str:
    has = facts.get("journal")
    journal = "" if has is None else " with a journal" if has else " without a journal"
    where = f" mounted at {facts['mount']}" if name == "data_dir" else " on a loop device"
    return f"{facts['type']}{journal}{where}"


def _deferred_file(wal: float, own: float, target: float) -> str:
    """What creating the volume's file at its first attach instead would leave in CreateVolume."""
    verdict = "still above" if wal + own > target else "within"
    return (
        " Creating the volume's file later (at its first attach, recovery making it anew from the record "
        "after a crash, as it holds zeros until then) would take the file's calls out of CreateVolume, but "
        f"leave the WAL commit ({wal:.2f} ms) and the driver's own code ({own:.2f} ms): {wal + own:.2f} ms, "
        f"{verdict} the bound."
    )


def section_durable_floor(ctl: Result) -> list[str]:
    """What of Ballast's overhead over the grpcio floor the operating system takes (issue 17, target 1)."""
    floors = ctl.doc["figures"].get("durable_floor")
    if not floors:
        return []
    names = list(floors)
    labels = {"data_dir": "beside the data dir", "ext4_journal": "fresh ext4 with a journal"}
    header = ("system calls of a durable create", *(labels.get(n, n) for n in names))
    phases = [k for k in floors[names[0]] if k != "filesystem"]
    rows = [(p, *(f"{floors[n][p]:.3f} ms" for n in names)) for p in phases]
    over = ctl.num("create_cpu_overhead_ms.concurrency_1")
    target = ctl.num("target_overhead_ms")
    here = floors["data_dir"]
    out = [
        "### The durable floor",
        "",
        "The system calls a power-safe create cannot skip (the sparse file created and sized, its fsync, "
        "its directory's fsync, the record's SQLite commit with the WAL synced), made by a plain Python "
        "loop with no gRPC and no driver code (benchmarks/durable_floor.py), in rounds interleaved with "
        "the rounds above at concurrency 1; CPU per create (user and system) on the thread's clock. "
        "Filesystems: "
        + "; ".join(f"{labels.get(n, n)}: {_fs_label(n, floors[n]['filesystem'])}" for n in names)
        + ".",
        "",
        *table(header, rows),
        f"At concurrency 1 Ballast spends {over:.2f} ms above the grpcio floor; {here['total']:.2f} ms "
        f"of it are these system calls, {over - here['total']:.2f} ms the driver's own code (its "
        "interceptors, validation, the handler, group commit, SQLite's Python calls, the reply)."
        + (f" The bound of {target} ms is below these system calls alone." if here["total"] > target else "")
        + _deferred_file(here["WAL commit"], over - here["total"], target),
        "",
    ]
    journaled = floors.get("ext4_journal")
    if (
        here["filesystem"].get("journal") is False
        and journaled
        and here["create file"] > 2 * journaled["create file"]
    ):
        out[-2] += (
            " The data dir's ext4 has no journal: such an ext4 looks at every recently deleted inode it "
            "passes over when it allocates a new one (the kernel's recently_deleted check), so creating a "
            f"file after many deletes took {here['create file']:.3f} ms there against "
            f"{journaled['create file']:.3f} ms on the ext4 with a journal."
        )
    if journaled and journaled["total"] < target:
        out[-2] += (
            f" On the ext4 with a journal the same calls cost {journaled['total']:.2f} ms, which would leave "
            f"{target - journaled['total']:.2f} ms of the bound for the driver's own code: less than the "
            f"{over - here['total']:.2f} ms it spends, so there too the bound would be missed."
            if over - here["total"] > target - journaled["total"]
            else f" On the ext4 with a journal the same calls cost {journaled['total']:.2f} ms."
        )
    return out


# What the runtime items of the create profile are, in the create path.
PROFILE_ITEMS = {
    "runtime: <built-in method posix.open>": "opening the new volume's file, and its directory to fsync it",
    "runtime: <method 'execute' of 'sqlite3.Connection' objects>": (
        "SQLite's statements: the name lookup, the insert, and the commit with its WAL sync"
    ),
    "runtime: <built-in method posix.fsync>": "the fsyncs of the new file and its directory",
}


def _largest_item(profile: dict[str, Any]) -> str:
    first = profile["top"][0]
    what = PROFILE_ITEMS.get(first["where"])
    kinds = {k["where"]: k["share"] for k in profile["by_kind"]}
    system = sum(v for k, v in kinds.items() if k.startswith(("system calls", "SQLite")))
    own = sum(v for k, v in kinds.items() if "Python" in k)
    return (
        f"The largest single item is `{first['where']}` ({first['cpu_ms']:.2f} ms, {first['share']:.0%})"
        + (f": {what}" if what else "")
        + f". System calls and SQLite take {system:.0%} of the profiled CPU, the driver's and the local "
        f"backend's own Python {own:.0%}."
    )


def section_controller(ctl: Result, plots: dict[str, str]) -> list[str]:
    out = [
        "## Controller: CreateVolume and DeleteVolume (`bench_controller`)",
        "",
        ctl.provenance(),
        "",
        f"Method: {ctl.get('method')}. References, same run: `floor_grpcio` (benchmarks/floor_server.py: "
        "the same RPC shapes answered by empty grpcio handlers, same interpreter and pool) and "
        "`floor_grpc_go` (an empty grpc-go server, `probeclient -serve`). The local backend, with its "
        "fsyncs and group commit in place.",
        "",
    ]
    rows: list[tuple[Any, ...]] = []
    for c in concurrency_levels(ctl.get("cpu_per_call")):
        cpu = ctl.get(f"cpu_per_call.concurrency_{c}")
        rows.append(
            (
                c,
                ms(cpu["ballast"]["create_cpu_ms"]),
                ms(cpu["floor_grpcio"]["create_cpu_ms"]),
                ms(cpu["floor_grpc_go"]["create_cpu_ms"]),
                ms(ctl.num(f"create_cpu_overhead_ms.concurrency_{c}")),
            )
        )
    out += ["Server CPU per CreateVolume (all threads, from schedstat):", ""]
    out += table(("concurrency", "Ballast", "grpcio floor", "grpc-go floor", "Ballast - grpcio floor"), rows)
    rows = []
    for c in concurrency_levels(ctl.get("throughput")):
        t = ctl.get(f"throughput.concurrency_{c}")
        b, f, g = (t[k]["pairs_per_s"] for k in ("ballast", "floor_grpcio", "floor_grpc_go"))
        rows.append((c, f"{b:,.0f}", f"{f:,.0f}", f"{g:,.0f}", f"{b / f:.2f}x"))
    out += ["Create+delete pairs per second:", ""]
    out += table(("concurrency", "Ballast", "grpcio floor", "grpc-go floor", "Ballast / grpcio"), rows)
    out += [f"![throughput against concurrency]({plots['throughput']})", ""]
    out += section_durable_floor(ctl)
    profile = ctl.doc["figures"].get("profile")
    out += ["### What the CPU is spent on", ""]
    if not profile:
        out += ["not profiled in this results file (bench_controller writes `profile` since issue 17)", ""]
    else:
        out += [
            f"{profile['method']}: {profile['cpu_ms_per_create']:.2f} ms of CPU per create under the "
            "profiler (which inflates the Python share). By kind:",
            "",
        ]
        out += table(
            ("where", "CPU ms per create", "share"),
            [(p["where"], f"{p['cpu_ms']:.3f}", f"{p['share']:.0%}") for p in profile["by_kind"]],
        )
        out += ["The functions with the most CPU of their own:", ""]
        out += table(
            ("function", "CPU ms per create", "share"),
            [(f"`{p['where']}`", f"{p['cpu_ms']:.3f}", f"{p['share']:.0%}") for p in profile["top"]],
        )
        out += [_largest_item(profile), ""]
    levels = ctl.get("existing_volumes")
    rows = [
        (f"{lv['existing']:,}", ms(lv["create_median_ms"]), ms(lv["empty_median_ms"]), f"{lv['ratio']:.2f}x")
        for lv in levels
    ]
    out += [
        "CreateVolume latency with existing volumes (median; an empty driver measured in alternating "
        "rounds beside it):",
        "",
    ]
    out += table(("existing volumes", "create", "empty driver", "ratio"), rows)
    out += [f"![create latency against existing volumes]({plots['existing']})", ""]
    return out


def _cycle_reason(node: Result, fs: str) -> str:
    """Why the node cycle misses: its calls against the floor's programs, and what an RPC costs alone."""
    calls, programs = node.get(f"{fs}.driver_calls"), node.get(f"{fs}.tool_floor_steps")
    rpc = node.num(f"{fs}.empty_rpc.median_ms")
    return (
        f"the cycle took {node.num(f'{fs}.driver_cycle.median_ms'):.1f} ms, the floor "
        f"{node.num(f'{fs}.tool_floor.median_ms'):.1f} ms; the cycle is {len(calls)} RPCs, each at least "
        f"the {rpc:.2f} ms of an RPC that does nothing ({len(calls) * rpc:.1f} ms together), the floor "
        f"{len(programs)} programs; by call: "
        + ", ".join(f"{k} {v['median_ms']:.1f}" for k, v in calls.items())
        + "; by program: "
        + ", ".join(f"{k} {v['median_ms']:.1f}" for k, v in programs.items())
        + " (medians, ms)"
    )


def _stage_reason(node: Result, fs: str) -> str:
    """Why stage - mkfs misses, part by part: mount(2), the driver's other steps (traced in the same
    rounds), the round trip of an RPC that does nothing, mkfs inside the stage against mkfs alone, and
    the rest, which is the spread between medians."""
    mount = node.num(f"{fs}.stage_steps_ms.mount(2)")
    floor = node.num(f"{fs}.tool_floor_steps.mount.median_ms")
    steps = node.get(f"{fs}.stage_steps_ms")
    beyond = {k: v for k, v in steps.items() if k not in ("mkfs", "mount(2)", "total")}
    rpc = node.num(f"{fs}.empty_rpc.median_ms")
    mkfs_gap = node.num(f"{fs}.stage_steps_ms.mkfs") - node.num(f"{fs}.tool_floor_steps.mkfs.median_ms")
    rest = node.num(f"{fs}.stage_minus_mkfs_ms") - mount - sum(beyond.values()) - rpc - mkfs_gap
    over_alone = mount > node.num("target_stage_over_mkfs_ms")
    alone = ", more than the whole allowance by itself" if over_alone else ""
    reason = (
        f"mount(2) of a fresh {fs} alone takes {mount:.1f} ms{alone} (the tool floor's `mount` program, "
        f"its start included, {floor:.1f} ms); beyond mkfs and mount(2) the traced stage spends "
        f"{sum(beyond.values()):.1f} ms ("
        + ", ".join(f"{k.split(' (')[0]} {v:.2f}" for k, v in beyond.items())
        + f"); an RPC that does nothing takes {rpc:.1f} ms with this client (NodeGetCapabilities, same "
        f"run); mkfs inside the traced stage took {mkfs_gap:+.1f} ms against mkfs alone; the rest, "
        f"{rest:+.1f} ms, is the stage served over RPC beyond the traced stage and an empty RPC, and the "
        "spread between medians"
    )
    a = _anatomy(node, fs)
    if "total" in a:
        reason += (
            f"; traced in the kernel: {a['reads_before_writes'] + a['reads_after_writes']:.0f} reads one at "
            f"a time through the loop device, {a['written_bytes'] / 1024**2:.1f} MiB of log written, "
            f"{a['kernel_threads_started']:.0f} kernel threads started (see Node cycle)"
        )
    return reason


def _anatomy(node: Result, fs: str) -> dict[str, Any]:
    """The kernel trace of mount(2) for `fs`; {} in results from before bench_node traced it."""
    try:
        found = node.get(f"{fs}.mount_anatomy_ms")
    except ReportError:
        return {}
    return found if isinstance(found, dict) else {}


ANATOMY_ROWS = (
    ("setup: device, superblock, work queues and their threads", "setup"),
    ("reads up to the first write", "reads"),
    ("writes, to the last one's completion", "writes"),
    ("finish: later reads, to the return", "finish"),
    ("total (traced)", "total"),
    ("mount(2) wall time, same runs", "wall_ms"),
    ("read requests before / after the writes", None),
    ("bytes written", "written_bytes"),
    ("kernel threads started", "kernel_threads_started"),
)


def section_mount_anatomy(node: Result) -> list[str]:
    """mount(2) of a fresh filesystem split into phases by the kernel's tracepoints (bench_node)."""
    got = {fs: _anatomy(node, fs) for fs in ("ext4", "xfs")}
    if not any("total" in a for a in got.values()):
        why = "; ".join(f"{fs}: {a.get('unavailable', 'not measured')}" for fs, a in got.items())
        return [f"mount(2) was not traced in the kernel ({why}).", ""]
    runs = max(int(a.get("runs", 0)) for a in got.values())
    out = [
        f"mount(2) of a filesystem fresh from the plain `mkfs.<fs> -q` on a fresh loop device, split at its "
        f"I/O by the kernel's own tracepoints (benchmarks/mount_trace.py; medians of {runs}, ms):",
        "",
    ]

    def cell(a: dict[str, Any], key: str | None) -> str:
        if "total" not in a:
            return "-"
        if key is None:
            return f"{a['reads_before_writes']:.0f} / {a['reads_after_writes']:.0f}"
        if key == "written_bytes":
            return f"{a[key] / 1024**2:.2f} MiB"
        return f"{a[key]:.0f}" if key == "kernel_threads_started" else f"{a[key]:.3f}"

    out += table(
        ("phase", "ext4", "xfs"),
        [(label, *(cell(got[fs], key) for fs in got)) for label, key in ANATOMY_ROWS],
    )
    return out


def section_node(node: Result, plots: dict[str, str]) -> list[str]:
    mke2fs = mke2fs_version(node.get("tools").get("mkfs.ext4", ""))  # the benchmark's, not this host's
    xfs_zeroed, ext_zeroed = (" ".join(zeroed_flags(fs, mke2fs)) for fs in ("xfs", "ext4"))
    out = [
        "## Node cycle (`bench_node`, root)",
        "",
        node.provenance(),
        "",
        f"Method: {node.get('method')}; {node.get('volume')}. Cycle: CreateVolume, ControllerPublish, "
        "NodeStage (loop device, blank check, mkfs, mount), NodePublish, NodeUnpublish, NodeUnstage, "
        "ControllerUnpublish, DeleteVolume; as a CO does, the client makes the staging directory and "
        "the target's parent before it calls. Reference, same run: the tool floor `truncate -s 1G`, "
        "`losetup --find --show`, `mkfs.<fs> -q`, `mount`, `umount`, `losetup -d`. The floor runs mkfs "
        "with its defaults; the driver formats a volume it proved never written as zeroed storage "
        f"(`mkfs.xfs {xfs_zeroed}`; mke2fs `{ext_zeroed}`), "
        "as the traced stage's mkfs row shows. Tools: "
        + ", ".join(f"{k} ({v})" for k, v in node.get("tools").items())
        + ".",
        "",
    ]
    rows = []
    for fs in ("ext4", "xfs"):
        f = node.get(fs)
        rows.append(
            (
                fs,
                ms(f["driver_cycle"]["median_ms"]),
                ms(f["tool_floor"]["median_ms"]),
                f"{f['ratio_median']:.2f}x",
                ms(f["driver_calls"]["stage"]["median_ms"]),
                ms(f["tool_floor_steps"]["mkfs"]["median_ms"]),
                f"{f['stage_minus_mkfs_ms']:.2f} ms",
                ms(f["empty_rpc"]["median_ms"]),
            )
        )
    header = ("fs", "driver cycle", "tool floor", "ratio", "NodeStage", "mkfs", "stage - mkfs", "empty RPC")
    out += table(header, rows)
    out += [
        "Empty RPC: NodeGetCapabilities on the cycle's channel after each cycle, what the client and gRPC "
        "add to every call, NodeStage included.",
        "",
    ]
    out += ["One stage traced step by step in-process (ms):", ""]
    steps = list(node.get("ext4.stage_steps_ms"))
    out += table(
        ("step", "ext4", "xfs"),
        [
            (s, node.get(f"ext4.stage_steps_ms.{s}"), node.get("xfs.stage_steps_ms").get(s, "-"))
            for s in steps
        ],
    )
    out += section_mount_anatomy(node)
    out += [f"![node cycle beside the tool floor]({plots['node']})", ""]
    return out


def section_startup(start: Result) -> list[str]:
    out = [
        "## Start-up and Probe (`bench_startup`)",
        "",
        start.provenance(),
        "",
        f"Method: {start.get('method')}. The driver runs the way the image runs it (a regular install "
        "with bytecode compiled at install time).",
        "",
    ]
    out += table(
        ("figure", "Ballast", "reference"),
        [
            ("start-up to first ready Probe, median", ms(start.num("startup_to_first_probe.median_ms")), "-"),
            (
                f"start-up with {start.num('startup_with_existing.existing'):,.0f} volumes, median",
                ms(start.num("startup_with_existing.median_ms")),
                f"{start.num('startup_ratio'):.2f}x the start with none",
            ),
            ("idle RSS", f"{start.num('idle_rss_mib.median')} MiB", "-"),
        ],
    )
    rows = []
    for client in start.get("probe"):
        rows.append(
            (
                client.replace("_", " "),
                ms(start.num(f"probe.{client}.p50_ms")),
                ms(start.num(f"floor_grpcio.{client}.p50_ms")),
                ms(start.num(f"floor_grpc_go.{client}.p50_ms")),
                f"{start.num(f'probe_p50_ratio_to_grpcio.{client}'):.3f}x",
            )
        )
    out += ["Probe p50 against an empty grpcio server and an empty grpc-go server, same run:", ""]
    out += table(("client", "Ballast", "grpcio floor", "grpc-go floor", "Ballast / grpcio"), rows)
    out += [
        "The time is grpcio's: its Python server hands every call between its polling thread and a "
        "pool thread several times. The floor is stated and not chased further (issue 17).",
        "",
    ]
    return out


def section_aws(aws: Result, plots: dict[str, str]) -> list[str]:
    setup = aws.get("setup")
    out = [
        "## EBS API traffic (`bench_aws`)",
        "",
        aws.provenance(),
        "",
        f"Against {setup['moto']}, which holds each new volume `creating` and each new attachment "
        f"`attaching` for {setup['hold_polls']} polls. Each operation is CreateVolume + "
        f"ControllerPublishVolume of a 1 GiB gp3 volume ({setup['volumes_per_instance']} per instance), "
        f"through the driver's socket. Batching on: `--aws-describe-batch-window={setup['batch_window_s']}`. "
        "Reference: the same run with batching off.",
        "",
    ]
    rows = [
        (
            s["concurrency"],
            s["ops"],
            "on" if s["batch_window_s"] else "off",
            s["describe_calls_per_op"],
            s["ec2_calls_per_op"],
            ms(s["p50_ms"]),
            ms(s["p95_ms"]),
            s["ops_per_s"],
            s["failed"],
        )
        for s in aws.get("scale")
    ]
    out += table(
        (
            "concurrency",
            "operations",
            "batching",
            "Describe calls/op",
            "EC2 calls/op",
            "p50",
            "p95",
            "ops/s",
            "failed",
        ),
        rows,
    )
    trades = []
    for c in sorted({s["concurrency"] for s in aws.get("scale")}):
        pair = {bool(s["batch_window_s"]): s for s in aws.get("scale") if s["concurrency"] == c}
        if len(pair) == 2:
            off, on = pair[False], pair[True]
            trades.append(
                f"at {c}, {off['describe_calls_per_op']} -> {on['describe_calls_per_op']} Describe calls "
                f"and p50 {ms(off['p50_ms'])} -> {ms(on['p50_ms'])}"
            )
    out += [
        "Batching trades a wait of up to one window per lookup for calls: " + "; ".join(trades) + ". "
        "The window is off by default; turn it on where many volumes are created or attached at once "
        "and the account's Describe rate is the limit.",
        "",
        f"![EC2 calls per operation against concurrency]({plots['aws']})",
        "",
    ]
    t = aws.get("throttled")
    out += [
        f"Throttled: the proxy answered RequestLimitExceeded to {t['rate']:.0%} of all calls (seeded) at "
        f"concurrency {t['concurrency']} with batching on: {t['failed']} of {t['ops']} operations failed; "
        f"{t['refused_by_proxy']} calls were refused and the driver's `ballast_backend_retries_total` "
        f"rose by {t['driver_retries_total']}"
        + (
            f" (the other {t['driver_retries_total'] - t['refused_by_proxy']} were connection errors "
            "to the proxy under load, retried the same way)"
            if t["driver_retries_total"] > t["refused_by_proxy"]
            else ""
        )
        + f"; p50 {ms(t['p50_ms'])}, p95 {ms(t['p95_ms'])}. Without batching at high concurrency the latency "
        "is moto's: nine Describe calls per operation queue behind each other in one moto process.",
        "",
    ]
    p = aws.get("paging")
    sweep, pages = one_sweep(p), p["before"]["pages"]
    out += [
        f"ListVolumes paging through {p['volumes']:,} volumes, {p['max_entries']} a page "
        "(before: the previous algorithm, a full DescribeVolumes sweep per page, run in the same process):",
        "",
    ]
    if "run" in p:  # measured on their own (`--only listing`), not by the run the section names
        out += [Result(aws.bench, p["run"], aws.path).provenance() + " (these figures only)", ""]
    out += [
        f"Per listing the calls are pages x (N/{p['ec2_page']} + 1) before and N/{p['ec2_page']} + 1 after "
        f"(EC2 pages of {p['ec2_page']}, one sweep per listed tag; here {sweep} per sweep): "
        f"{pages} x {sweep} = {pages * sweep} against {sweep}. "
        + (f"{MOTO_AT_SCALE}." if p["moto"] == "benchmarks.moto_at_scale" else "Against moto as installed."),
        "",
    ]
    out += table(
        ("", "pages", "volumes listed", "DescribeVolumes calls", "seconds"),
        [
            (k, p[k]["pages"], p[k]["listed"], p[k]["describe_volumes_calls"], p[k]["seconds"])
            for k in ("before", "after")
        ],
    )
    return out


def absent(name: str, what: str = "") -> list[str]:
    return [f"not measured (`benchmarks/results/{name}.json` is absent){what}", ""]


def section_optional(r: dict[str, Result | None]) -> list[str]:
    out = ["## Other benchmarks", ""]
    e2e = r["e2e"]
    out += ["### Under Kubernetes (`bench_e2e`)", ""]
    if e2e is None:
        out += absent("e2e")
    else:
        out += [e2e.provenance(), ""]
        out += table(
            ("figure", "n", "p50", "p95"),
            [
                (label, e2e.get(f"{key}.n"), ms(e2e.num(f"{key}.p50_ms")), ms(e2e.num(f"{key}.p95_ms")))
                for key, label in (
                    ("pvc_to_bound_one_at_a_time", "claim created to Bound, one at a time"),
                    ("pvc_to_bound", "claims created back to back, each to Bound"),
                    ("va_to_attached", "VolumeAttachment created to attached"),
                )
            ],
        )
        out += [
            "A burst queues behind the sidecars' client-side API rate limit (`--kube-api-qps=5`), not "
            "behind the driver, whose CreateVolume takes milliseconds.",
            "",
        ]
    cbt = r["cbt"]
    out += ["### Changed blocks (`bench_cbt`)", ""]
    if cbt is None:
        out += absent("cbt")
    else:
        out += [cbt.provenance(), "", f"{cbt.get('volume')}; {cbt.get('cache')}.", ""]
        out += table(
            ("path", "filesystem", "time (median)", "GiB of volume/s", "read / changed bytes"),
            [
                (
                    k,
                    cbt.get(f"{k}.filesystem"),
                    f"{cbt.num(f'{k}.delta_median_seconds')} s",
                    cbt.get(f"{k}.volume_gib_per_second"),
                    cbt.get(f"{k}.read_vs_changed"),
                )
                for k in ("reflink", "fallback")
            ],
        )
    soak = r["soak"]
    out += ["### Soak (`soak`)", ""]
    if soak is None:
        out += absent("soak")
    else:
        out += [
            soak.provenance(),
            "",
            f"{soak.num('workers'):.0f} workers for {soak.num('minutes'):g} minutes: "
            f"{soak.num('operations'):,.0f} operations, {soak.num('operations_per_second')} per second, "
            f"{len(soak.get('errors'))} errors.",
            "",
        ]
        lat = soak.get("latency")
        out += table(
            ("RPC", "n", "median", "p99"),
            [(k, v["n"], ms(v["median_ms"]), ms(v["p99_ms"])) for k, v in sorted(lat.items())],
        )
    tr = r["translate"]
    out += ["### In-tree translation (`bench_translate`)", ""]
    if tr is None:
        out += absent("translate")
    else:
        out += [
            tr.provenance(),
            "",
            f"{tr.num('objects'):,.0f} objects, {tr.num('runs'):.0f} runs: "
            f"{tr.num('translations_per_second'):,.0f} translations per second (median run).",
            "",
        ]
        out += table(
            ("kind", "objects", "per second"),
            [(k, v["objects"], f"{v['translations_per_second']:,}") for k, v in tr.get("by_kind").items()],
        )
    mig = r["migration"]
    out += ["### Migration controller (`migration`)", ""]
    if mig is None:
        out += absent("migration", ": conversions per minute, rebind time and API calls per conversion.")
    elif {"rebind", "convert", "rollback"} <= set(mig.doc["figures"]):
        out += section_migration(mig)
    else:
        out += [mig.provenance(), ""]
        out += table(("figure", "value"), flatten(mig.doc["figures"]))
    return out


def section_migration(mig: Result) -> list[str]:
    """The migration controller's figures on the test bed (bench_migration, issue 14)."""
    setup, rebind = mig.get("setup"), mig.get("rebind")
    verbs = mig.get("convert.api_requests_per_pv_by_verb")
    by_verb = ", ".join(f"{v} {k}" for k, v in sorted(verbs.items(), key=lambda kv: -kv[1]) if v >= 0.5)
    rows = [
        (
            f"a Bound PV re-created in CSI form: create to claim Bound again ({rebind['n']} PVs)",
            f"median {ms(rebind['median_ms'])}, min {ms(rebind['min_ms'])}, max {ms(rebind['max_ms'])}",
        ),
    ]
    for phase in ("convert", "rollback"):
        f = mig.get(phase)
        rows.append(
            (
                f"{f['pvs']} bound in-tree PVs, {phase}: controller start to the last claim Bound",
                f"{f['seconds']} s: {f['pvs_per_minute']} PVs per minute",
            )
        )
    rows.append(
        (
            "API requests per conversion (the controller's own count)",
            f"{mig.num('convert.api_requests_per_pv')}: {by_verb}",
        )
    )
    return [
        mig.provenance(),
        "",
        f"Kubernetes {setup.get('kubernetes', '?')} test bed, the controller as the chart deploys it "
        f"({setup.get('workers', '?')} workers); the PV binder re-syncs claims every "
        f"{setup.get('binder_claim_resync', '15s')}.",
        "",
        *table(("figure", "value"), rows),
        "A claim re-binds at the binder's next claim resync, so between 0 and one resync period after its PV "
        "is re-created; a conversion waiting for it gives its worker back, so conversions overlap.",
        "",
    ]


def flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every scalar figure of a results tree as (dotted key, value)."""
    if isinstance(node, dict):
        return [row for k, v in node.items() for row in flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list):
        if all(not isinstance(v, dict | list) for v in node):
            return [(prefix, ", ".join(str(v) for v in node))]
        return [row for i, v in enumerate(node) for row in flatten(v, f"{prefix}.{i}")]
    return [(prefix, node)]


# ---------------------------------------------------------------------------- plots


def plot_all(r: dict[str, Result | None], out_dir: Path) -> dict[str, str]:
    """The four PNGs under out_dir; their paths relative to docs/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ctl, node, aws = r["controller"], r["node"], r["aws"]
    assert ctl and node and aws
    made: dict[str, str] = {}

    def save(fig: Any, key: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / f"perf-{key}.png", dpi=90, metadata={"Software": None})
        plt.close(fig)
        made[key] = f"{PLOTS}/perf-{key}.png"

    fig, ax = plt.subplots(figsize=(6, 3.6))
    levels = concurrency_levels(ctl.get("throughput"))
    for server, label in (
        ("ballast", "Ballast"),
        ("floor_grpcio", "grpcio floor"),
        ("floor_grpc_go", "grpc-go floor"),
    ):
        ax.plot(
            levels,
            [ctl.num(f"throughput.concurrency_{c}.{server}.pairs_per_s") for c in levels],
            "o-",
            label=label,
        )
    ax.set(xscale="log", xlabel="concurrency", ylabel="create+delete pairs/s", title="Controller throughput")
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.legend()
    save(fig, "throughput")

    fig, ax = plt.subplots(figsize=(6, 3.6))
    levels_ev = ctl.get("existing_volumes")
    xs = [lv["existing"] for lv in levels_ev]
    ax.plot(xs, [lv["create_median_ms"] for lv in levels_ev], "o-", label="with existing volumes")
    ax.plot(xs, [lv["empty_median_ms"] for lv in levels_ev], "s--", label="empty driver (alternating)")
    ax.set(
        xlabel="existing volumes", ylabel="CreateVolume median (ms)", title="Create latency", ylim=(0, None)
    )
    ax.legend()
    save(fig, "existing")

    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels, driver_calls, floor_steps = [], {}, {}
    for fs in ("ext4", "xfs"):
        driver_calls[fs] = {k: v["median_ms"] for k, v in node.get(f"{fs}.driver_calls").items()}
        floor_steps[fs] = {k: v["median_ms"] for k, v in node.get(f"{fs}.tool_floor_steps").items()}
    bars = [(f"{fs}\nBallast", driver_calls[fs]) for fs in ("ext4", "xfs")]
    bars += [(f"{fs}\ntool floor", floor_steps[fs]) for fs in ("ext4", "xfs")]
    bars = [bars[0], bars[2], bars[1], bars[3]]
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    palette: dict[str, Any] = {}
    for i, (_, steps) in enumerate(bars):
        bottom = 0.0
        for step, value in steps.items():
            color = palette.setdefault(step, colors[len(palette) % len(colors)])
            ax.bar(i, value, bottom=bottom, color=color, label=step if step not in labels else None)
            labels.append(step)
            bottom += value
    ax.set_xticks(range(len(bars)), [b[0] for b in bars])
    ax.set(ylabel="ms (medians)", title="Node cycle, 1 GiB: driver calls beside the tool floor")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    save(fig, "node")

    fig, ax = plt.subplots(figsize=(6, 3.6))
    scale = aws.get("scale")
    for on, style in ((False, "o--"), (True, "o-")):
        runs = sorted((s for s in scale if bool(s["batch_window_s"]) == on), key=lambda s: s["concurrency"])
        xs = [s["concurrency"] for s in runs]
        state = "on" if on else "off"
        ax.plot(
            xs, [s["describe_calls_per_op"] for s in runs], style, label=f"Describe calls, batching {state}"
        )
        ax.plot(
            xs,
            [s["ec2_calls_per_op"] for s in runs],
            style,
            alpha=0.5,
            label=f"all EC2 calls, batching {state}",
        )
    ax.axhline(
        aws.num("target_describe_calls_per_op"), color="grey", lw=0.8, ls=":", label="target (Describe)"
    )
    ax.set(xscale="log", xlabel="concurrency", ylabel="EC2 calls per create+publish", title="EBS API traffic")
    ticks = sorted({s["concurrency"] for s in scale})
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    save(fig, "aws")
    return made


# ---------------------------------------------------------------------------- the page


HEADER = """# Performance

Generated by `python -m benchmarks.report` from `benchmarks/results/*.json`; do not edit by hand.
Each benchmark in `benchmarks/` starts the real driver, measures it beside a reference in the same run,
and writes its figures to `benchmarks/results/<name>.json`. None of them is a test: timings on shared
machines vary too much for a pass/fail line, so CI never runs them. This machine's speed varies by up to
half from one minute to the next, so compare changes with interleaved runs, never one run before and one
after.
"""


COMMANDS = [
    ("report [--quick] [--from-results]", "runs the suite below (or reads its results) and writes this page"),
    ("bench_startup", "start-up to first ready Probe, idle RSS, Probe beside empty grpcio / grpc-go servers"),
    (
        "bench_controller",
        "create/delete CPU and throughput beside the grpcio and grpc-go floors, "
        "latency with 0..10,000 volumes, a profile",
    ),
    ("bench_node (root)", "the full node cycle beside the same OS work by hand, ext4 and xfs"),
    (
        "bench_aws",
        "EC2 calls, latency and throttling of the aws backend against moto, batching off/on; "
        "ListVolumes paging",
    ),
    ("bench_translate", "in-tree <-> CSI translations per second"),
    ("bench_e2e", "on the Kubernetes test bed: claim to Bound, VolumeAttachment to attached"),
    ("soak", "minutes of mixed concurrent RPCs: errors, duplicates, latency"),
    ("bench_cbt (root)", "GetMetadataDelta of a 10 GiB volume, reflink and fallback paths"),
    (
        "bench_migration",
        "on the test bed: a claim re-binding to its re-created PV, PVs converted per minute, "
        "API calls per conversion",
    ),
]


def _command(name: str) -> str:
    module, _, note = name.partition(" ")
    return f"`python -m benchmarks.{module}` {note}".rstrip()


def render(results: Path = RESULTS, docs: Path = DOC.parent, plots: bool = True) -> str:
    """The page's markdown (and, with `plots`, the PNGs under docs/img/); ReportError when a needed
    results file is missing or malformed."""
    loaded = {b.name: load(b, results) for b in BENCHES}
    figures = {k: f"{PLOTS}/perf-{k}.png" for k in ("throughput", "existing", "node", "aws")}
    try:
        if plots:
            figures = plot_all(loaded, docs / PLOTS)
        ctl, node, start, aws = (loaded[k] for k in ("controller", "node", "startup", "aws"))
        assert ctl and node and start and aws
        commands = table(("command", "measures"), [(_command(c), m) for c, m in COMMANDS])
        lines = [
            HEADER,
            *commands,
            *section_targets(loaded),
            *section_controller(ctl, figures),
            *section_node(node, figures),
            *section_startup(start),
            *section_aws(aws, figures),
            *section_optional(loaded),
        ]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ReportError(f"a results file does not have the shape the report reads: {exc!r}") from exc
    return "\n".join(lines).rstrip() + "\n"


def run_suite(quick: bool, only: Callable[[Bench], bool] = lambda b: True) -> None:
    """Run each in-suite benchmark (root ones only as root) as its own process."""
    for bench in BENCHES:
        if not bench.in_suite or not only(bench):
            continue
        if bench.root and os.geteuid() != 0:
            print(f"report: skipping {bench.module} (needs root); its last results are used", file=sys.stderr)
            continue
        argv = [sys.executable, "-m", f"benchmarks.{bench.module}", *(bench.quick if quick else ())]
        started = time.monotonic()
        print(f"report: {' '.join(argv[1:])}", file=sys.stderr)
        subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        print(f"report: {bench.module} took {time.monotonic() - started:.0f} s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--from-results", action="store_true", help="render benchmarks/results/ as it is")
    parser.add_argument("--quick", action="store_true", help="the benchmarks' quick modes (< 2 minutes)")
    parser.add_argument("--only", default="", help="comma-separated benchmarks to run (default: the suite)")
    args = parser.parse_args(argv)
    if not args.from_results:
        names = set(filter(None, args.only.split(",")))
        run_suite(args.quick, lambda b: not names or b.name in names)
    try:
        DOC.write_text(render())
    except ReportError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 1
    print(f"report: wrote {DOC.relative_to(REPO)} and its plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
