"""Fixtures of the Kubernetes test bed (see tests/e2e/cluster.py and docs/testing.md).

- `cluster` (session): one control plane shared by every e2e test of the run;
- `kube` (session): a REST client (tests/e2e/kube.py) authenticated as cluster admin on it;
- `namespace` (function): a fresh namespace, deleted after the test.
Tests needing a control plane of their own (other feature gates, a clean etcd) use
`tests.e2e.cluster.running_cluster()` directly.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster, running_cluster
from tests.e2e.kube import Kube, namespaces, service_accounts


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as booted:
        yield booted


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    return cluster.admin()


@contextlib.contextmanager
def fresh_namespace(kube: Kube) -> Iterator[str]:
    """A new namespace (with its default ServiceAccount, which pods need), deleted on exit."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kube.create(namespaces(), {"metadata": {"name": name}})
    try:
        kube.wait(
            service_accounts(name, "default"), lambda _: True, 30, f"the default ServiceAccount in {name}"
        )
        yield name
    finally:
        kube.delete(namespaces(name))


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    with fresh_namespace(kube) as name:
        yield name
