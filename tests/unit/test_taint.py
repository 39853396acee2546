"""csi/taint.py: when the node plugin removes its startup taint, and when it leaves the Node alone.

The Kubernetes API is replaced by a small recording fake with the two calls the remover makes on each
side (read CSINode; read and patch the Node); the real exchange runs on the test bed
(tests/e2e/flows/test_attach.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiException, V1Taint

from csi.taint import Outcome, StartupTaintRemover, startup_taint_key

DRIVER = "ebs.csi.aws.com"
KEY = startup_taint_key(DRIVER)


class FakeApi:
    """CSINode drivers and Node taints in memory; `errors` queues, per call in order, an ApiException
    status to raise or None for a call that succeeds."""

    def __init__(self, drivers: list[str], taints: list[str], errors: list[int | None] | None = None) -> None:
        self.drivers = drivers
        self.taints = [V1Taint(key=k, effect="NoExecute") for k in taints]
        self.errors = list(errors or [])
        self.patches: list[dict[str, Any]] = []
        self.resource_version = "7"

    def _maybe_fail(self) -> None:
        status = self.errors.pop(0) if self.errors else None
        if status is not None:
            raise ApiException(status=status, reason="from the fake")

    def read_csi_node(self, name: str) -> Any:
        self._maybe_fail()
        return SimpleNamespace(spec=SimpleNamespace(drivers=[SimpleNamespace(name=d) for d in self.drivers]))

    def read_node(self, name: str) -> Any:
        self._maybe_fail()
        return SimpleNamespace(
            spec=SimpleNamespace(taints=list(self.taints)),
            metadata=SimpleNamespace(resource_version=self.resource_version),
        )

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self._maybe_fail()
        self.patches.append(body)
        self.taints = body["spec"]["taints"]


def remover(api: FakeApi) -> StartupTaintRemover:
    return StartupTaintRemover(DRIVER, "node-a", clients=(api, api), watch_seconds=1, interval=0.01)


def test_registered_plugin_removes_only_its_own_taint_with_a_conditional_patch() -> None:
    api = FakeApi([DRIVER], [KEY, "dedicated"])
    assert remover(api).run_once(api, api) is Outcome.REMOVED
    assert [t.key for t in api.taints] == ["dedicated"]
    assert api.patches[0]["metadata"] == {"resourceVersion": "7"}


@pytest.mark.parametrize(
    ("drivers", "taints", "errors", "outcome"),
    [
        pytest.param(["other.csi.dev"], [KEY], [], Outcome.WAITING, id="not-registered-yet"),
        pytest.param([DRIVER], ["dedicated"], [], Outcome.ABSENT, id="no-taint"),
        pytest.param([DRIVER], [KEY], [404], Outcome.WAITING, id="csinode-missing"),
        pytest.param([DRIVER], [KEY], [None, None, 409], Outcome.WAITING, id="node-changed-meanwhile"),
        pytest.param([DRIVER], [KEY], [403], Outcome.FORBIDDEN, id="rbac-forbids-read"),
        pytest.param([DRIVER], [KEY], [None, None, 403], Outcome.FORBIDDEN, id="rbac-forbids-patch"),
    ],
)
def test_outcomes(drivers: list[str], taints: list[str], errors: list[int | None], outcome: Outcome) -> None:
    api = FakeApi(drivers, taints, errors)
    assert remover(api).run_once(api, api) is outcome


def test_run_retries_a_conflict_then_removes_and_stops() -> None:
    api = FakeApi([DRIVER], [KEY], errors=[])
    calls = {"n": 0}
    real_patch = api.patch_node

    def patch_once_conflicting(name: str, body: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ApiException(status=409, reason="conflict")
        real_patch(name, body)

    api.patch_node = patch_once_conflicting  # type: ignore[method-assign]
    remover(api).run()
    assert calls["n"] == 2 and api.taints == []


def test_run_gives_up_quietly_when_forbidden() -> None:
    api = FakeApi([DRIVER], [KEY], errors=[403])
    remover(api).run()  # returns at once, raises nothing
    assert [t.key for t in api.taints] == [KEY] and api.patches == []


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("not: [valid", id="not-yaml"),
        pytest.param("apiVersion: v1\nkind: Config\n", id="no-context"),
    ],
)
def test_an_unusable_kubeconfig_is_one_warning_not_a_dead_thread(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(content)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with caplog.at_level("WARNING", logger="ballast.taint"):
        StartupTaintRemover(DRIVER, "node-1").run()  # returns, raises nothing
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["startup taint not removed"]
    assert str(config) in caplog.records[0].getMessage()
