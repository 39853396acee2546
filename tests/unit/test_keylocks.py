"""KeyedLocks: one key's holders wait for each other, other keys never do, and the table stays empty."""

from __future__ import annotations

import threading
import time

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


def test_several_keys_in_any_order_do_not_deadlock() -> None:
    locks = KeyedLocks()
    done: list[int] = []

    def work(i: int, keys: tuple[str, ...]) -> None:
        for _ in range(50):
            with locks.hold(*keys):
                pass
        done.append(i)

    threads = [threading.Thread(target=work, args=(i, k)) for i, k in enumerate([("x", "y"), ("y", "x")] * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(done) == list(range(6))
    assert len(locks) == 0
