"""Coalescing of volume modifications: EBS allows one modification per volume and then a cool-down of
hours, so a resize and a type/IOPS/throughput change arriving together must become one ModifyVolume.

The first request for a volume opens a batch and waits `window` seconds; requests for the same volume
arriving meanwhile join it (largest size wins; parameters merge). The batch is applied once and every
caller gets the same result or the same error. Requests for different volumes never wait on each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from csi.failures import TransientError

R = TypeVar("R")


@dataclass
class Modification:
    """What one batch asks of a volume: a size in bytes (None: keep) and mutable parameters."""

    size_bytes: int | None = None
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass
class _Batch(Generic[R]):
    change: Modification
    done: threading.Event = field(default_factory=threading.Event)
    result: R | None = None
    error: BaseException | None = None


class Coalescer(Generic[R]):
    """Merges concurrent modifications per volume id and applies each batch once with `apply`."""

    def __init__(
        self,
        apply: Callable[[str, Modification], R],
        window: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._apply = apply
        self._window = window
        self._sleep = sleep
        self._lock = threading.Lock()
        self._pending: dict[str, _Batch[R]] = {}

    def submit(
        self, volume_id: str, size_bytes: int | None = None, parameters: Mapping[str, str] | None = None
    ) -> R:
        """Apply (possibly together with concurrent requests) and return the batch result.

        A parameter that a concurrent request in the same batch sets to a different value raises
        TransientError for the later request: it is retried after this batch."""
        params = dict(parameters or {})
        with self._lock:
            batch = self._pending.get(volume_id)
            leader = batch is None
            if batch is None:
                batch = _Batch(Modification(size_bytes, params))
                self._pending[volume_id] = batch
            else:
                clash = [k for k, v in params.items() if batch.change.parameters.get(k, v) != v]
                if clash:
                    raise TransientError(
                        f"volume {volume_id}: a modification with other values for {', '.join(clash)} "
                        "is in progress; retry when it completes"
                    )
                batch.change.parameters.update(params)
                if size_bytes is not None:
                    batch.change.size_bytes = max(size_bytes, batch.change.size_bytes or 0)
        if leader:
            self._sleep(self._window)
            with self._lock:
                del self._pending[volume_id]
            try:
                batch.result = self._apply(volume_id, batch.change)
            except BaseException as exc:
                batch.error = exc
            finally:
                batch.done.set()
        else:
            batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert batch.result is not None
        return batch.result
