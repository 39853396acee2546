"""Fixtures of the migration e2e tests: a migration release of the chart per test (see harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.migration.harness import MigrationRelease, cleanup, migration_release


@pytest.fixture
def release(cluster: Cluster, namespace: str) -> Iterator[MigrationRelease]:
    """The chart's migration RBAC in the test's namespace; controllers the test starts are stopped."""
    made = migration_release(cluster, namespace)
    try:
        yield made
    finally:
        cleanup(made)
