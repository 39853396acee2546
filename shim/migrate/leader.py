"""Leader election on a coordination.k8s.io/v1 Lease, with Kubernetes' leader-election semantics.

A candidate takes the Lease when it does not exist, has no holder, is its own, or has not changed for
a whole lease duration as this process observed it (clock skew between machines never matters). The
leader renews every retry period; if no renewal succeeds within the renew deadline it has lost the
lease and must stop working. On a clean stop the leader releases the Lease (clears the holder) so the
next candidate takes over at once. The holder identity carries the version (`<pod>_<version>`), and
the version is also written to the annotation migration.ballast.io/version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from shim.migrate.kube import LEASES, ApiError, KubeClient
from shim.migrate.lock import ANN_VERSION, Observations, holder_of, micro_time
from shim.migrate.objects import MANAGED_BY, MANAGER, JsonObj

log = logging.getLogger(__name__)


class ElectionConfig(NamedTuple):
    namespace: str
    name: str
    identity: str
    version: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


class LeaderElector:
    """Runs a callback while this process leads; see the module docstring."""

    def __init__(self, client: KubeClient, config: ElectionConfig, on_change: Callable[[bool], None]) -> None:
        self._client = client
        self._config = config
        self._on_change = on_change
        self._observations = Observations()
        self._lease: JsonObj | None = None

    def _body(self, lease: JsonObj | None) -> JsonObj:
        config, now = self._config, micro_time()
        base = lease or {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": config.name, "namespace": config.namespace, "labels": {MANAGED_BY: MANAGER}},
        }
        spec = dict(base.get("spec") or {})
        if spec.get("holderIdentity") != config.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        spec.update(
            holderIdentity=config.identity,
            renewTime=now,
            leaseDurationSeconds=max(1, round(config.lease_duration)),
        )
        metadata = dict(base["metadata"])
        metadata["annotations"] = {**(metadata.get("annotations") or {}), ANN_VERSION: config.version}
        return {**base, "metadata": metadata, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this process holds the Lease afterwards."""
        config = self._config
        try:
            lease = self._client.get(LEASES, config.name, config.namespace)
        except ApiError as exc:
            if not exc.not_found:
                log.warning("leader election: reading lease %s failed: %s", config.name, exc)
                return False
            return self._write(None)
        holder = holder_of(lease)
        if holder and holder != config.identity:
            duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or config.lease_duration)
            if self._observations.unchanged_for(lease) < duration:
                return False
        return self._write(lease)

    def _write(self, lease: JsonObj | None) -> bool:
        try:
            if lease is None:
                self._lease = self._client.create(LEASES, self._body(None), self._config.namespace)
            else:
                self._lease = self._client.update(LEASES, self._body(lease))
        except ApiError as exc:
            if not (exc.conflict or exc.already_exists):
                log.warning("leader election: writing lease %s failed: %s", self._config.name, exc)
            return False
        return True

    def release(self) -> None:
        """Clear the holder so another candidate takes over without waiting for expiry."""
        if self._lease is None or holder_of(self._lease) != self._config.identity:
            return
        body = {
            **self._lease,
            "spec": {**self._lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1},
        }
        try:
            self._client.update(LEASES, body)
        except ApiError as exc:
            log.warning("leader election: releasing lease %s failed: %s", self._config.name, exc)

    def _acquire(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            stop.wait(self._config.retry_period)
        return False

    def run(self, lead: Callable[[threading.Event], None], stop: threading.Event) -> bool:
        """Block until `stop` (returns True, lease released) or the lease is lost (returns False).

        `lead(stopping)` runs in a thread while this process leads; `stopping` is set when it must stop.
        """
        if not self._acquire(stop):
            return True
        log.info(
            "leader election: %s leads (lease %s/%s)",
            self._config.identity,
            self._config.namespace,
            self._config.name,
        )
        self._on_change(True)
        stopping = threading.Event()
        worker = threading.Thread(target=lead, args=(stopping,), name="leader", daemon=True)
        worker.start()
        kept = self._renew_until(stop)
        stopping.set()
        worker.join()
        self._on_change(False)
        if kept:
            self.release()
        return kept

    def _renew_until(self, stop: threading.Event) -> bool:
        last = time.monotonic()
        while not stop.wait(self._config.retry_period):
            if self.try_acquire_or_renew():
                last = time.monotonic()
            elif time.monotonic() - last > self._config.renew_deadline:
                log.error(
                    "leader election: lease %s lost (not renewed within %.0fs)",
                    self._config.name,
                    self._config.renew_deadline,
                )
                return False
        return True
