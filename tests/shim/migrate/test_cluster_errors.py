"""`ballast-migrate apply | rollback | status` when the API server refuses or fails a request after the
first probe: one line on stderr naming what failed, exit 2 for unusable credentials, no traceback; and a
PV whose run fails (its lock, or an unexpected error) is reported as failed, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shim.cli import main
from shim.migrate import oneshot
from shim.migrate.engine import DONE, FAILED, Engine, Outcome
from shim.migrate.kube import ApiError
from shim.migrate.lock import has_journal
from shim.migrate.oneshot import ClusterError, Runner
from tests.shim.fake_kube_api import FakeKubeAPI, recorded_lists

NS = "migration"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
LISTING_LEASES = f"listing the lock Leases in namespace {NS}"
SCS = "/apis/storage.k8s.io/v1/storageclasses"
IN_TREE_PV = "pvc-4f1d6a2e-aws"  # the recorded cluster's in-tree EBS PV, bound to a claim in `shop`
EMPTY: dict[str, Any] = {"items": [], "metadata": {"resourceVersion": "1"}}
CLAIM = {  # the in-tree PV's claim
    "metadata": {"name": "data-db-0", "namespace": "shop", "uid": "9c0d-1"},
    "spec": {"volumeName": IN_TREE_PV},
    "status": {"phase": "Bound"},
}


def cluster_lists() -> dict[str, dict[str, Any]]:
    """The recorded cluster, plus what the one-shot commands also list (all empty)."""
    return {
        **recorded_lists(),
        LEASES: EMPTY,
        "/apis/storage.k8s.io/v1/volumeattachments": EMPTY,
        "/api/v1/namespaces/shop/pods": EMPTY,
        "/api/v1/namespaces/shop/persistentvolumeclaims": {"items": [CLAIM], "metadata": {}},
        "/api/v1/persistentvolumeclaims": EMPTY,
    }


def run_against(
    failures: dict[str, tuple[int, str]], argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    with FakeKubeAPI(cluster_lists(), failures) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code = main([*argv, "--kubeconfig", str(kubeconfig), "--namespace", NS])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(path: str, code: int, reason: str) -> str:
    """How the fake API server's refusal of `path` reads in an ApiError."""
    return f"{code} {reason}: {path} is {reason.lower()} for this user"


@pytest.mark.parametrize(
    ("argv", "path", "status", "what", "exit_code"),
    [
        pytest.param(["status"], LEASES, (403, "Forbidden"), LISTING_LEASES, 2, id="status-403"),
        pytest.param(["apply", "--dry-run"], LEASES, (403, "Forbidden"), LISTING_LEASES, 2, id="dry-run-403"),
        pytest.param(["rollback"], LEASES, (401, "Unauthorized"), LISTING_LEASES, 2, id="rollback-401"),
        pytest.param(["status"], SCS, (500, "InternalError"), "listing StorageClasses", 1, id="status-500"),
        pytest.param(["apply"], SCS, (503, "Unavailable"), "listing StorageClasses", 1, id="apply-503"),
        pytest.param(["status"], "/api/v1/pods", (403, "Forbidden"), "listing pods", 2, id="status-pods-403"),
        pytest.param(
            ["status"],
            "/api/v1/namespaces/shop/pods",
            (500, "InternalError"),
            f"finding the pods and VolumeAttachments that use PV {IN_TREE_PV}",
            1,
            id="status-usage-500",
        ),
    ],
)
def test_an_api_error_after_the_probe_is_one_line_naming_what_failed(
    argv: list[str],
    path: str,
    status: tuple[int, str],
    what: str,
    exit_code: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_against({path: status}, argv, tmp_path, capsys)
    assert (code, out) == (exit_code, "")
    assert err == f"ballast-migrate: {what}: {refused(path, *status)}\n"


@pytest.mark.parametrize(
    ("status", "exit_code"),
    [
        pytest.param(0, 2, id="no-response"),
        pytest.param(401, 2, id="unauthorized"),
        pytest.param(403, 2, id="forbidden"),
        pytest.param(404, 1, id="not-found"),
        pytest.param(429, 1, id="too-many"),
        pytest.param(500, 1, id="internal"),
    ],
)
def test_unusable_credentials_or_cluster_exit_2_other_api_errors_1(status: int, exit_code: int) -> None:
    assert ClusterError("listing pods", ApiError(status, "", "no")).exit_code == exit_code


def test_a_lock_the_api_server_refuses_fails_that_pv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lease = f"{LEASES}/ballast-migrate-pv-{IN_TREE_PV}"
    argv = ["apply", "--pv", IN_TREE_PV, "--timeout", "1s", "-o", "json"]
    code, out, err = run_against({lease: (403, "Forbidden")}, argv, tmp_path, capsys)
    assert code == 1
    (volume,) = json.loads(out)["volumes"]
    assert volume["pv"] == IN_TREE_PV and volume["result"] == FAILED
    assert volume["message"] == f"taking its lock: API error: {refused(lease, 403, 'Forbidden')}"
    assert err == ""


class Surprise(BaseException):
    """Not an Exception: stops a worker thread the way nothing in the engine should."""


class ScriptedEngine:
    """Stands in for Engine in the Runner: done for every PV except the scripted ones, which raise."""

    def __init__(self, raises: dict[str, BaseException]) -> None:
        self.raises = raises
        self.released = False

    def run(self, name: str, direction: str) -> Outcome:
        if name in self.raises:
            raise self.raises[name]
        return Outcome(name, direction, DONE, "converted")

    plan = run

    def release_held(self) -> None:
        self.released = True


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_pv_whose_run_raises_or_gets_no_result_is_failed_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = ScriptedEngine({"b": KeyError("spec"), "c": Surprise()})
    runner = Runner(engine, workers=2, timeout=5, lock_seconds=4, dry_run=False)  # type: ignore[arg-type]
    outcomes = runner.run(["a", "b", "c", "d"], "convert")
    assert [(x.pv, x.result) for x in outcomes] == [("a", DONE), ("b", FAILED), ("c", FAILED), ("d", DONE)]
    assert outcomes[1].message == "unexpected error: KeyError('spec')"
    assert outcomes[2].message == "no result: its worker stopped before it finished"
    assert [r.getMessage() for r in caplog.records] == ["PV b: convert failed: KeyError('spec')"]
    assert not caplog.records[0].exc_info, "no traceback unless debug logging is on"
    assert engine.released


@pytest.mark.parametrize("where", ["_start", "_drive"], ids=["before-journal", "with-journal"])
def test_an_unexpected_error_under_a_pv_lock_gives_the_lock_up(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while the lock is held fails that PV and gives the lock up at once (a journal already
    written stays in the Lease, holderless, for any actor to finish), instead of holding it until the
    Lease expires."""

    def broken(*args: Any) -> Any:
        raise KeyError("spec")

    monkeypatch.setattr(Engine, where, broken)
    lists = cluster_lists()
    argv = ["apply", "--pv", IN_TREE_PV, "--timeout", "1s", "-o", "json"]
    with FakeKubeAPI(lists) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        code = main([*argv, "--kubeconfig", str(kubeconfig), "--namespace", NS])
        leases = api.lists[LEASES]["items"]
    (volume,) = json.loads(capsys.readouterr().out)["volumes"]
    assert (code, volume["result"]) == (1, FAILED)
    if where == "_start":
        assert leases == []
    else:
        (lease,) = leases
        assert not lease["spec"].get("holderIdentity")
        assert has_journal(lease)


class RefusingEngine:
    """Fails every run, on a refusal that lasts (a missing namespace) or on one that may pass."""

    def __init__(self, lasting: bool) -> None:
        self.lasting, self.runs = lasting, 0

    def run(self, name: str, direction: str) -> Outcome:
        self.runs += 1
        return Outcome(name, direction, FAILED, "taking its lock: API error", lasting=self.lasting)

    def release_held(self) -> None:
        pass


@pytest.mark.parametrize(
    ("lasting", "retried"),
    [
        pytest.param(True, False, id="lasting-refusal-not-retried"),
        pytest.param(False, True, id="other-retried"),
    ],
)
def test_apply_retries_a_failure_only_when_a_retry_may_pass(
    monkeypatch: pytest.MonkeyPatch, lasting: bool, retried: bool
) -> None:
    """`apply --namespace typo` waited out --timeout (15 minutes) retrying a lock the namespace's absence
    refuses every time; a failure a retry may get past is still retried until the deadline."""
    monkeypatch.setitem(oneshot.RETRY_DELAYS, FAILED, 0.01)
    engine = RefusingEngine(lasting)
    runner = oneshot.Runner(engine, workers=1, timeout=0.5, lock_seconds=1, dry_run=False)  # type: ignore[arg-type]
    (outcome,) = runner.run([IN_TREE_PV], "convert")
    assert outcome.result == FAILED
    assert (engine.runs > 1) == retried


@pytest.mark.parametrize(
    ("status", "lasting"),
    [
        (403, True),
        (404, True),
        (422, True),
        (409, False),
        (429, False),
        (408, False),
        (500, False),
        (0, False),
    ],
)
def test_which_api_errors_last(status: int, lasting: bool) -> None:
    assert ApiError(status, "", "no").lasting == lasting
