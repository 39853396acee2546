"""`ballast-csi demo` end to end: every step passes, exit 0, nothing left mounted, attached or on disk."""

from __future__ import annotations

import argparse
import io
import os
import tempfile
from pathlib import Path

import pytest

from csi import demo, loop, loopfind
from csi.config import parse_args
from csi.demo import run_demo
from csi.mount import Mounter
from csi.server import build_backend
from tests.conftest import require_root, require_tool

STEPS = (
    "start the driver",
    "create volume",
    "controller publish",
    "stage",
    "publish to the pod path",
    "write 16 MiB and checksum",
    "snapshot the volume",
    "write 8 MiB more",
    "restore the snapshot",
    "verify the checksum",
    "expand the volume online",
    "clean up everything",
)


def _loops_over(directory: Path) -> list[str]:
    return [d for d in loopfind.bound_devices() if (loop.backing_file(d) or "").startswith(str(directory))]


def test_demo_runs_every_step_and_cleans_up(tmp_path: Path) -> None:
    require_root()
    for tool in ("mkfs.xfs", "xfs_growfs", "blkid"):
        require_tool(tool)
    data = tmp_path / "demo-data"
    out = io.StringIO()
    code = run_demo(argparse.Namespace(demo_data_dir=str(data), keep=False), out)
    text = out.getvalue()
    assert code == 0, text
    for step in STEPS:
        assert step in text, f"step {step!r} missing from:\n{text}"
    assert "match" in text and "FAILED" not in text
    assert "-> 960 MiB" in text, "the expanded filesystem size is shown"
    assert not os.path.exists(data), "the data dir is removed without --keep"
    assert _loops_over(data) == []
    assert [m for m in Mounter().mounts() if "ballast-demo-" in m.mount_point] == []


def test_demo_keep_leaves_the_data_dir_but_no_mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_root()
    for tool in ("mkfs.xfs", "xfs_growfs", "blkid"):
        require_tool(tool)
    data = tmp_path / "kept"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the demo's work dir is made here
    out = io.StringIO()
    assert run_demo(argparse.Namespace(demo_data_dir=str(data), keep=True), out) == 0, out.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"], "only the kept data dir stays"
    assert (data / "state.db").exists()
    assert len(list((data / "volumes").iterdir())) == 2, "both volumes are kept"
    assert _loops_over(data) == [], "kept volumes are still detached"
    assert [m for m in Mounter().mounts() if "ballast-demo-" in m.mount_point] == []


def test_demo_failing_late_still_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_root()
    for tool in ("mkfs.xfs", "xfs_growfs", "blkid"):
        require_tool(tool)
    monkeypatch.setattr(demo, "EXPANDED", demo.SIZE // 2)  # "expansion" that cannot grow anything
    data = tmp_path / "failing"
    out = io.StringIO()
    assert run_demo(argparse.Namespace(demo_data_dir=str(data), keep=False), out) == 1
    text = out.getvalue()
    assert "FAILED" in text and "did not grow" in text
    assert "clean up everything" in text and "cleanup:" not in text, "every undo action succeeded"
    assert _loops_over(data) == []
    assert [m for m in Mounter().mounts() if "ballast-demo-" in m.mount_point] == []
    assert not os.path.exists(data)


def _need_demo_tools() -> None:
    require_root()
    for tool in ("mkfs.xfs", "xfs_growfs", "blkid"):
        require_tool(tool)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"/" for p in root.rglob("*")}


def test_demo_refused_by_a_live_drivers_data_dir_touches_nothing(tmp_path: Path) -> None:
    """Another driver holds the data dir: the demo fails in one line and leaves every file in place."""
    _need_demo_tools()
    data = tmp_path / "live"
    data.mkdir()
    (data / "notes.txt").write_text("precious")
    config, _ = parse_args(["--data-dir", str(data), "--kubelet-dir", str(tmp_path / "kubelet")])
    live = build_backend(config)  # a running driver's backend: state database, owner lock
    try:
        before = _tree(data)
        out = io.StringIO()
        assert run_demo(argparse.Namespace(demo_data_dir=str(data), keep=False), out) == 1
        assert _tree(data) == before, "nothing in a refused data dir is removed"
    finally:
        live.close()
    text = out.getvalue()
    assert "demo failed: data dir" in text and "is in use by ballast-csi controller" in text, text
    assert "Traceback" not in text


def test_demo_removes_only_what_it_made_in_a_data_dir_with_other_files(tmp_path: Path) -> None:
    _need_demo_tools()
    data = tmp_path / "shared"
    (data / "sub").mkdir(parents=True)
    (data / "notes.txt").write_text("precious")
    (data / "sub" / "more.txt").write_text("precious too")
    before = _tree(data)
    out = io.StringIO()
    assert run_demo(argparse.Namespace(demo_data_dir=str(data), keep=False), out) == 0, out.getvalue()
    assert _tree(data) == before, "the demo's state and volume files go, the other files stay"
    assert _loops_over(data) == []


def test_demo_removes_the_empty_data_dir_it_was_given(tmp_path: Path) -> None:
    _need_demo_tools()
    data = tmp_path / "empty"
    data.mkdir()
    out = io.StringIO()
    assert run_demo(argparse.Namespace(demo_data_dir=str(data), keep=False), out) == 0, out.getvalue()
    assert not data.exists()
