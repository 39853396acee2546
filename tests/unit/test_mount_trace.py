"""benchmarks/mount_trace.py splits one traced mount(2) at its I/O, counting only its own device."""

from __future__ import annotations

from benchmarks.mount_trace import split_mount

TRACE = """\
# tracer: nop
python-100 [000] ..... 10.000000: sys_mount(dev_name: 0x1, dir_name: 0x2)
kthreadd-2 [001] ..... 10.000100: task_newtask: pid=300 comm=kthreadd clone_flags=800711
python-100 [000] ..... 10.000500: block_rq_issue: 7,1 RM 512 () 0 + 1 be,0,4 [python]
ksoftirqd/0-14 [000] ..s.. 10.000550: block_rq_complete: 7,1 RM () 0 + 1 be,0,4 [0]
go-555 [001] ..... 10.000600: block_rq_issue: 254,0 WS 4096 () 8 + 8 be,0,4 [go]
python-100 [000] ..... 10.001000: block_rq_issue: 7,1 RSM 512 () 1048624 + 1 be,0,4 [python]
python-100 [000] ..... 10.001500: block_rq_issue: 7,1 WSM 1310720 () 1048626 + 2560 be,0,4 [python]
python-100 [000] ..... 10.001600: block_rq_issue: 7,1 WSM 786432 () 1051186 + 1536 be,0,4 [python]
ksoftirqd/0-14 [000] ..s.. 10.002000: block_rq_complete: 7,1 WSM () 1048626 + 2560 be,0,4 [0]
ksoftirqd/0-14 [000] ..s.. 10.002500: block_rq_complete: 7,1 WSM () 1051186 + 1536 be,0,4 [0]
python-100 [000] ..... 10.002600: block_rq_issue: 7,1 RM 512 () 1 + 1 be,0,4 [python]
kthreadd-2 [001] ..... 10.002700: task_newtask: pid=301 comm=kthreadd clone_flags=800711
python-100 [000] ..... 10.003000: sys_mount -> 0x0
python-100 [000] ..... 10.004000: block_rq_issue: 7,1 WSM 512 () 2 + 1 be,0,4 [python]
"""


def test_a_mount_is_split_at_its_first_read_first_write_and_last_write() -> None:
    got = split_mount(TRACE, 100, "7,1")
    assert got == {
        "setup": 0.5,
        "reads": 1.0,
        "writes": 1.0,
        "finish": 0.5,
        "total": 3.0,
        "reads_before_writes": 2,
        "reads_after_writes": 1,
        "write_requests": 2,
        "written_bytes": 2 * 1024**2,
        "kernel_threads_started": 2,
    }


def test_other_devices_and_processes_are_not_counted() -> None:
    assert split_mount(TRACE, 100, "7,2") == {
        "setup": 3.0,
        "reads": 0.0,
        "writes": 0.0,
        "finish": 0.0,
        "total": 3.0,
        "reads_before_writes": 0,
        "reads_after_writes": 0,
        "write_requests": 0,
        "written_bytes": 0,
        "kernel_threads_started": 2,
    }
    assert split_mount(TRACE, 101, "7,1") is None
