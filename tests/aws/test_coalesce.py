"""The modification coalescer: concurrent resize + modify for one volume become one application."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from csi.backends.aws.coalesce import Coalescer, Modification
from csi.failures import InvalidParameterError, TransientError


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, Modification]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, volume_id: str, change: Modification) -> str:
        with self.lock:
            self.calls.append((volume_id, Modification(change.size_bytes, dict(change.parameters))))
        if self.fail:
            raise self.fail
        return f"{volume_id}:{change.size_bytes}:{sorted(change.parameters.items())}"


def test_resize_and_modify_arriving_together_are_applied_once() -> None:
    apply = Recorder()
    coalescer = Coalescer(apply, window=0.3)
    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(coalescer.submit, "vol-1", 20),
            pool.submit(coalescer.submit, "vol-1", None, {"iops": "4000"}),
            pool.submit(coalescer.submit, "vol-1", 10, {"type": "gp3"}),
        ]
        results = {f.result() for f in futures}
    assert len(apply.calls) == 1
    assert apply.calls[0] == ("vol-1", Modification(20, {"iops": "4000", "type": "gp3"}))
    assert len(results) == 1  # every caller sees the same outcome


def test_different_volumes_are_separate_batches() -> None:
    apply = Recorder()
    coalescer = Coalescer(apply, window=0.1)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda v: coalescer.submit(v, 5), ["vol-1", "vol-2"]))
    assert sorted(v for v, _ in apply.calls) == ["vol-1", "vol-2"]


def test_sequential_requests_are_separate_batches() -> None:
    apply = Recorder()
    coalescer = Coalescer(apply, window=0)
    coalescer.submit("vol-1", 5)
    coalescer.submit("vol-1", 6)
    assert [c.size_bytes for _, c in apply.calls] == [5, 6]


def test_an_error_reaches_every_caller_of_the_batch() -> None:
    coalescer = Coalescer(Recorder(fail=InvalidParameterError("bad")), window=0.2)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(coalescer.submit, "vol-1", 5), pool.submit(coalescer.submit, "vol-1", 6)]
        for future in futures:
            with pytest.raises(InvalidParameterError):
                future.result()


def test_conflicting_values_in_one_window_are_retried_later() -> None:
    apply = Recorder()
    coalescer = Coalescer(apply, window=0.3)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(coalescer.submit, "vol-1", None, {"iops": "4000"})
        threading.Event().wait(0.05)
        second = pool.submit(coalescer.submit, "vol-1", None, {"iops": "5000"})
        with pytest.raises(TransientError, match="iops"):
            second.result()
        first.result()
    assert len(apply.calls) == 1
