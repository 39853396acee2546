"""The one place where advertised CSI capabilities are derived (backend flags + mode) and enforced."""

from __future__ import annotations

from typing import Any, NamedTuple

from csi._proto import csi_pb2
from csi.backends.base import BackendCapabilities
from csi.failures import UnsupportedError

CRPC = csi_pb2.ControllerServiceCapability.RPC
NRPC = csi_pb2.NodeServiceCapability.RPC
AccessMode = csi_pb2.VolumeCapability.AccessMode


class Capabilities(NamedTuple):
    """What this process advertises, derived once at start-up."""

    backend: BackendCapabilities
    serves_controller: bool
    serves_node: bool

    @property
    def controller(self) -> frozenset[Any]:
        b = self.backend
        flags = {
            CRPC.CREATE_DELETE_VOLUME: True,
            CRPC.PUBLISH_UNPUBLISH_VOLUME: b.attach_required,
            CRPC.PUBLISH_READONLY: b.attach_required,
            CRPC.LIST_VOLUMES: b.list_volumes,
            CRPC.LIST_VOLUMES_PUBLISHED_NODES: b.list_volumes and b.attach_required,
            CRPC.GET_CAPACITY: b.get_capacity,
            CRPC.CREATE_DELETE_SNAPSHOT: b.snapshots,
            CRPC.LIST_SNAPSHOTS: b.snapshots and b.list_snapshots,
            CRPC.GET_SNAPSHOT: b.snapshots,
            CRPC.CLONE_VOLUME: b.clone,
            CRPC.EXPAND_VOLUME: b.expand_online or b.expand_offline,
            CRPC.GET_VOLUME: True,
            CRPC.GET_VOLUME_HEALTH: b.volume_health,
            CRPC.LIST_VOLUME_HEALTH: b.volume_health,
            CRPC.SINGLE_NODE_MULTI_WRITER: b.single_node_multi_writer,
            CRPC.MODIFY_VOLUME: b.modify_volume,
        }
        return frozenset(k for k, on in flags.items() if on)

    @property
    def node(self) -> frozenset[Any]:
        b = self.backend
        flags = {
            NRPC.STAGE_UNSTAGE_VOLUME: True,
            NRPC.GET_VOLUME_STATS: True,
            NRPC.EXPAND_VOLUME: b.expand_online or b.expand_offline,
            NRPC.GET_VOLUME_HEALTH: b.node_volume_health,
            NRPC.GET_STORAGE_HEALTH: b.storage_health,
            NRPC.SINGLE_NODE_MULTI_WRITER: b.single_node_multi_writer,
        }
        return frozenset(k for k, on in flags.items() if on)

    @property
    def group_controller(self) -> frozenset[Any]:
        if not self.backend.group_snapshots:
            return frozenset()
        return frozenset(
            {csi_pb2.GroupControllerServiceCapability.RPC.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}
        )

    @property
    def snapshot_metadata(self) -> bool:
        """The SnapshotMetadata service is served (next to the controller)."""
        return self.serves_controller and self.backend.snapshots and self.backend.snapshot_metadata

    @property
    def snapshot_topology(self) -> bool:
        return self.backend.snapshots and self.backend.snapshot_topology

    def plugin(self) -> list[csi_pb2.PluginCapability]:
        """GetPluginCapabilities: services this process serves, topology, and expansion mode."""
        Service = csi_pb2.PluginCapability.Service
        Expansion = csi_pb2.PluginCapability.VolumeExpansion
        services = {
            Service.CONTROLLER_SERVICE: self.serves_controller,
            Service.GROUP_CONTROLLER_SERVICE: self.serves_controller and bool(self.group_controller),
            Service.SNAPSHOT_METADATA_SERVICE: self.snapshot_metadata,
            Service.VOLUME_ACCESSIBILITY_CONSTRAINTS: bool(self.backend.topology_keys),
            Service.SNAPSHOT_ACCESSIBILITY_CONSTRAINTS: self.snapshot_topology,
        }
        out = [csi_pb2.PluginCapability(service=Service(type=t)) for t, on in services.items() if on]
        if self.backend.expand_online:
            out.append(csi_pb2.PluginCapability(volume_expansion=Expansion(type=Expansion.ONLINE)))
        elif self.backend.expand_offline:
            out.append(csi_pb2.PluginCapability(volume_expansion=Expansion(type=Expansion.OFFLINE)))
        return out

    def require_controller(self, rpc: Any, what: str) -> None:
        """Raise UNIMPLEMENTED when the controller capability behind `what` is not advertised."""
        if rpc not in self.controller:
            raise UnsupportedError(f"{what} is not supported by this driver's backend")

    def require_node(self, rpc: Any, what: str) -> None:
        if rpc not in self.node:
            raise UnsupportedError(f"{what} is not supported by this driver's backend")

    def require_group(self, what: str) -> None:
        if not self.group_controller:
            raise UnsupportedError(f"{what} is not supported by this driver's backend")
