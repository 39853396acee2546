"""The controller's work queue: dedup, no concurrent processing of a key, re-run when dirty, delays."""

from __future__ import annotations

import threading

from shim.migrate.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_queued_once() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "a", "a"):
        queue.add(key)
    assert [queue.get(0), queue.get(0), queue.get(0)] == ["a", "b", None]


def test_a_key_added_while_processed_runs_again_after_done_not_concurrently() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(0) == "a"
    queue.add("a")
    assert queue.get(0) is None, "a second worker must not get a key being processed"
    queue.done("a")
    assert queue.get(0) == "a"
    queue.done("a")
    assert queue.idle()


def test_delayed_keys_come_when_due_and_the_earlier_schedule_wins() -> None:
    clock = Clock()
    queue = WorkQueue(clock)
    queue.add_after("late", 10)
    queue.add_after("soon", 2)
    queue.add_after("soon", 5)  # later than the existing schedule: ignored
    assert queue.get(0) is None and not queue.idle()
    clock.now = 3
    assert queue.get(0) == "soon"
    queue.done("soon")
    clock.now = 10
    assert queue.get(0) == "late"


def test_shutdown_wakes_waiting_workers() -> None:
    queue = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    queue.shutdown()
    worker.join(5)
    assert got == [None]
    queue.add("after")
    assert queue.get(0) is None
