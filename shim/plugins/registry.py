"""The migratable in-tree plugins, each described once: its names, CSI driver, volume-source key and
fields, feature-gate spelling, where its translator lives, and how its migration gate ended in
Kubernetes. The translator set (translate.py), the feature gates (gates.py) and the manifest checks
(objects.py) all derive from `PLUGINS`; adding a plugin is one row here plus its translator module.

Data only: importing this module loads no translator (the driver parses gates at start-up).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple


class PluginInfo(NamedTuple):
    in_tree_name: str  # kubernetes.io/aws-ebs
    csi_name: str  # the CSI driver it migrates to
    source_key: str  # its key in a PV spec and in a pod volume
    gate_suffix: str  # Kubernetes' exact spelling: CSIMigration<suffix>, InTreePlugin<suffix>Unregister
    translator: str  # "module:Class" of its InTreePlugin
    required: tuple[str, ...]  # string fields its volume source must have
    typed: Mapping[str, type]  # optional fields of its volume source and their JSON types
    migration_history: str  # how CSIMigration<suffix> ended in Kubernetes (it was locked to true at GA)
    unregister_history: str = "alpha (off) 1.21-1.30; removed in 1.31"


def _fields(**typed: type) -> Mapping[str, type]:
    return MappingProxyType(typed)


# Kubernetes' csi-translation-lib has no order (a Go map); this one fixes the order of listings.
PLUGINS: tuple[PluginInfo, ...] = (
    PluginInfo(
        "kubernetes.io/aws-ebs",
        "ebs.csi.aws.com",
        "awsElasticBlockStore",
        "AWS",
        "shim.plugins.aws_ebs:AWSElasticBlockStore",
        ("volumeID",),
        _fields(fsType=str, partition=int, readOnly=bool),
        "beta (on) 1.23, GA 1.25 locked to true; removed after 1.26",
    ),
    PluginInfo(
        "kubernetes.io/gce-pd",
        "pd.csi.storage.gke.io",
        "gcePersistentDisk",
        "GCE",
        "shim.plugins.gce_pd:GCEPersistentDisk",
        ("pdName",),
        _fields(fsType=str, partition=int, readOnly=bool),
        "beta (on) 1.23, GA 1.25 locked to true; removed after 1.27",
    ),
    PluginInfo(
        "kubernetes.io/azure-disk",
        "disk.csi.azure.com",
        "azureDisk",
        "AzureDisk",
        "shim.plugins.azure_disk:AzureDisk",
        ("diskName", "diskURI"),
        _fields(cachingMode=str, fsType=str, readOnly=bool, kind=str),
        "beta (on) 1.23, GA 1.24 locked to true; removed after 1.26",
    ),
    PluginInfo(
        "kubernetes.io/azure-file",
        "file.csi.azure.com",
        "azureFile",
        "AzureFile",
        "shim.plugins.azure_file:AzureFile",
        ("secretName", "shareName"),
        _fields(readOnly=bool, secretNamespace=str),
        "beta (on) 1.24, GA 1.26 locked to true; removed after 1.29",
    ),
    PluginInfo(
        "kubernetes.io/cinder",
        "cinder.csi.openstack.org",
        "cinder",
        "OpenStack",
        "shim.plugins.cinder:Cinder",
        ("volumeID",),
        _fields(fsType=str, readOnly=bool, secretRef=dict),
        "beta (on) 1.18, GA 1.24 locked to true; removed after 1.25",
    ),
    PluginInfo(
        "kubernetes.io/vsphere-volume",
        "csi.vsphere.vmware.com",
        "vsphereVolume",
        "vSphere",
        "shim.plugins.vsphere_volume:VSphereVolume",
        ("volumePath",),
        _fields(fsType=str, storagePolicyName=str, storagePolicyID=str),
        "beta (on) 1.25, GA 1.26; unlocked during 1.27 until the vSphere driver caught up, "
        "then locked to true again; removed after 1.28",
    ),
    PluginInfo(
        "kubernetes.io/portworx-volume",
        "pxd.portworx.com",
        "portworxVolume",
        "Portworx",
        "shim.plugins.portworx:Portworx",
        ("volumeID",),
        _fields(fsType=str, readOnly=bool),
        "beta (on) 1.31, GA 1.33 locked to true; slated for removal in 1.36",
        "alpha (off) since 1.23; slated for removal together with CSIMigrationPortworx",
    ),
)

BY_IN_TREE_NAME: Mapping[str, PluginInfo] = MappingProxyType({p.in_tree_name: p for p in PLUGINS})
