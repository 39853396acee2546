"""Legacy-or-CSI routing of in-tree volume operations, chosen per plugin by the feature gates.

Contracts:
- Every operation first resolves its spec to the CSI identity (driver, volume handle) by translation,
  which is pure and gate-free, so both paths always address the same backend volume.
- The path is chosen *inside* the per-volume migration lock, from the gates read at that moment, and the
  whole operation runs under that lock. A gate flip during an operation only affects later operations:
  no operation runs twice or on both paths, and the two paths never act on one volume at once.
- Migration enabled for the plugin -> the CSI path. Otherwise the legacy path, unless the plugin's
  `InTreePlugin<X>Unregister` gate is on: then `LegacyPathRefused` is raised and nothing is done.
- Both paths stage at kubelet's CSI layout, `<kubelet>/plugins/kubernetes.io/csi/<driver>/
  <sha256(handle)>/globalmount`, so either path can unstage what the other staged.
- Provisioning returns the PV in its in-tree form (as Kubernetes keeps migrated PVs), whichever path ran.

This module imports nothing from csi/ and nothing from grpc: the paths are injected (`VolumePath`).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shim.errors import TranslationError
from shim.gates import PLUGIN_GATES, FeatureGates
from shim.plugins.fields import JSON
from shim.translate import Translator

log = logging.getLogger("ballast.shim.router")

FS_TYPE_PARAMETER = "csi.storage.k8s.io/fstype"
CSI_PLUGIN_DIR = "plugins/kubernetes.io/csi"


class MigrationError(Exception):
    """An operation the router cannot route; the message says what to change."""


class LegacyPathRefused(MigrationError):
    """The plugin's in-tree code is unregistered, so the legacy path may not run."""


class Operation(enum.Enum):
    PROVISION = "provision"
    DELETE = "delete"
    ATTACH = "attach"
    DETACH = "detach"
    MOUNT_DEVICE = "mount_device"
    UNMOUNT_DEVICE = "unmount_device"
    MOUNT = "mount"
    UNMOUNT = "unmount"
    EXPAND = "expand"


class Route(enum.Enum):
    LEGACY = "legacy"
    CSI = "csi"


# --------------------------------------------------------------------------- plain values


@dataclass(frozen=True)
class VolumeSpec:
    """What an operation is about: a PV, or an inline pod volume with its pod's namespace."""

    pv: JSON | None = None
    volume: JSON | None = None
    namespace: str = ""

    @classmethod
    def of_pv(cls, pv: JSON) -> VolumeSpec:
        return cls(pv=pv)

    @classmethod
    def inline(cls, volume: JSON, namespace: str) -> VolumeSpec:
        return cls(volume=volume, namespace=namespace)


@dataclass(frozen=True)
class Volume:
    """One backend volume as both paths see it, taken from the translated CSI source."""

    plugin: str  # in-tree plugin name, e.g. kubernetes.io/aws-ebs
    driver: str  # CSI driver name, e.g. ebs.csi.aws.com
    handle: str  # CSI volume handle == backend volume id
    fs_type: str = ""
    read_only: bool = False
    attributes: Mapping[str, str] = field(default_factory=dict)  # CSI volume attributes (partition, ...)

    @property
    def key(self) -> str:
        """The migration-lock key: one per backend volume."""
        return f"{self.driver}/{self.handle}"


@dataclass(frozen=True)
class ProvisionRequest:
    """A new volume from a StorageClass, in CSI terms (the class already translated)."""

    name: str
    size_bytes: int
    fs_type: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)  # without the fs type key
    requisite: tuple[Mapping[str, str], ...] = ()  # CSI topology segments from allowedTopologies


@dataclass(frozen=True)
class Provisioned:
    """What a path created: the handle, its size, its topology segment (CSI keys) and attributes."""

    handle: str
    size_bytes: int
    topology: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)


class VolumePath(Protocol):
    """One way of carrying out volume operations. Every method is idempotent: repeating a completed
    operation succeeds without doing it again; undoing something not done is a no-op."""

    def provision(self, driver: str, request: ProvisionRequest) -> Provisioned: ...

    def delete(self, volume: Volume) -> None: ...

    def attach(self, volume: Volume, node_id: str) -> dict[str, str]: ...

    def detach(self, volume: Volume, node_id: str) -> None: ...

    def mount_device(self, volume: Volume, publish_context: Mapping[str, str], staging_path: str) -> None: ...

    def unmount_device(self, volume: Volume, staging_path: str) -> None: ...

    def mount(
        self, volume: Volume, publish_context: Mapping[str, str], staging_path: str, target_path: str
    ) -> None: ...

    def unmount(self, volume: Volume, target_path: str) -> None: ...

    def expand(self, volume: Volume, size_bytes: int, staging_path: str) -> int: ...


@dataclass(frozen=True)
class RouteEvent:
    """One routed operation: which path ran it, on which volume."""

    operation: Operation
    route: Route
    key: str


# --------------------------------------------------------------------------- gates and locks


class GateSwitch:
    """The current feature gates, replaceable at any time (a flip); thread-safe."""

    def __init__(self, gates: FeatureGates | None = None) -> None:
        self._gates = gates or FeatureGates()
        self._lock = threading.Lock()

    def set(self, gates: FeatureGates | str) -> None:
        value = FeatureGates.parse(gates) if isinstance(gates, str) else gates
        with self._lock:
            self._gates = value

    def __call__(self) -> FeatureGates:
        with self._lock:
            return self._gates


class MigrationLocks:
    """Per-volume exclusive locks shared by both paths.

    Inside one process a lock table keyed by volume key serialises threads; with a `lock_dir`, an
    exclusive flock on `<lock_dir>/<sha256(key)>.lock` serialises processes too. Lock files are kept
    (removing them would race with a waiter). Blocking; not re-entrant.
    """

    def __init__(self, lock_dir: str | None = None) -> None:
        self._lock_dir = lock_dir
        self._table: dict[str, tuple[threading.Lock, int]] = {}
        self._guard = threading.Lock()
        if lock_dir:
            os.makedirs(lock_dir, mode=0o700, exist_ok=True)

    def _acquire_local(self, key: str) -> threading.Lock:
        with self._guard:
            lock, users = self._table.get(key, (threading.Lock(), 0))
            self._table[key] = (lock, users + 1)
        lock.acquire()
        return lock

    def _release_local(self, key: str, lock: threading.Lock) -> None:
        lock.release()
        with self._guard:
            _, users = self._table[key]
            if users == 1:
                del self._table[key]
            else:
                self._table[key] = (lock, users - 1)

    def lock_file(self, key: str) -> str | None:
        if not self._lock_dir:
            return None
        return os.path.join(self._lock_dir, hashlib.sha256(key.encode()).hexdigest() + ".lock")

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        lock = self._acquire_local(key)
        try:
            path = self.lock_file(key)
            if path is None:
                yield
                return
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing the descriptor drops the flock
        finally:
            self._release_local(key, lock)

    def __len__(self) -> int:
        """Keys currently held or waited for in this process."""
        with self._guard:
            return len(self._table)


def staging_path(kubelet_dir: str, driver: str, handle: str) -> str:
    """kubelet's CSI device mount path for a volume (the same for both paths)."""
    digest = hashlib.sha256(handle.encode()).hexdigest()
    return os.path.join(kubelet_dir, CSI_PLUGIN_DIR, driver, digest, "globalmount")


# --------------------------------------------------------------------------- the router


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def volume_from_csi_pv(plugin: str, pv: JSON) -> Volume:
    """The Volume of a translated PV (its spec.csi source)."""
    spec = pv.get("spec")
    csi = spec.get("csi") if isinstance(spec, dict) else None
    if not isinstance(csi, dict) or not csi.get("driver") or not csi.get("volumeHandle"):
        raise TranslationError("translated volume has no CSI driver or volume handle")
    return Volume(
        plugin=plugin,
        driver=str(csi["driver"]),
        handle=str(csi["volumeHandle"]),
        fs_type=str(csi.get("fsType") or ""),
        read_only=bool(csi.get("readOnly", False)),
        attributes=_str_map(csi.get("volumeAttributes")),
    )


def provision_request(name: str, size_bytes: int, csi_storage_class: JSON) -> ProvisionRequest:
    """The request for a translated StorageClass: fs type split off, allowedTopologies as segments."""
    params = _str_map(csi_storage_class.get("parameters"))
    fs_type = params.pop(FS_TYPE_PARAMETER, "")
    segments: list[dict[str, str]] = []
    for term in csi_storage_class.get("allowedTopologies") or []:
        exprs = term.get("matchLabelExpressions") if isinstance(term, dict) else None
        choices: list[dict[str, str]] = [{}]
        for expr in exprs or []:
            values = [str(v) for v in expr.get("values") or []]
            choices = [{**seg, str(expr.get("key")): v} for seg in choices for v in values]
        segments.extend(seg for seg in choices if seg)
    return ProvisionRequest(name, size_bytes, fs_type, params, tuple(segments))


class Router:
    """Routes each operation on a legacy volume spec to the legacy path or the CSI path.

    `legacy` maps in-tree plugin names to their legacy path; `csi` serves every CSI driver.
    `gates` is read once per operation, under the volume's lock. `on_route`, if given, is called
    (under the lock) with each routing decision before the operation runs.
    """

    def __init__(
        self,
        *,
        gates: Callable[[], FeatureGates],
        csi: VolumePath,
        legacy: Mapping[str, VolumePath],
        kubelet_dir: str,
        locks: MigrationLocks | None = None,
        translator: Translator | None = None,
        on_route: Callable[[RouteEvent], None] | None = None,
    ) -> None:
        self._gates = gates
        self._csi = csi
        self._legacy = dict(legacy)
        self._kubelet_dir = kubelet_dir
        self.locks = locks if locks is not None else MigrationLocks()
        self._translator = translator if translator is not None else Translator()
        self._on_route = on_route

    # ---- resolution

    def resolve(self, spec: VolumeSpec) -> Volume:
        """The backend volume a spec names (TranslationError when it has no migratable source)."""
        t = self._translator
        plugin = t.get_in_tree_plugin_name_from_spec(spec.pv, spec.volume)
        if spec.pv is not None:
            translated = t.translate_in_tree_pv_to_csi(spec.pv)
        else:
            translated = t.translate_in_tree_inline_volume_to_csi(spec.volume, spec.namespace)
        return volume_from_csi_pv(plugin, translated)

    def staging_path(self, volume: Volume) -> str:
        return staging_path(self._kubelet_dir, volume.driver, volume.handle)

    def route(self, plugin: str) -> Route:
        """The path the current gates choose for `plugin`; LegacyPathRefused when none may run."""
        gates = self._gates()
        if gates.is_migration_enabled(plugin):
            return Route.CSI
        if gates.is_plugin_unregistered(plugin):
            names = PLUGIN_GATES[plugin]
            raise LegacyPathRefused(
                f"in-tree plugin {plugin} is unregistered ({names.unregister}=true), so the legacy path is "
                f"refused; enable CSIMigration and {names.migration} to serve it through CSI"
            )
        return Route.LEGACY

    def _path(self, route: Route, plugin: str) -> VolumePath:
        if route is Route.CSI:
            return self._csi
        path = self._legacy.get(plugin)
        if path is None:
            raise MigrationError(
                f"no legacy path is configured for {plugin}; enable migration for it to use the CSI driver"
            )
        return path

    @contextlib.contextmanager
    def _routed(self, operation: Operation, plugin: str, key: str) -> Iterator[VolumePath]:
        with self.locks.hold(key):
            route = self.route(plugin)
            path = self._path(route, plugin)
            log.info("%s %s via the %s path", operation.value, key, route.value)
            if self._on_route is not None:
                self._on_route(RouteEvent(operation, route, key))
            yield path

    # ---- operations

    def provision(self, plugin: str, storage_class: JSON, name: str, size_bytes: int) -> JSON:
        """Create a volume for a PVC named `name`; returns its PV in in-tree form. Idempotent by name."""
        csi_class = self._translator.translate_in_tree_storage_class_to_csi(plugin, storage_class)
        request = provision_request(name, size_bytes, csi_class)
        driver = self._translator.get_csi_name_from_in_tree_name(plugin)
        with self._routed(Operation.PROVISION, plugin, f"{driver}/create:{name}") as path:
            created = path.provision(driver, request)
        csi_pv = self._csi_pv(driver, name, request, created, storage_class)
        return self._translator.translate_csi_pv_to_in_tree(csi_pv)

    @staticmethod
    def _csi_pv(
        driver: str, name: str, request: ProvisionRequest, created: Provisioned, storage_class: JSON
    ) -> JSON:
        csi: JSON = {"driver": driver, "volumeHandle": created.handle}
        if request.fs_type:
            csi["fsType"] = request.fs_type
        if created.attributes:
            csi["volumeAttributes"] = dict(created.attributes)
        spec: JSON = {
            "capacity": {"storage": str(created.size_bytes)},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
            "csi": csi,
        }
        if created.topology:
            spec["nodeAffinity"] = {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": k, "operator": "In", "values": [v]}
                                for k, v in sorted(created.topology.items())
                            ]
                        }
                    ]
                }
            }
        return {"metadata": {"name": name}, "spec": spec}

    def delete(self, spec: VolumeSpec) -> None:
        """Delete the backend volume. Already gone -> done."""
        volume = self.resolve(spec)
        with self._routed(Operation.DELETE, volume.plugin, volume.key) as path:
            path.delete(volume)

    def attach(self, spec: VolumeSpec, node_id: str) -> dict[str, str]:
        """Attach to `node_id`; returns the publish context mount_device and mount need."""
        volume = self.resolve(spec)
        with self._routed(Operation.ATTACH, volume.plugin, volume.key) as path:
            return path.attach(volume, node_id)

    def detach(self, spec: VolumeSpec, node_id: str) -> None:
        """Detach from `node_id`. Not attached there -> no-op."""
        volume = self.resolve(spec)
        with self._routed(Operation.DETACH, volume.plugin, volume.key) as path:
            path.detach(volume, node_id)

    def mount_device(self, spec: VolumeSpec, publish_context: Mapping[str, str]) -> str:
        """Stage the attached device (format if blank, mount); returns the staging path."""
        volume = self.resolve(spec)
        target = self.staging_path(volume)
        with self._routed(Operation.MOUNT_DEVICE, volume.plugin, volume.key) as path:
            path.mount_device(volume, publish_context, target)
        return target

    def unmount_device(self, spec: VolumeSpec) -> None:
        """Unstage the device. Not staged -> no-op."""
        volume = self.resolve(spec)
        with self._routed(Operation.UNMOUNT_DEVICE, volume.plugin, volume.key) as path:
            path.unmount_device(volume, self.staging_path(volume))

    def mount(self, spec: VolumeSpec, publish_context: Mapping[str, str], target_path: str) -> None:
        """Make the staged volume visible at a pod's `target_path`."""
        volume = self.resolve(spec)
        with self._routed(Operation.MOUNT, volume.plugin, volume.key) as path:
            path.mount(volume, publish_context, self.staging_path(volume), target_path)

    def unmount(self, spec: VolumeSpec, target_path: str) -> None:
        """Remove the volume from `target_path`. Not mounted -> no-op."""
        volume = self.resolve(spec)
        with self._routed(Operation.UNMOUNT, volume.plugin, volume.key) as path:
            path.unmount(volume, target_path)

    def expand(self, spec: VolumeSpec, size_bytes: int) -> int:
        """Grow the volume (and its filesystem when staged here); returns the new size."""
        volume = self.resolve(spec)
        with self._routed(Operation.EXPAND, volume.plugin, volume.key) as path:
            return path.expand(volume, size_bytes, self.staging_path(volume))
