"""csi/inflight.py: a duplicate is refused at once, and the count the metrics export is of operations."""

from __future__ import annotations

import pytest

from csi.failures import BusyError
from csi.inflight import InFlight


def test_a_held_key_refuses_a_duplicate_and_frees_on_exit() -> None:
    inflight = InFlight()
    with inflight.hold("vol:a", "create:x"):
        with pytest.raises(BusyError, match="already in progress"), inflight.hold("vol:b", "vol:a"):
            pass
        with inflight.hold("vol:b"):  # other keys go on
            pass
    with inflight.hold("vol:a"):  # released
        pass


def test_an_operation_counts_once_however_many_keys_it_holds() -> None:
    """ballast_inflight_operations: DeleteVolume holds three keys and is one operation."""
    inflight = InFlight()
    with inflight.hold("vol:a", "name:a", "create:a"):
        assert len(inflight) == 1
        with inflight.hold("vol:b"):
            assert len(inflight) == 2
        with pytest.raises(BusyError), inflight.hold("vol:a"):
            pass
        assert len(inflight) == 1, "a refused hold is no operation"
    assert len(inflight) == 0
