"""The tags an operator gives everything the aws backend makes, as the EBS CSI driver's --extra-tags and
--k8s-tag-cluster-id write them, for IAM conditions and cost reports: `--aws-extra-tags`, and with
`--aws-k8s-tag-cluster-id X` the cluster's -- `kubernetes.io/cluster/X=owned` and
`Name=X-dynamic-<CSI name>` on volumes and snapshots, `KubernetesCluster=X` on volumes.

A class's tagSpecification_<n> tags win over them, the driver's own keys over both; they are not
compared when a create is retried (an operator may add one to a running cluster). A key of the
driver's or AWS's, or one past EC2's limits, is refused when the driver starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from csi.backends.aws import params as P
from csi.backends.base import EMPTY
from csi.failures import FailedPreconditionError

CLUSTER_PREFIX = "kubernetes.io/cluster/"
CLUSTER_OWNED = "owned"
KUBERNETES_CLUSTER = "KubernetesCluster"
NAME = "Name"
MAX_KEY, MAX_VALUE = 128, 256  # EC2's tag limits, in characters


class OwnerTags(NamedTuple):
    extra: Mapping[str, str] = EMPTY
    cluster_id: str = ""

    def check(self) -> OwnerTags:
        """Self, if EC2 would take every tag and none is the driver's or AWS's."""
        for key, value in self.extra.items():
            if not key or len(key) > MAX_KEY or len(value) > MAX_VALUE:
                raise FailedPreconditionError(
                    f"--aws-extra-tags: {key!r}={value!r} is past EC2's limits "
                    f"(keys 1..{MAX_KEY} characters, values up to {MAX_VALUE})"
                )
            if P.reserved_tag(key):
                raise FailedPreconditionError(f"--aws-extra-tags: {key!r} is a key of the driver's or AWS's")
        if len(CLUSTER_PREFIX + self.cluster_id) > MAX_KEY or "/" in self.cluster_id:
            raise FailedPreconditionError(
                f"--aws-k8s-tag-cluster-id {self.cluster_id!r}: no '/', and at most "
                f"{MAX_KEY - len(CLUSTER_PREFIX)} characters"
            )
        return self

    def snapshot(self, name: str) -> dict[str, str]:
        """The tags of a new snapshot named `name` (its CSI name)."""
        if not self.cluster_id:
            return dict(self.extra)
        cluster = {CLUSTER_PREFIX + self.cluster_id: CLUSTER_OWNED, NAME: f"{self.cluster_id}-dynamic-{name}"}
        return {**cluster, **self.extra}

    def volume(self, name: str) -> dict[str, str]:
        """The tags of a new volume named `name` (its CSI name)."""
        tags = self.snapshot(name)
        if self.cluster_id:
            tags.setdefault(KUBERNETES_CLUSTER, self.cluster_id)
        return tags
