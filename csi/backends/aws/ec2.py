"""The one call site of the EC2 API: every request of the aws backend goes through `Ec2.call`, which
retries throttling and server-side failures with capped exponential backoff and jitter, surfaces them as
TransientError (UNAVAILABLE, so the sidecar retries later) once the retries are spent, and maps every
other EC2 error code through errors.AWS_ERRORS. The describe/poll helpers every part of the backend uses
live here too.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
)
from botocore.parsers import ResponseParserError

from csi import failures
from csi.backends.aws.batching import Batcher, Records, grouped
from csi.backends.aws.errors import UnsupportedActionError, error_code, may_have_acted, retried, translate

log = logging.getLogger("ballast.aws")
# Seconds a volume EC2 just created may go unlisted (its API is eventually consistent) before it is
# taken for gone (at most half the wait for it to become available).
LISTING_LAG = 10.0
T = TypeVar("T")
PAGE_SIZE = 500  # DescribeVolumes allows 5..500 per page, DescribeSnapshots 5..1000


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter; `attempts` counts the first try."""

    attempts: int = 6
    initial: float = 0.2
    maximum: float = 5.0

    def delays(self) -> list[float]:
        return [random.uniform(0, min(self.maximum, self.initial * 2**i)) for i in range(self.attempts - 1)]


class Ec2:
    """A boto3 EC2 client behind one call site: retries, then maps errors.

    `sleep` is injectable so tests can count back-off without waiting; `wait_timeout` bounds `poll`.
    """

    def __init__(
        self,
        client: Any,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        wait_timeout: float = 300.0,
        page_size: int = PAGE_SIZE,
        batch_window: float = 0.0,
    ) -> None:
        self.client = client
        self.batch_window = batch_window  # > 0: Describe lookups are batched (batching.py)
        self.batchers: dict[str, Batcher] = {}
        self.backoff = backoff or Backoff()
        self.wait_timeout = wait_timeout
        self.page_size = page_size
        self._sleep = sleep
        self._lock = threading.Lock()
        self.retried: Counter[str] = Counter()  # operation -> attempts retried (throttled, failed, ...)

    @property
    def retries(self) -> int:
        """Attempts retried so far, all operations together."""
        return sum(self.retry_counts().values())

    def retry_counts(self) -> dict[str, int]:
        """Attempts retried so far, by operation."""
        with self._lock:
            return dict(self.retried)

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Invoke `client.<operation>(**params)` (operation in snake_case) and return the response."""
        return self._call(operation, params, None)

    def call_once(
        self, operation: str, landed: Callable[[], dict[str, Any] | None], **params: Any
    ) -> dict[str, Any]:
        """`call` for an operation EC2 cannot make idempotent (CreateSnapshot takes no client token):
        before each retry `landed()` is asked whether the failed attempt took effect after all (its
        answer lost on the way back); what it returns is the response, and nothing is tried again.
        After an answer that may have been lost (a connection failure, or a server error that can
        follow the work done: errors.may_have_acted), EC2 may not list what the attempt made for a
        moment: `landed()` is asked again for up to LISTING_LAG seconds."""
        return self._call(operation, params, landed)

    def _call(
        self,
        operation: str,
        params: dict[str, Any],
        landed: Callable[[], dict[str, Any] | None] | None,
    ) -> dict[str, Any]:
        method = getattr(self.client, operation)
        delays = self.backoff.delays()
        while True:
            lost = False
            try:
                response: dict[str, Any] = method(**params)
                return response
            except ClientError as exc:
                if not retried(exc) or not delays:
                    raise translate(exc, operation) from exc
                log.info("EC2 %s: %s, retrying", operation, error_code(exc))
                lost = may_have_acted(exc)
            except (ConnectionError, HTTPClientError) as exc:
                if not delays:
                    raise failures.TransientError(f"EC2 {operation}: endpoint unreachable: {exc}") from exc
                log.info("EC2 %s: %s, retrying", operation, exc)
                lost = True
            except NoCredentialsError as exc:
                raise failures.FailedPreconditionError(f"EC2 {operation}: no AWS credentials found") from exc
            except ParamValidationError as exc:
                raise failures.InvalidParameterError(f"EC2 {operation}: {exc}") from exc
            except ResponseParserError as exc:
                raise UnsupportedActionError(
                    f"EC2 {operation}: the endpoint answered with something that is not an EC2 response"
                ) from exc
            except BotoCoreError as exc:
                raise failures.DriverError(f"EC2 {operation}: {exc}") from exc
            with self._lock:
                self.retried[operation] += 1
            self._sleep(delays.pop(0))
            if landed is not None and (found := self._landed(landed, lost)) is not None:
                log.info("EC2 %s: the failed attempt took effect; not repeated", operation)
                return found

    def _landed(self, landed: Callable[[], dict[str, Any] | None], lost: bool) -> dict[str, Any] | None:
        """`landed()`; after a possibly lost answer, asked until something is found or _listing_lag
        has passed."""
        deadline = time.monotonic() + (self._listing_lag if lost else 0)
        while (found := landed()) is None and time.monotonic() < deadline:
            time.sleep(0.5)  # each look is an EC2 call: paced by the clock, whatever `sleep` the backoff has
        return found

    @property
    def _listing_lag(self) -> float:
        """How long something EC2 just made may go unlisted: LISTING_LAG, at most half of `wait_timeout`."""
        return min(LISTING_LAG, self.wait_timeout / 2)

    def describe_all(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a filtered listing, `page_size` per request (EC2's MaxResults; without it a large
        account's answer can time out), following NextToken."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            paging = {"MaxResults": self.page_size, **({"NextToken": token} if token else {})}
            response = self.call(operation, **params, **paging)
            items.extend(response.get(key, []))
            token = response.get("NextToken", "")
            if not token:
                return items

    def lookup(self, kind: str, key: str, fetch: Callable[[list[str]], dict[str, Records]]) -> Records:
        """The records `fetch` answers for `key`: at once, or with batching on, in one call of `fetch`
        with the keys of the concurrent lookups of the same `kind` (batching.py)."""
        if self.batch_window <= 0:
            return fetch([key]).get(key, [])
        with self._lock:
            batcher = self.batchers.get(kind)
            if batcher is None:
                batcher = self.batchers[kind] = Batcher(fetch, self.batch_window)
        return batcher.get(key)

    def _volumes_by_id(self, ids: list[str]) -> dict[str, Records]:
        """A filter, not VolumeIds: an unknown id is left out instead of failing the whole call."""
        found = self.describe_all(
            "describe_volumes", "Volumes", Filters=[{"Name": "volume-id", "Values": ids}]
        )
        return grouped(found, lambda v: str(v["VolumeId"]))

    def describe_volume(self, vid: str) -> dict[str, Any]:
        """The EC2 record of one volume; missing or being deleted -> NotFoundError."""
        volume = self.find_volume(vid)
        if volume is None:
            raise failures.NotFoundError(f"volume {vid} not found")
        return volume

    def find_volume(self, vid: str) -> dict[str, Any] | None:
        """The EC2 record of one volume; None when EC2 does not list it (which it may not, for a
        moment, right after creating it); being deleted -> NotFoundError."""
        try:
            if self.batch_window > 0:
                volumes = self.lookup("volume-id", vid, self._volumes_by_id)
            else:
                volumes = self.call("describe_volumes", VolumeIds=[vid]).get("Volumes", [])
        except failures.NotFoundError:
            return None
        if volumes and volumes[0].get("State") in ("deleting", "deleted"):
            raise failures.NotFoundError(f"volume {vid} is being deleted")
        return dict(volumes[0]) if volumes else None

    def wait_available(self, vid: str) -> dict[str, Any]:
        """The volume's record once EC2 reports it available (or in use). A volume EC2 failed to create
        is deleted and reported (INTERNAL: the caller's retry creates it anew). EC2 may not list a
        volume it has just created: one not listed is waited for _listing_lag seconds before it is
        NotFoundError; one being deleted is NotFoundError at once."""
        since = time.monotonic()

        def check() -> dict[str, Any] | None:
            volume = self.find_volume(vid)
            if volume is None:
                if time.monotonic() - since > self._listing_lag:
                    raise failures.NotFoundError(f"volume {vid} not found")
                return None
            if volume["State"] == "error":
                with contextlib.suppress(failures.DriverError):
                    self.call("delete_volume", VolumeId=vid)
                raise failures.DriverError(
                    f"EBS could not create volume {vid} (state error); it was deleted, retry"
                )
            return volume if volume["State"] in ("available", "in-use") else None

        return self.poll(f"volume {vid} to become available", check)

    def describe_snapshot(self, sid: str) -> dict[str, Any]:
        """The EC2 record of one snapshot; missing -> NotFoundError."""
        snaps = self.call("describe_snapshots", SnapshotIds=[sid]).get("Snapshots", [])
        if not snaps:
            raise failures.NotFoundError(f"snapshot {sid} not found")
        snap: dict[str, Any] = snaps[0]
        return snap

    def zones(self) -> list[str]:
        """The available zones of the region, sorted."""
        available = [{"Name": "state", "Values": ["available"]}]
        response = self.call("describe_availability_zones", Filters=available)
        return sorted(z["ZoneName"] for z in response.get("AvailabilityZones", []))

    def poll(self, what: str, check: Callable[[], T | None]) -> T:
        """Call `check` with growing pauses until it returns non-None; TransientError after
        `wait_timeout` seconds (the operation goes on in EC2; a retry finds it)."""
        deadline = time.monotonic() + self.wait_timeout
        delay = 0.05
        while True:
            result = check()
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise failures.TransientError(
                    f"timed out waiting for {what}; the operation continues in EC2, retry"
                )
            self._sleep(delay)
            delay = min(delay * 2, 2.0)
