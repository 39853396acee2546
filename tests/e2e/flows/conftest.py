"""One deployment of the chart per backend flavor, each on a control plane of its own.

Flavors:
- `local`: the local backend under its own name (local.csi.ballast.dev);
- `ebs-standin`: the local backend deployed as `ebs.csi.aws.com`, standing in for EBS (the driver
  Kubernetes' in-tree migration hands `kubernetes.io/aws-ebs` classes to);
- `aws`: the aws backend against moto's EC2 server over real HTTP.
Each gets a registered node `node-a` (see tests/e2e/kubelet.py) before any flow runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from tests.e2e.cluster import running_cluster
from tests.e2e.conftest import fresh_namespace
from tests.e2e.deploy import Deployment, deployed_chart, install_snapshot_crds
from tests.e2e.kube import Kube
from tests.e2e.kubelet import RegisteredNode, register_node
from tests.e2e.process import Process
from tests.e2e.tools import k8s_binary
from tests.motoserver import running_moto

NAMESPACE = "ballast-system"
NODE = "node-a"
AWS_REGION = "us-east-1"
AWS_ZONE = "us-east-1a"
AWS_SECRET = {"aws-secret": {"key_id": "testing", "access_key": "testing"}}
FLAVORS = ("local", "ebs-standin", "aws")
LOCAL_ATTACH_LIMIT = 3
# aws flavor: the operator's tags, and tag templates the sidecars' names fill (--extra-create-metadata,
# --extra-modify-metadata), so the flows can see the chart's flags at work on EC2.
AWS_CLUSTER_ID = "e2e-cluster"
AWS_EXTRA_TAGS = {"suite": "ballast-e2e"}
CLAIM_TAG = {"tagSpecification_1": "claim={{ .PVCNamespace }}/{{ .PVCName }}"}
GROUP_CLASS = "groups"  # the chart's VolumeGroupSnapshotClass (local backend flavors)
SNAPSHOT_TAG = {"tagSpecification_1": "snapshot={{ .VolumeSnapshotNamespace }}/{{ .VolumeSnapshotName }}"}


def storage_classes(parameters: dict[str, str]) -> list[dict[str, Any]]:
    """The classes every flavor gets: Immediate, WaitForFirstConsumer and a Retain class."""
    return [
        {"name": "immediate", "volumeBindingMode": "Immediate", "parameters": parameters},
        {"name": "wffc", "volumeBindingMode": "WaitForFirstConsumer", "parameters": parameters},
        {
            "name": "retain",
            "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Retain",
            "parameters": parameters,
        },
    ]


def flavor_values(flavor: str, moto: str) -> dict[str, Any]:
    common: dict[str, Any] = {
        "node": {"kubeletPath": "{workdir}/kubelet"},
        "volumeSnapshotClasses": [{"name": "snapshots", "deletionPolicy": "Delete"}],
    }
    if flavor == "aws":
        return {
            **common,
            "backend": {
                "name": "aws",
                "aws": {
                    "region": AWS_REGION,
                    "endpointUrl": moto,
                    "credentialsSecret": {"name": "aws-secret"},
                    "extraTags": AWS_EXTRA_TAGS,
                    "k8sTagClusterId": AWS_CLUSTER_ID,
                },
            },
            "storageClasses": storage_classes({"type": "gp3", **CLAIM_TAG}),
            "volumeSnapshotClasses": [
                {"name": "snapshots", "deletionPolicy": "Delete", "parameters": SNAPSHOT_TAG}
            ],
        }
    local: dict[str, Any] = {"dataDir": "{workdir}/data", "zone": "zone-a"}
    backend: dict[str, Any] = {"name": "local", "local": local}
    common["volumeGroupSnapshotClasses"] = [{"name": GROUP_CLASS, "deletionPolicy": "Delete"}]
    if flavor == "ebs-standin":
        backend["driverName"] = "ebs.csi.aws.com"
        local["zone"] = AWS_ZONE
        return {**common, "backend": backend, "storageClasses": storage_classes({})}
    # A small attach limit, so a flow can fill the node (test_attach.py).
    node = {**common["node"], "maxVolumesPerNode": LOCAL_ATTACH_LIMIT}
    return {**common, "node": node, "backend": backend, "storageClasses": storage_classes({})}


@dataclass
class Bed:
    """A flavor deployed: the cluster's admin client, the deployment, its node, moto when aws."""

    flavor: str
    kube: Kube
    deployment: Deployment
    node: RegisteredNode
    ec2: Any = None  # boto3 EC2 client on moto (aws flavor)
    extras: list[Process] = field(default_factory=list)

    @property
    def driver(self) -> str:
        return self.deployment.driver_name

    @property
    def is_aws(self) -> bool:
        return self.flavor == "aws"

    @property
    def speaks_ebs(self) -> bool:
        """The driver answers as ebs.csi.aws.com (the target of in-tree aws-ebs migration)."""
        return self.driver == "ebs.csi.aws.com"


@contextlib.contextmanager
def _moto(enabled: bool) -> Iterator[str]:
    if not enabled:
        yield ""
        return
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    with running_moto() as endpoint:
        yield endpoint


@pytest.fixture(scope="session", params=FLAVORS)
def bed(request: pytest.FixtureRequest) -> Iterator[Bed]:
    flavor: str = request.param
    with _moto(flavor == "aws") as moto, running_cluster() as cluster:
        kube = cluster.admin()
        install_snapshot_crds(kube)
        # The snapshot controller is cluster infrastructure, not part of the chart: it runs as admin.
        snapshot_controller = cluster.processes.start(
            "snapshot-controller",
            [str(k8s_binary("snapshot-controller")), f"--kubeconfig={cluster.admin_kubeconfig}", "--v=2"],
        )
        ec2 = None
        node_env: dict[str, str] = {}
        if flavor == "aws":
            ec2 = boto3.client(
                "ec2",
                region_name=AWS_REGION,
                endpoint_url=moto,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            instance = ec2.run_instances(
                ImageId="ami-03cf127a",
                MinCount=1,
                MaxCount=1,
                InstanceType="m5.large",
                Placement={"AvailabilityZone": AWS_ZONE},
            )["Instances"][0]["InstanceId"]
            # What the node plugin would read from instance metadata (IMDS), which moto does not serve.
            node_env = {"CSI_NODE_ID": instance, "AWS_AVAILABILITY_ZONE": AWS_ZONE}
        with deployed_chart(
            cluster,
            flavor_values(flavor, moto),
            NAMESPACE,
            secrets=AWS_SECRET,
            controller_node=NODE,  # with the local backend, the node holding the data dir
        ) as deployment:
            node = register_node(kube, deployment, NODE, driver_env=node_env)
            yield Bed(flavor, kube, deployment, node, ec2, [snapshot_controller])


@pytest.fixture
def namespace(bed: Bed) -> Iterator[str]:
    """A fresh namespace on the flavor's own cluster (overrides the shared cluster's fixture)."""
    with fresh_namespace(bed.kube) as name:
        yield name
