"""Kubelet's part in mounting a PV, played by the test (no kubelet runs on the test bed).

For a pod placed on the node, the attach-detach controller creates a VolumeAttachment and csi-attacher
attaches it through the driver (both real). Kubelet then stages and publishes over the node plugin's
gRPC socket: for an in-tree PV it first translates it with csi-translation-lib's rules (shim.Translator
here), exactly as kubelet does under CSI migration; a CSI PV is used as it is. Paths are kubelet's:
plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount and
pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from csi._proto import csi_pb2
from shim import Translator
from tests.csiclient import client
from tests.e2e.kube import Kube, Obj, pods, volume_attachments
from tests.e2e.kubelet import RegisteredNode
from tests.e2e.process import wait_for

ATTACH_TIMEOUT = 90


def csi_source(pv: Obj) -> Obj:
    """The CSI source kubelet uses: the PV's own, or the translation of its in-tree source."""
    spec = pv["spec"] if "csi" in pv["spec"] else Translator().translate_in_tree_pv_to_csi(pv)["spec"]
    source: Obj = spec["csi"]
    return source


def attachment_of(kube: Kube, pv_name: str) -> Obj | None:
    for va in kube.items(volume_attachments()):
        if va["spec"]["source"].get("persistentVolumeName") == pv_name:
            return va
    return None


@dataclass
class Mounted:
    pod: str
    pod_uid: str
    handle: str
    staging: Path
    target: Path


class Kubelet:
    """Stages and publishes a claim's PV for a pod on `node`, and tears it down."""

    def __init__(self, kube: Kube, node: RegisteredNode, endpoint: str, kubelet_dir: Path) -> None:
        self.kube = kube
        self.node = node
        self.endpoint = endpoint
        self.kubelet_dir = kubelet_dir

    def start_pod(self, namespace: str, name: str, claim: str, pv: Obj) -> Mounted:
        """Place a pod using `claim` on the node, wait for the real attach, then stage and publish."""
        pod = self.kube.create(
            pods(namespace),
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeName": self.node.name,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                },
            },
        )
        pv_name = pv["metadata"]["name"]
        wait_for(
            lambda: bool((attachment_of(self.kube, pv_name) or {}).get("status", {}).get("attached")),
            ATTACH_TIMEOUT,
            f"{pv_name} to be attached",
        )
        attachment = attachment_of(self.kube, pv_name)
        assert attachment is not None
        context = attachment["status"].get("attachmentMetadata") or {}
        return self._mount(pod, pv, context)

    def _mount(self, pod: Obj, pv: Obj, publish_context: dict[str, str]) -> Mounted:
        source = csi_source(pv)
        handle = source["volumeHandle"]
        digest = hashlib.sha256(handle.encode()).hexdigest()
        staging = self.kubelet_dir / "plugins/kubernetes.io/csi" / source["driver"] / digest / "globalmount"
        uid = pod["metadata"]["uid"]
        target = (
            self.kubelet_dir / "pods" / uid / "volumes/kubernetes.io~csi" / pv["metadata"]["name"] / "mount"
        )
        capability = csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(fs_type=source.get("fsType", "ext4")),
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
            ),
        )
        attributes = source.get("volumeAttributes") or {}
        with client(self.endpoint) as csi:
            csi.node.NodeStageVolume(
                csi_pb2.NodeStageVolumeRequest(
                    volume_id=handle,
                    publish_context=publish_context,
                    staging_target_path=str(staging),
                    volume_capability=capability,
                    volume_context=attributes,
                ),
                timeout=120,
            )
            csi.node.NodePublishVolume(
                csi_pb2.NodePublishVolumeRequest(
                    volume_id=handle,
                    publish_context=publish_context,
                    staging_target_path=str(staging),
                    target_path=str(target),
                    volume_capability=capability,
                    volume_context=attributes,
                ),
                timeout=60,
            )
        return Mounted(pod["metadata"]["name"], uid, handle, staging, target)

    def stop_pod(self, namespace: str, mounted: Mounted, pv_name: str) -> None:
        """Unpublish and unstage, then remove the pod (force: no kubelet confirms); the attach goes."""
        with client(self.endpoint) as csi:
            csi.node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=mounted.handle, target_path=str(mounted.target)),
                timeout=60,
            )
            csi.node.NodeUnstageVolume(
                csi_pb2.NodeUnstageVolumeRequest(
                    volume_id=mounted.handle, staging_target_path=str(mounted.staging)
                ),
                timeout=60,
            )
        self.kube.request("DELETE", pods(namespace, mounted.pod), {"gracePeriodSeconds": 0})
        wait_for(
            lambda: attachment_of(self.kube, pv_name) is None, ATTACH_TIMEOUT, f"{pv_name} to be detached"
        )
