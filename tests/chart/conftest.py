"""Fixtures of the chart tests."""

from __future__ import annotations

import pytest

from tests.chart.render import VALUE_SET_IDS


@pytest.fixture(params=VALUE_SET_IDS)
def set_id(request: pytest.FixtureRequest) -> str:
    """Each values set of tests.chart.render.VALUE_SETS in turn."""
    value: str = request.param
    return value
