"""Journal steps and format; lock Lease names and expiry by observation."""

from __future__ import annotations

import json

import pytest

from shim.migrate.journal import FORMAT, STEPS, Journal, JournalError
from shim.migrate.lock import MAX_NAME, Observations, lease_name
from shim.migrate.objects import ClaimRef
from tests.shim.migrate.samples import sample_journal as journal


@pytest.mark.parametrize(
    ("was_bound", "walk"),
    [
        pytest.param(True, ["retain", "delete", "release", "create", "bound", "restore", "done"], id="bound"),
        pytest.param(False, ["retain", "delete", "release", "create", "restore", "done"], id="available"),
    ],
)
def test_steps_in_order_and_only_bound_pvs_wait_for_their_claim(was_bound: bool, walk: list[str]) -> None:
    j = journal(was_bound)
    seen = [j.step]
    while j.step != "done":
        j.advance()
        seen.append(j.step)
    assert seen == walk
    assert set(walk) <= set(STEPS)


def test_journal_round_trips_through_json() -> None:
    j = journal()
    j.advance()
    j.created_uid = "u-2"
    again = Journal.from_json(j.to_json())
    assert again == j and again.claim == ClaimRef("ns", "data", "c-1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"format": FORMAT + 1}, "newer than this version", id="newer-format"),
        pytest.param({"format": "1"}, "format", id="format-not-int"),
        pytest.param({"step": "teleport"}, "step 'teleport'", id="unknown-step"),
        pytest.param({"direction": "sideways"}, "direction 'sideways'", id="unknown-direction"),
        pytest.param({"surprise": 1}, "fields do not match", id="unknown-field"),
        pytest.param({"target": None}, "no target", id="no-target"),
    ],
)
def test_unusable_journals_are_refused(change: dict[str, object], message: str) -> None:
    raw = {**json.loads(journal().to_json()), **change}
    with pytest.raises(JournalError, match=message):
        Journal.from_json(json.dumps(raw))


def test_not_json_is_refused() -> None:
    with pytest.raises(JournalError, match="not JSON"):
        Journal.from_json("{")


def test_lease_names_follow_the_pv_and_long_ones_end_in_a_hash() -> None:
    assert lease_name("pv-1") == "ballast-migrate-pv-pv-1"
    long_a, long_b = "a" * 240 + "x", "a" * 240 + "y"
    names = {lease_name(long_a), lease_name(long_b)}
    assert len(names) == 2
    assert all(len(n) <= MAX_NAME and n[-1].isalnum() for n in names)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(version: str) -> dict[str, object]:
    return {"metadata": {"name": "l", "resourceVersion": version}}


def test_a_lease_counts_as_unchanged_only_from_when_this_process_saw_it() -> None:
    clock = Clock()
    seen = Observations(clock)
    assert seen.unchanged_for(lease("1")) == 0.0  # first sight: no matter how old renewTime is
    clock.now += 20
    assert seen.unchanged_for(lease("1")) == 20.0
    assert seen.unchanged_for(lease("2")) == 0.0  # renewed: the count starts again
    clock.now += 5
    assert seen.unchanged_for(lease("2")) == 5.0
