"""The controller's retries: a PV failing again and again is retried with a bounded backoff forever, and
the lock release of a failed attempt does not start the next attempt before that backoff."""

from __future__ import annotations

import pytest

from shim.cli import build_parser
from shim.migrate import options
from shim.migrate.controller import MAX_BACKOFF, Controller
from shim.migrate.engine import FAILED, Outcome
from shim.migrate.journal import CONVERT
from shim.migrate.kube import KubeClient
from shim.migrate.lock import ANN_JOURNAL, ANN_PV
from shim.migrate.metrics import Metrics
from shim.migrate.workqueue import WorkQueue
from tests.shim.fake_kube_api import FakeKubeAPI


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def controller(api: FakeKubeAPI, client: KubeClient) -> Controller:
    args = build_parser().parse_args(
        ["controller", "--namespace", "ns", "--feature-gates", "CSIMigration=true"]
    )
    options.check(args)
    made = Controller(client, Metrics("test", "test"), args)
    made._queue = WorkQueue(Clock())
    return made


def failed(name: str) -> Outcome:
    return Outcome(name, CONVERT, FAILED, "API error: 422 Invalid")


def released_lock(pv: str) -> dict[str, object]:
    """A lock Lease with an unfinished journal and no holder: what a failed attempt leaves."""
    return {"metadata": {"name": f"lock-{pv}", "annotations": {ANN_PV: pv, ANN_JOURNAL: "{}"}}, "spec": {}}


def test_a_pv_failing_without_end_keeps_a_bounded_backoff(controller: Controller) -> None:
    clock = controller._queue._clock
    assert isinstance(clock, Clock)
    for _ in range(1100):  # past 2**1024, where an unbounded exponent overflows a float
        controller._after("pv/p", failed("p"))
        clock.now += MAX_BACKOFF
        assert controller._queue.get(0) == "pv/p", "retried at the latest MAX_BACKOFF later"
        controller._queue.done("pv/p")
    assert controller._failures["pv/p"] == 1100


def test_the_lock_released_by_a_failed_attempt_waits_for_the_backoff(controller: Controller) -> None:
    controller._after("pv/p", failed("p"))
    controller._on_lease(None, released_lock("p"))
    assert controller._queue.get(0) is None, "the attempt's own lock release must not bypass the backoff"
    controller._on_lease(None, released_lock("other"))
    assert controller._queue.get(0) == "pv/other", "a journal released by someone else is picked up at once"
