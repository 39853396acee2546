"""Every parameter, volume_context, publish_context and topology key the driver reads or writes.

StorageClass parameters arrive in CreateVolumeRequest.parameters; what the node needs later travels in
Volume.volume_context (copied by the CO into every node request); what attach tells the node travels in
the publish_context.
"""

from __future__ import annotations

# ---- StorageClass parameters common to every backend (validated in csi/validation.py)
PREFIX_K8S = "csi.storage.k8s.io/"  # keys the external-provisioner adds or reserves; never backend input
FS_TYPE = "csi.storage.k8s.io/fstype"  # filesystem for mount volumes (also from VolumeCapability.mount)
FS_TYPE_LEGACY = "fsType"  # in-tree spelling, as migrated StorageClasses carry it
PVC_NAME = "csi.storage.k8s.io/pvc/name"  # added by --extra-create-metadata; used for tags/labels
PVC_NAMESPACE = "csi.storage.k8s.io/pvc/namespace"
PV_NAME = "csi.storage.k8s.io/pv/name"
CLAIM_METADATA = (PVC_NAME, PVC_NAMESPACE, PV_NAME)  # what DiskOptions.metadata carries to the backend
# VolumeSnapshotClass parameters the external-snapshotter adds with --extra-create-metadata
VOLUMESNAPSHOT_NAME = "csi.storage.k8s.io/volumesnapshot/name"
VOLUMESNAPSHOT_NAMESPACE = "csi.storage.k8s.io/volumesnapshot/namespace"
VOLUMESNAPSHOT_CONTENT_NAME = "csi.storage.k8s.io/volumesnapshotcontent/name"
SNAPSHOT_METADATA = (VOLUMESNAPSHOT_NAME, VOLUMESNAPSHOT_NAMESPACE, VOLUMESNAPSHOT_CONTENT_NAME)

# mkfs options: validated at CreateVolume, carried in volume_context under the same key, validated
# again on the node before they reach an mkfs argv (filesystems.mkfs_argv: ranges; mkfs_limits:
# combinations and the volume size they need). Sizes are powers of two:
# blockSize: ext* 1024..the page size (4096 on x86); xfs 1024..65536.
# inodeSize: ext* 128..4096 and at most blockSize (1024 when blockSize is unset); xfs 512..2048 and at
# most half of blockSize. bytesPerInode: 1024..64 Mi and at least twice inodeSize (with bigalloc, at
# least the cluster size). numberOfInodes: 16..2^32-1.
BLOCK_SIZE = "blockSize"  # bytes per filesystem block
INODE_SIZE = "inodeSize"  # bytes per inode
BYTES_PER_INODE = "bytesPerInode"  # ext* only: inode ratio
NUMBER_OF_INODES = "numberOfInodes"  # ext* only: absolute inode count
EXT4_BIGALLOC = "ext4BigAlloc"  # ext4 only: "true" enables bigalloc
EXT4_CLUSTER_SIZE = "ext4ClusterSize"  # ext4 only with bigalloc: cluster size in bytes
FORMAT_KEYS = (BLOCK_SIZE, INODE_SIZE, BYTES_PER_INODE, NUMBER_OF_INODES, EXT4_BIGALLOC, EXT4_CLUSTER_SIZE)

# ---- volume_context keys (besides FORMAT_KEYS)
VC_FS_TYPE = "fsType"  # filesystem requested by the StorageClass, if any
VC_PARTITION = "partition"  # set by in-tree migration: partition number; "0"/absent = whole device

# ---- publish_context keys
PC_DEVICE_PATH = "devicePath"  # where the node should expect the device (aws: /dev/xvdX)
PC_VOLUME_FILE = "volumeFile"  # local backend: backing file the loop device must map
PC_READONLY = "readonly"  # "true" when ControllerPublishVolume was readonly: the node mounts read-only

# ---- topology keys (suffixes appended to the driver name or well-known labels)
TOPOLOGY_ZONE_SUFFIX = "/zone"
TOPOLOGY_REGION_SUFFIX = "/region"
WELL_KNOWN_ZONE = "topology.kubernetes.io/zone"
WELL_KNOWN_REGION = "topology.kubernetes.io/region"
LEGACY_ZONE = "failure-domain.beta.kubernetes.io/zone"
LEGACY_REGION = "failure-domain.beta.kubernetes.io/region"


def topology_zone_key(driver_name: str) -> str:
    """e.g. topology.local.csi.ballast.dev/zone."""
    return f"topology.{driver_name}{TOPOLOGY_ZONE_SUFFIX}"


def topology_region_key(driver_name: str) -> str:
    return f"topology.{driver_name}{TOPOLOGY_REGION_SUFFIX}"
