"""The controller's caches after the API server goes away: a broken watch or any failure relists (the
reflector never dies), `synced` is down from the failure until a relist completes, and the controller's
workers act on nothing meanwhile."""

from __future__ import annotations

import logging
import time

import pytest

from shim.cli import build_parser
from shim.migrate import options
from shim.migrate.cache import Reflector
from shim.migrate.controller import Controller
from shim.migrate.kube import PODS, KubeClient
from shim.migrate.metrics import Metrics
from tests.e2e.process import wait_for
from tests.shim.fake_kube_api import FakeKubeAPI
from tests.shim.migrate.samples import Obj, sample_pv

PODS_PATH = "/api/v1/pods"


def pod(name: str) -> Obj:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}, "spec": {}}


def pod_list(*names: str) -> Obj:
    return {"kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": [pod(n) for n in names]}


def names(reflector: Reflector) -> set[str]:
    return reflector.store.keys()


def test_a_watch_that_breaks_relists_and_the_store_catches_up(api: FakeKubeAPI, client: KubeClient) -> None:
    api.lists[PODS_PATH] = pod_list("a")
    api.watches[PODS_PATH] = [{"type": "ADDED", "object": pod("b")}]  # then the stream breaks
    reflector = Reflector(client, PODS, lambda old, new: None)
    reflector.start()
    try:
        wait_for(lambda: names(reflector) == {"ns/a", "ns/b"}, 10, "the listed and the watched pod")
        api.watches[PODS_PATH] = []
        api.lists[PODS_PATH] = pod_list("a", "c")  # b went, c came while no watch was open
        wait_for(lambda: names(reflector) == {"ns/a", "ns/c"}, 10, "a relist after the broken watch")
        assert reflector.alive()
    finally:
        reflector.stop()


def test_synced_is_down_from_a_failure_until_a_relist_completes(api: FakeKubeAPI, client: KubeClient) -> None:
    api.lists[PODS_PATH] = pod_list("a")
    api.failures[PODS_PATH] = (500, "InternalError")
    reflector = Reflector(client, PODS, lambda old, new: None)
    reflector.start()
    try:
        time.sleep(0.5)
        assert not reflector.synced.is_set() and reflector.alive()
        del api.failures[PODS_PATH]
        wait_for(reflector.synced.is_set, 10, "the first list")
        api.failures[PODS_PATH] = (500, "InternalError")  # every relist fails from now on
        api.break_watches()
        wait_for(lambda: not reflector.synced.is_set(), 10, "synced to go down")
        time.sleep(1.0)
        assert not reflector.synced.is_set(), "a Store that cannot relist is never called synced"
        del api.failures[PODS_PATH]
        wait_for(reflector.synced.is_set, 15, "synced again after a relist")
        assert reflector.alive()
    finally:
        reflector.stop()


def test_an_unexpected_error_is_logged_and_relists(
    api: FakeKubeAPI, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    api.lists[PODS_PATH] = pod_list("a")
    seen: list[str] = []

    def on_change(old: Obj | None, new: Obj | None) -> None:
        if new is not None and not seen:
            seen.append("failed")
            raise RuntimeError("a handler bug")
        seen.append(str((new or {}).get("metadata", {}).get("name")))

    reflector = Reflector(client, PODS, on_change)
    with caplog.at_level(logging.ERROR, logger="shim.migrate.cache"):
        reflector.start()
        try:
            wait_for(lambda: seen == ["failed"], 10, "the failing callback")
            api.lists[PODS_PATH] = pod_list("a", "c")
            wait_for(lambda: "c" in seen, 10, "later changes after the failure")
            assert reflector.alive()
        finally:
            reflector.stop()
    assert "pods: list/watch failed unexpectedly" in caplog.text and "a handler bug" in caplog.text


def test_workers_act_on_nothing_while_a_cache_is_not_synced(api: FakeKubeAPI, client: KubeClient) -> None:
    args = build_parser().parse_args(
        ["controller", "--namespace", "ns", "--feature-gates", "CSIMigration=true,CSIMigrationAWS=true"]
    )
    options.check(args)
    controller = Controller(client, Metrics("test", "test"), args)
    controller.pvs.store.put(sample_pv("aws-ebs", name="pv-1"))  # in-tree, its gate on: it would move
    for reflector in controller.reflectors:
        reflector.synced.set()
    controller.pods.synced.clear()  # relisting
    controller._process("pv/pv-1")
    assert api.requests == [], "no lock taken, nothing read: the caches may hide a user of the PV"
    assert not controller._queue.idle(), "the key comes back once the caches are synced"
