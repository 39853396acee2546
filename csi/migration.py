"""The two concrete paths of the migration router (shim.router): through the CSI driver, or the old way.

`CsiPath` performs each operation as CSI RPCs against the driver's gRPC endpoint (one endpoint per CSI
driver name). `LegacyPath` is the in-tree way: the same Backend and the same mount layer, called directly.
Both act on the same backend volume and leave the same durable record -- the backend's attach records and
the kernel's mount table at kubelet's CSI staging path -- so either can undo what the other did.

Contracts (both paths): every operation is idempotent (repeating a completed one succeeds without doing it
again; undoing what is not there is a no-op); failures raise shim.router.MigrationError subclasses or
backend errors, with messages naming the volume. The router holds the per-volume lock around each call.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Mapping

import grpc

from csi import keys, loop, mount
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend, DiskOptions, NotFoundError
from csi.paths import check_path, under_roots
from shim.router import MigrationError, Provisioned, ProvisionRequest, Volume

log = logging.getLogger("ballast.migration")

AccessMode = csi_pb2.VolumeCapability.AccessMode


class CsiCallError(MigrationError):
    """A CSI RPC failed; `code` is its gRPC status code."""

    def __init__(self, method: str, driver: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} on CSI driver {driver} failed: {code.name}: {details}")
        self.code = code


class DeviceError(MigrationError):
    """The legacy path could not find or use a device (e.g. a missing partition, a foreign filesystem)."""


def capability(volume: Volume) -> csi_pb2.VolumeCapability:
    """A filesystem capability for a single-node volume (read-only mode when the spec says so)."""
    mode = AccessMode.SINGLE_NODE_READER_ONLY if volume.read_only else AccessMode.SINGLE_NODE_WRITER
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=volume.fs_type),
        access_mode=AccessMode(mode=mode),
    )


def _remove_dir(path: str) -> None:
    """rmdir `path` if it exists and is empty (never recursive)."""
    with contextlib.suppress(FileNotFoundError):
        try:
            os.rmdir(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
                raise


def remove_staging_dirs(staging_path: str) -> None:
    """What kubelet removes after NodeUnstageVolume: the globalmount dir and its per-volume parent."""
    _remove_dir(staging_path)
    _remove_dir(os.path.dirname(staging_path))


# --------------------------------------------------------------------------- CSI path


class CsiPath:
    """Volume operations as CSI calls to the driver serving `volume.driver`.

    `endpoints` maps CSI driver names to `unix:///path.sock` targets. Channels are opened on first
    use and closed by `close()`. Like kubelet, this path creates the staging directory before
    NodeStageVolume and removes it after NodeUnstageVolume.
    """

    def __init__(self, endpoints: Mapping[str, str], *, timeout: float = 120.0) -> None:
        self._endpoints = dict(endpoints)
        self._timeout = timeout
        self._channels: dict[str, grpc.Channel] = {}

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _channel(self, driver: str) -> grpc.Channel:
        channel = self._channels.get(driver)
        if channel is None:
            target = self._endpoints.get(driver)
            if target is None:
                known = ", ".join(sorted(self._endpoints)) or "none"
                raise MigrationError(
                    f"no endpoint is configured for CSI driver {driver} (known: {known}); "
                    "install the driver or map it to its socket"
                )
            channel = grpc.insecure_channel(target)
            self._channels[driver] = channel
        return channel

    def _call(self, driver: str, service: str, method: str, request: object) -> object:
        channel = self._channel(driver)
        stub = (
            csi_pb2_grpc.ControllerStub(channel)
            if service == "controller"
            else csi_pb2_grpc.NodeStub(channel)
        )
        try:
            return getattr(stub, method)(request, timeout=self._timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            code = err.code()
            raise CsiCallError(method, driver, code, err.details() or "") from None

    # ---- controller

    def provision(self, driver: str, request: ProvisionRequest) -> Provisioned:
        params = dict(request.parameters)
        if request.fs_type:
            params[keys.FS_TYPE] = request.fs_type
        segments = [csi_pb2.Topology(segments=dict(s)) for s in request.requisite]
        probe = Volume(plugin="", driver=driver, handle="", fs_type=request.fs_type)
        req = csi_pb2.CreateVolumeRequest(
            name=request.name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=request.size_bytes),
            volume_capabilities=[capability(probe)],
            parameters=params,
        )
        if segments:
            req.accessibility_requirements.CopyFrom(
                csi_pb2.TopologyRequirement(requisite=segments, preferred=segments)
            )
        resp = self._call(driver, "controller", "CreateVolume", req)
        assert isinstance(resp, csi_pb2.CreateVolumeResponse)
        vol = resp.volume
        topology = dict(vol.accessible_topology[0].segments) if vol.accessible_topology else {}
        return Provisioned(vol.volume_id, vol.capacity_bytes, topology, dict(vol.volume_context))

    def delete(self, volume: Volume) -> None:
        req = csi_pb2.DeleteVolumeRequest(volume_id=volume.handle)
        self._call(volume.driver, "controller", "DeleteVolume", req)

    def attach(self, volume: Volume, node_id: str) -> dict[str, str]:
        req = csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume.handle,
            node_id=node_id,
            volume_capability=capability(volume),
            readonly=volume.read_only,
            volume_context=dict(volume.attributes),
        )
        resp = self._call(volume.driver, "controller", "ControllerPublishVolume", req)
        assert isinstance(resp, csi_pb2.ControllerPublishVolumeResponse)
        return dict(resp.publish_context)

    def detach(self, volume: Volume, node_id: str) -> None:
        req = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=volume.handle, node_id=node_id)
        self._call(volume.driver, "controller", "ControllerUnpublishVolume", req)

    def expand(self, volume: Volume, size_bytes: int, staging_path: str) -> int:
        """ControllerExpandVolume, then NodeExpandVolume when the node must grow a staged filesystem."""
        req = csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume.handle,
            capacity_range=csi_pb2.CapacityRange(required_bytes=size_bytes),
            volume_capability=capability(volume),
        )
        resp = self._call(volume.driver, "controller", "ControllerExpandVolume", req)
        assert isinstance(resp, csi_pb2.ControllerExpandVolumeResponse)
        size = int(resp.capacity_bytes)
        if resp.node_expansion_required and os.path.ismount(staging_path):
            node_req = csi_pb2.NodeExpandVolumeRequest(
                volume_id=volume.handle,
                volume_path=staging_path,
                staging_target_path=staging_path,
                capacity_range=csi_pb2.CapacityRange(required_bytes=size),
                volume_capability=capability(volume),
            )
            self._call(volume.driver, "node", "NodeExpandVolume", node_req)
        return size

    # ---- node

    def mount_device(self, volume: Volume, publish_context: Mapping[str, str], staging_path: str) -> None:
        os.makedirs(staging_path, mode=0o750, exist_ok=True)
        req = csi_pb2.NodeStageVolumeRequest(
            volume_id=volume.handle,
            publish_context=dict(publish_context),
            staging_target_path=staging_path,
            volume_capability=capability(volume),
            volume_context=dict(volume.attributes),
        )
        self._call(volume.driver, "node", "NodeStageVolume", req)

    def unmount_device(self, volume: Volume, staging_path: str) -> None:
        req = csi_pb2.NodeUnstageVolumeRequest(volume_id=volume.handle, staging_target_path=staging_path)
        self._call(volume.driver, "node", "NodeUnstageVolume", req)
        remove_staging_dirs(staging_path)

    def mount(
        self, volume: Volume, publish_context: Mapping[str, str], staging_path: str, target_path: str
    ) -> None:
        os.makedirs(os.path.dirname(target_path), mode=0o750, exist_ok=True)
        req = csi_pb2.NodePublishVolumeRequest(
            volume_id=volume.handle,
            publish_context=dict(publish_context),
            staging_target_path=staging_path,
            target_path=target_path,
            volume_capability=capability(volume),
            readonly=volume.read_only,
            volume_context=dict(volume.attributes),
        )
        self._call(volume.driver, "node", "NodePublishVolume", req)

    def unmount(self, volume: Volume, target_path: str) -> None:
        req = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.handle, target_path=target_path)
        self._call(volume.driver, "node", "NodeUnpublishVolume", req)


# --------------------------------------------------------------------------- legacy path


def partition_device(device: str, partition: str) -> str:
    """The device node of `partition` on `device` ("" or "0": the whole device).

    Kernel naming: a `p` separates the number when the disk name ends in a digit (loop0p1, nvme0n1p1).
    """
    if partition in ("", "0"):
        return device
    if not partition.isdigit():
        raise DeviceError(f"partition {partition!r} is not a whole number")
    sep = "p" if device[-1:].isdigit() else ""
    return f"{device}{sep}{int(partition)}"


class LegacyPath:
    """The in-tree way: Backend calls and the mount layer, with no CSI in between.

    Staging and target paths must lie under `allowed_roots` (checked like the node service does).
    Staging: resolve the device, take the `partition`, format only when blkid finds nothing, mount,
    grow the filesystem if the device is bigger. Unstaging unmounts and releases the device.
    """

    def __init__(self, backend: Backend, mounter: mount.Mounter, *, allowed_roots: tuple[str, ...]) -> None:
        self._backend = backend
        self._mounter = mounter
        self._roots = allowed_roots

    # ---- controller

    def provision(self, driver: str, request: ProvisionRequest) -> Provisioned:
        caps = self._backend.capabilities
        granularity = caps.size_granularity
        size = max(request.size_bytes or caps.default_size, caps.min_size)
        size = -(-size // granularity) * granularity
        context = {keys.VC_FS_TYPE: mount.check_fs_type(request.fs_type)} if request.fs_type else {}
        params = {k: v for k, v in request.parameters.items() if not k.startswith(keys.PREFIX_K8S)}
        options = DiskOptions(  # built as CreateVolume builds it, so a retry on the other path matches
            size_bytes=size,
            parameters=self._backend.validate_parameters(params),
            context=context,
            requisite=[dict(s) for s in request.requisite],
            preferred=[dict(s) for s in request.requisite],
        )
        disk = self._backend.create_volume(request.name, options)
        return Provisioned(disk.id, disk.size_bytes, dict(disk.topology), dict(disk.volume_context))

    def delete(self, volume: Volume) -> None:
        with contextlib.suppress(NotFoundError):
            self._backend.delete_volume(volume.handle)

    def attach(self, volume: Volume, node_id: str) -> dict[str, str]:
        return self._backend.attach(volume.handle, node_id, volume.read_only)

    def detach(self, volume: Volume, node_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._backend.detach(volume.handle, node_id)

    def expand(self, volume: Volume, size_bytes: int, staging_path: str) -> int:
        size = self._backend.expand_volume(volume.handle, size_bytes)
        staged = self._mounter.mount_at(staging_path)
        if staged is not None:
            device = self._device(volume, {})  # refreshes the device size
            self._mounter.grow(device, staging_path, staged.fs_type)
        return size

    # ---- node

    def _device(self, volume: Volume, publish_context: Mapping[str, str]) -> str:
        device = self._backend.resolve_device(volume.handle, publish_context)
        part = partition_device(device, volume.attributes.get(keys.VC_PARTITION, ""))
        if part != device and not os.path.exists(part):
            self._mounter.settle()
            if not os.path.exists(part):  # no partition-table parser in this kernel: ask explicitly
                self._mounter.add_partitions(device)
            if not os.path.exists(part):
                raise DeviceError(f"partition {part} of volume {volume.handle} does not exist")
        return part

    def mount_device(self, volume: Volume, publish_context: Mapping[str, str], staging_path: str) -> None:
        check_path(staging_path, "staging path", self._roots)
        fs_type = mount.check_fs_type(volume.fs_type)
        if self._mounter.mount_at(staging_path) is not None:
            return
        device = self._device(volume, publish_context)
        found = self._mounter.probe(device)
        if found.blank:
            self._mounter.mkfs(device, fs_type, volume.attributes)
        elif not found.fs_type:
            raise DeviceError(
                f"{device} of volume {volume.handle} holds a {found.pt_type} partition table and no "
                "filesystem; refusing to format it (set the partition attribute)"
            )
        elif found.fs_type != fs_type and volume.fs_type:
            raise DeviceError(
                f"volume {volume.handle} already holds {found.fs_type}, not the requested {fs_type}"
            )
        else:
            fs_type = found.fs_type
            self._mounter.fsck(device, fs_type)
        os.makedirs(staging_path, mode=0o750, exist_ok=True)
        self._mounter.mount(device, staging_path, fs_type, [])
        current = mount.fs_size(device, fs_type)
        if current is not None and loop.device_size(device) > current:
            self._mounter.grow(device, staging_path, fs_type)

    def unmount_device(self, volume: Volume, staging_path: str) -> None:
        check_path(staging_path, "staging path", self._roots)
        current = self._mounter.mount_at(staging_path)
        if current is not None:
            others = [
                m.mount_point
                for m in self._mounter.mounts()
                if (m.major, m.minor, m.root) == (current.major, current.minor, current.root)
                and m.mount_point != staging_path
                and under_roots(m.mount_point, self._roots)
            ]
            if others:
                raise DeviceError(f"volume {volume.handle} is still mounted at {others[0]}; unmount it first")
        while self._mounter.unmount(staging_path):
            pass
        with contextlib.suppress(NotFoundError):
            self._backend.release_device(volume.handle)
        remove_staging_dirs(staging_path)

    def mount(
        self, volume: Volume, publish_context: Mapping[str, str], staging_path: str, target_path: str
    ) -> None:
        check_path(target_path, "target path", self._roots)
        check_path(staging_path, "staging path", self._roots)
        if self._mounter.mount_at(target_path) is not None:
            return
        if self._mounter.mount_at(staging_path) is None:
            raise DeviceError(
                f"volume {volume.handle} is not staged at {staging_path}; mount the device first"
            )
        os.makedirs(target_path, mode=0o750, exist_ok=True)
        self._mounter.bind(staging_path, target_path, ["ro"] if volume.read_only else [])

    def unmount(self, volume: Volume, target_path: str) -> None:
        check_path(target_path, "target path", self._roots)
        while self._mounter.unmount(target_path):
            pass
        _remove_dir(target_path)
