"""KeyedLocks: one key's holders wait for each other, other keys never do, and the table stays empty."""

from __future__ import annotations

import threading
import time

import pytest

from csi import keylocks
from csi.keylocks import KeyedLocks


def test_holders_of_one_key_take_turns_and_other_keys_run_alongside() -> None:
    locks = KeyedLocks()
    inside: list[str] = []
    overlap: list[tuple[str, ...]] = []

    def work(key: str) -> None:
        with locks.hold(key):
            inside.append(key)
            overlap.append(tuple(inside))
            time.sleep(0.05)
            inside.remove(key)

    threads = [threading.Thread(target=work, args=(k,)) for k in ("a", "a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(seen.count("a") > 1 for seen in overlap), "two holders of 'a' at once"
    assert any(set(seen) == {"a", "b"} for seen in overlap), "'b' waited for 'a'"
    assert len(locks) == 0, "released keys leave nothing behind"


class WatchedLock:
    """A lock that reports each thread's attempt to take it before the thread blocks on it."""

    def __init__(self, attempts: list[tuple[str, WatchedLock]], tried: threading.Condition) -> None:
        self._lock = threading.Lock()
        self._attempts, self._tried = attempts, tried

    def __enter__(self) -> None:
        with self._tried:
            self._attempts.append((threading.current_thread().name, self))
            self._tried.notify_all()
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_several_keys_are_taken_in_sorted_order_whatever_order_they_are_named_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hold("y", "x") waiting for "x" holds nothing yet: it takes "x" first, as hold("x", "y") would,
    so two callers naming the same keys in opposite orders can never hold one each and wait forever."""
    attempts: list[tuple[str, WatchedLock]] = []
    tried = threading.Condition()

    class Entry(keylocks._Entry):
        def __init__(self) -> None:
            super().__init__()
            self.lock = WatchedLock(attempts, tried)  # type: ignore[assignment]

    monkeypatch.setattr(keylocks, "_Entry", Entry)
    locks = KeyedLocks()
    y_taken = threading.Event()

    def take_y() -> None:
        with locks.hold("y"):
            y_taken.set()

    def take_both() -> None:
        with locks.hold("y", "x"):
            pass

    with locks.hold("x"):
        x: object = locks._entries["x"].lock
        both = threading.Thread(target=take_both, name="both", daemon=True)
        with tried:
            both.start()
            assert tried.wait_for(lambda: ("both", x) in attempts, timeout=10), "never tried to take 'x'"
        other = threading.Thread(target=take_y, daemon=True)
        other.start()
        taken = y_taken.wait(10)  # bounded: on a wrong order 'y' stays held until 'x' is released
    both.join(10)
    other.join(10)
    assert taken, "hold('y', 'x') held 'y' while it waited for 'x'"
    assert not both.is_alive() and not other.is_alive()
    assert len(locks) == 0
