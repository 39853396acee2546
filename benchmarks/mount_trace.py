"""What mount(2) of a freshly made filesystem spends its time on, from the kernel's own tracepoints.

For each run: a fresh sparse 1 GiB file on a loop device (`losetup`), formatted with the plain tool
(`mkfs.<fs> -q`, as the tool floor does), then one mount(2) (the driver's Mounter) traced through a
private tracefs instance: the syscall's entry and exit, every request issued to and completed by the loop
device, and every task the kernel starts meanwhile. Each mount is split at its I/O:

- setup: entry to the first request (opening the device, the superblock, work queues and their threads);
- reads: first read to first write (superblock, log head and tail search), each read waiting for the
  loop device's worker;
- writes: first write to the last write's completion (xfs: on every read-write mount the log recovery
  code overwrites the log blocks in front of the head, at most 8 log buffers of 256 KiB = 2 MiB, so that
  stale records cannot be mistaken for new ones; mkfs leaves that range unwritten);
- finish: from there to the syscall's return (xfs: the allocation group headers, read one by one).

Needs root and tracefs (mounted for the run and unmounted again when it was not mounted before); when
tracing is unavailable the result says why and nothing else.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = (
    "syscalls/sys_enter_mount",
    "syscalls/sys_exit_mount",
    "block/block_rq_issue",
    "block/block_rq_complete",
    "task/task_newtask",
)
_LINE = re.compile(
    r"\s*(?P<comm>.+)-(?P<pid>\d+)\s+\[\d+\]\s+\S+\s+(?P<ts>[\d.]+):\s+"
    r"(?P<event>\w+)(?::\s?|(?=[( ]))(?P<rest>.*)"
)
# block_rq_issue/complete: "7,1 RSM 512 () 1048624 + 1 ..." (issue) or "7,1 RSM () 1048624 + 1 ..."
_REQUEST = re.compile(r"(?P<dev>\d+,\d+) (?P<rwbs>\S+) (?:\d+ )?\(.*?\) (?P<sector>\d+) \+ (?P<sectors>\d+)")


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def _instance() -> Iterator[Path]:
    """A private tracefs instance with EVENTS enabled (mounting tracefs for the while when needed)."""
    mounted_here = False
    if not (TRACEFS / "instances").is_dir():
        _run("mount", "-t", "tracefs", "nodev", str(TRACEFS))
        mounted_here = True
    inst = TRACEFS / "instances" / f"ballast-bench-{os.getpid()}"
    try:
        inst.mkdir()
        try:
            (inst / "buffer_size_kb").write_text("4096")
            for event in EVENTS:
                (inst / "events" / event / "enable").write_text("1")
            (inst / "tracing_on").write_text("0")
            yield inst
        finally:
            inst.rmdir()
    finally:
        if mounted_here:
            _run("umount", str(TRACEFS))


def split_mount(text: str, pid: int, device: str) -> dict[str, float] | None:
    """Phases (ms), request counts and written bytes of the one mount(2) by `pid` in trace `text`,
    where `device` is "major,minor" of the loop device; None when the trace lacks the syscall."""
    enter = leave = first_read = first_write = last_write_done = None
    reads = reads_after = writes = written = threads = 0
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        ts, event, rest = float(m["ts"]), m["event"], m["rest"]
        if event in ("sys_mount", "sys_enter_mount", "sys_exit_mount") and int(m["pid"]) == pid:
            if "->" in rest or event == "sys_exit_mount":
                leave = ts
            else:
                enter = ts
        elif event == "task_newtask" and enter is not None and leave is None and m["comm"] == "kthreadd":
            threads += 1
        elif event.startswith("block_rq_") and enter is not None and leave is None:
            req = _REQUEST.match(rest)
            if req is None or req["dev"] != device:
                continue
            write = "W" in req["rwbs"]
            if event == "block_rq_issue":
                if write:
                    writes, written = writes + 1, written + int(req["sectors"]) * 512
                    first_write = first_write or ts
                elif first_write is None:
                    reads += 1
                    first_read = first_read or ts
                else:
                    reads_after += 1
            elif write:
                last_write_done = ts
    if enter is None or leave is None:
        return None
    writes_from = first_write or leave
    marks = [
        enter,
        min(first_read or writes_from, writes_from),
        writes_from,
        last_write_done or writes_from,
        leave,
    ]
    ms = [round((b - a) * 1000, 3) for a, b in itertools.pairwise(marks)]
    return {
        "setup": ms[0],
        "reads": ms[1],
        "writes": ms[2],
        "finish": ms[3],
        "total": round((leave - enter) * 1000, 3),
        "reads_before_writes": reads,
        "reads_after_writes": reads_after,
        "write_requests": writes,
        "written_bytes": written,
        "kernel_threads_started": threads,
    }


def _one(inst: Path, workdir: Path, fs: str, i: int) -> tuple[dict[str, float] | None, float]:
    from csi.mount import Mounter

    image, mnt = workdir / f"anatomy-{fs}-{i}.img", workdir / f"anatomy-{fs}-{i}"
    mnt.mkdir()
    _run("truncate", "-s", "1G", str(image))
    device = _run("losetup", "--find", "--show", str(image))
    mounter = Mounter()
    try:
        _run(f"mkfs.{fs}", "-q", device)
        st = os.stat(device)
        (inst / "trace").write_text("")
        (inst / "tracing_on").write_text("1")
        t = time.perf_counter()
        try:
            mounter.mount(device, str(mnt), fs, [])
            wall = time.perf_counter() - t
        finally:  # unmounted even when stopping the trace fails: a run leaves no mount behind
            try:
                (inst / "tracing_on").write_text("0")
            finally:
                if os.path.ismount(mnt):
                    mounter.unmount(str(mnt))
        text = (inst / "trace").read_text()
    finally:
        _run("losetup", "-d", device)
        image.unlink()
        mnt.rmdir()
    return split_mount(text, os.getpid(), f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"), wall


def mount_anatomy(workdir: Path, fs: str, runs: int) -> dict[str, Any]:
    """Medians over `runs` traced mounts of fresh `fs` filesystems; {"unavailable": why} without tracing."""
    try:
        with _instance() as inst:
            done = [_one(inst, workdir, fs, i) for i in range(runs)]
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"unavailable": f"kernel tracing: {exc}"}
    splits = [s for s, _ in done if s is not None]
    if not splits:
        return {"unavailable": "the trace held no mount(2) (syscall tracepoints missing?)"}
    out: dict[str, Any] = {k: round(statistics.median(s[k] for s in splits), 3) for k in splits[0]}
    out["wall_ms"] = round(statistics.median(w for _, w in done) * 1000, 3)
    out["runs"] = len(splits)
    return out
