"""Fixtures of the migration unit tests: the fake API server (tests/shim/fake_kube_api.py), empty until a
test fills its lists, and a KubeClient talking to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3

from shim.migrate.kube import Connection, KubeClient
from tests.shim.fake_kube_api import FakeKubeAPI


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(lists={}) as server:
        yield server


@pytest.fixture
def client(api: FakeKubeAPI) -> Iterator[KubeClient]:
    made = KubeClient(Connection(api.url, urllib3.PoolManager(), lambda: {}))
    yield made
    made.close()
