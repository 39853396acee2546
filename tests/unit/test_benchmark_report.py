"""docs/performance.md is rendered from the committed benchmarks/results/*.json (benchmarks/report.py):
the committed page is what the committed results render to, every issue-17 target is on it with a
verdict, and a results file the report needs that is missing or malformed stops it with a message that
names the file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import RESULTS
from benchmarks.report import BENCHES, DOC, ReportError, render

REQUIRED = [b.name for b in BENCHES if b.required]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of the committed results, to break."""
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    return copy


def test_the_committed_page_is_what_the_committed_results_render_to(tmp_path: Path) -> None:
    page = render(docs=tmp_path)
    assert page == DOC.read_text(), (
        "docs/performance.md is stale: run `python -m benchmarks.report --from-results`"
    )
    for plot in ("throughput", "existing", "node", "aws"):
        png = tmp_path / "img" / f"perf-{plot}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot
        assert (DOC.parent / "img" / f"perf-{plot}.png").exists(), f"committed plot {plot} missing"


def test_every_target_has_a_verdict_and_every_figure_its_command() -> None:
    page = render(plots=False)
    targets = page.split("## Targets (issue 17)")[1].split("\n## ")[0]
    rows = [line for line in targets.splitlines() if line.startswith("| ") and "verdict" not in line]
    assert len(rows) == 10
    assert all(row.rstrip(" |").endswith("met") or "**missed**" in row for row in rows), rows
    for name in ("startup", "controller", "node", "aws"):
        doc = json.loads((RESULTS / f"{name}.json").read_text())
        assert f"`{doc['command']}` · " in page and doc["when"] in page, name


def _drop(results: Path, name: str) -> None:
    (results / f"{name}.json").unlink()


def _garble(results: Path, name: str) -> None:
    (results / f"{name}.json").write_text('{"figures": {"trunc')


def _hollow(results: Path, name: str) -> None:
    path = results / f"{name}.json"
    doc = json.loads(path.read_text())
    doc["figures"] = {k: v for i, (k, v) in enumerate(doc["figures"].items()) if i % 2}
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", REQUIRED)
@pytest.mark.parametrize(
    "breaks",
    [
        pytest.param(_drop, id="missing"),
        pytest.param(_garble, id="not-json"),
        pytest.param(_hollow, id="figures-missing"),
    ],
)
def test_a_needed_results_file_that_is_missing_or_malformed_stops_the_report(
    results: Path, tmp_path: Path, name: str, breaks: Callable[[Path, str], None]
) -> None:
    breaks(results, name)
    with pytest.raises(ReportError) as caught:
        render(results, tmp_path, plots=False)
    assert f"{name}.json" in str(caught.value) or "shape" in str(caught.value)


@pytest.mark.parametrize("name", ["e2e", "cbt", "soak", "translate", "migration"])
def test_an_optional_result_that_is_absent_is_not_measured(results: Path, tmp_path: Path, name: str) -> None:
    (results / f"{name}.json").unlink(missing_ok=True)
    page = render(results, tmp_path, plots=False)
    assert f"not measured (`benchmarks/results/{name}.json` is absent)" in page


def test_migration_figures_are_rendered_when_present(results: Path, tmp_path: Path) -> None:
    figures: dict[str, Any] = {
        "conversions_per_minute": 412.5,
        "rebind_seconds": {"p50": 1.9},
        "api_calls_per_conversion": 7,
    }
    (results / "migration.json").write_text(
        json.dumps(
            {
                "benchmark": "migration",
                "when": "2026-12-01T05:00:00Z",
                "command": "python -m x",
                "figures": figures,
            }
        )
    )
    page = render(results, tmp_path, plots=False)
    migration = page.split("### Migration controller")[1]
    for row in (
        "| conversions_per_minute | 412.5 |",
        "| rebind_seconds.p50 | 1.9 |",
        "| api_calls_per_conversion | 7 |",
    ):
        assert row in migration


def _with_floor(results: Path, total: float, phases: dict[str, float] | None = None) -> None:
    path = results / "controller.json"
    doc = json.loads(path.read_text())
    phases = phases or {"create file": total / 4, "fsync file": total / 4, "fsync directory": total / 4}
    doc["figures"]["durable_floor"] = {
        "data_dir": {
            "filesystem": {"type": "ext4", "mount": "/", "journal": False},
            **phases,
            "WAL commit": total - sum(phases.values()),
            "total": total,
        }
    }
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("total", "overhead", "beyond_reach", "deferred"),
    [
        pytest.param(0.6, 0.86, True, "still above", id="floor-above-the-bound"),
        pytest.param(0.12, 0.86, False, "still above", id="floor-below-deferred-above"),
        pytest.param(0.32, 0.4, False, "within", id="deferred-within-the-bound"),
    ],
)
def test_the_durable_floor_splits_the_overhead_into_system_calls_and_driver_code(
    results: Path, tmp_path: Path, total: float, overhead: float, beyond_reach: bool, deferred: str
) -> None:
    _with_floor(results, total)
    path = results / "controller.json"
    doc = json.loads(path.read_text())
    doc["figures"]["create_cpu_overhead_ms"]["concurrency_1"] = overhead
    path.write_text(json.dumps(doc))
    page = render(results, tmp_path, plots=False)
    section = page.split("### The durable floor")[1].split("\n### ")[0]
    assert f"| total | {total:.3f} ms |" in section
    assert f"{overhead - total:.2f} ms the driver's own code" in section
    assert ("is below these system calls alone" in section) is beyond_reach
    wal, own = total - 3 * (total / 4), overhead - total
    assert f"leave the WAL commit ({wal:.2f} ms) and the driver's own code ({own:.2f} ms)" in section
    assert f"{wal + own:.2f} ms, {deferred} the bound." in section
    assert f"cost {total:.2f} ms of CPU by themselves" in page.split("## Targets (issue 17)")[1]


@pytest.mark.parametrize(
    ("create", "fsync", "stated"),
    [
        pytest.param(0.318, 0.07, True, id="own-file-above-the-bound"),
        pytest.param(0.2, 0.1, False, id="own-file-below-the-bound"),
    ],
)
def test_the_reason_at_c8_weighs_the_calls_no_batch_shares(
    results: Path, tmp_path: Path, create: float, fsync: float, stated: bool
) -> None:
    """Group commit shares the directory fsync and the WAL commit at c=8; each create's own file is
    what the reason there may rest on, and only when those calls alone exceed the bound."""
    _with_floor(results, 0.6, {"create file": create, "fsync file": fsync, "fsync directory": 0.05})
    row = next(r for r in render(results, tmp_path, plots=False).splitlines() if r.startswith("| driver CPU"))
    assert (f"(create file and fsync file, {create + fsync:.2f} ms) still exceed the bound" in row) is stated


def _paging_row(results: Path, tmp_path: Path, volumes: int, after: int) -> str:
    path = results / "aws.json"
    doc = json.loads(path.read_text())
    pages = -(-volumes // 200)
    doc["figures"]["paging"] = {
        "volumes": volumes,
        "max_entries": 200,
        "ec2_page": 500,
        "moto": "benchmarks.moto_at_scale",
        "before": {"pages": pages, "listed": volumes, "describe_volumes_calls": 1050, "seconds": 1.0},
        "after": {"pages": pages, "listed": volumes, "describe_volumes_calls": after, "seconds": 1.0},
    }
    path.write_text(json.dumps(doc))
    page = render(results, tmp_path, plots=False)
    return next(line for line in page.splitlines() if line.startswith("| EC2 calls to page ListVolumes"))


@pytest.mark.parametrize(
    ("volumes", "after", "cell"),
    [
        pytest.param(10_000, 21, "met", id="one-sweep-at-10000"),
        pytest.param(10_000, 42, "**missed**: 42 calls after, more than one sweep (21)", id="two-sweeps"),
        pytest.param(2_000, 5, "**missed**: measured at 2,000, not 10,000", id="too-few-volumes"),
    ],
)
def test_the_paging_target_is_met_only_by_one_sweep_through_10000_volumes(
    results: Path, tmp_path: Path, volumes: int, after: int, cell: str
) -> None:
    assert _paging_row(results, tmp_path, volumes, after).endswith(f" after | {cell} |")


def test_a_missed_cycle_gives_its_calls_beside_the_floors_programs(results: Path, tmp_path: Path) -> None:
    path = results / "node.json"
    doc = json.loads(path.read_text())
    xfs = doc["figures"]["xfs"]
    xfs["ratio_median"], xfs["cycle_target_met"] = 1.31, False
    path.write_text(json.dumps(doc))
    page = render(results, tmp_path, plots=False)
    row = next(line for line in page.splitlines() if line.startswith("| node cycle / tool floor, xfs"))
    calls, rpc = xfs["driver_calls"], xfs["empty_rpc"]["median_ms"]
    assert "| 1.310x | **missed**: the cycle took" in row
    assert f"the cycle is {len(calls)} RPCs, each at least the {rpc:.2f} ms of an RPC" in row
    assert f"stage {calls['stage']['median_ms']:.1f}" in row
    assert f"mkfs {xfs['tool_floor_steps']['mkfs']['median_ms']:.1f}" in row.split("by program:")[1]


@pytest.mark.parametrize(
    ("mount_ms", "beyond_reach"),
    [
        pytest.param(1.1, False, id="mount-within-the-allowance"),
        pytest.param(3.8, True, id="mount-alone-over-the-allowance"),
    ],
)
def test_a_missed_stage_says_whether_mount_alone_exceeds_the_allowance(
    results: Path, tmp_path: Path, mount_ms: float, beyond_reach: bool
) -> None:
    path = results / "node.json"
    doc = json.loads(path.read_text())
    ext4 = doc["figures"]["ext4"]
    ext4["stage_minus_mkfs_ms"], ext4["stage_target_met"] = 3.5, False
    steps = ext4["stage_steps_ms"]
    steps["total"] += mount_ms - steps["mount(2)"]
    steps["mount(2)"] = mount_ms
    path.write_text(json.dumps(doc))
    page = render(results, tmp_path, plots=False)
    row = next(line for line in page.splitlines() if line.startswith("| NodeStageVolume - mkfs, ext4"))
    assert f"mount(2) of a fresh ext4 alone takes {mount_ms:.1f} ms" in row
    assert ("more than the whole allowance by itself" in row) is beyond_reach
    beyond = sum(v for k, v in steps.items() if k not in ("mkfs", "mount(2)", "total"))
    assert f"beyond mkfs and mount(2) the traced stage spends {beyond:.1f} ms (" in row
    listed = row.split("the traced stage spends")[1].split(")")[0]
    assert "resolve device" in listed and "mount(2)" not in listed
    rpc = ext4["empty_rpc"]["median_ms"]
    gap = steps["mkfs"] - ext4["tool_floor_steps"]["mkfs"]["median_ms"]
    assert f"an RPC that does nothing takes {rpc:.1f} ms" in row
    assert f"mkfs inside the traced stage took {gap:+.1f} ms against mkfs alone" in row
    assert f"the rest, {3.5 - mount_ms - beyond - rpc - gap:+.1f} ms," in row
