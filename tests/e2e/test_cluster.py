"""The test bed itself: the control plane serves, authenticates, authorizes and runs its controllers."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.kube import Kube, KubeError, phase_is, pvcs, pvs

pytestmark = pytest.mark.slow


def test_server_reports_the_pinned_version(cluster: Cluster, kube: Kube) -> None:
    assert kube.get("/version")["gitVersion"] == cluster.kubernetes_version


def test_service_account_token_is_authenticated_and_rbac_applies(cluster: Cluster, namespace: str) -> None:
    as_probe = Kube.from_kubeconfig(cluster.service_account_kubeconfig(namespace, "probe", create=True))
    review = as_probe.create("/apis/authentication.k8s.io/v1/selfsubjectreviews", {})
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:probe"
    # No role is bound to it: RBAC refuses a read of PersistentVolumes.
    with pytest.raises(KubeError) as refused:
        as_probe.items(pvs())
    assert refused.value.status == 403


def test_pv_binder_binds_a_claim_to_a_matching_volume(kube: Kube, namespace: str) -> None:
    """kube-controller-manager's PV binder runs: a static PV and a matching PVC bind to each other."""
    pv_name = f"{namespace}-pv"
    kube.create(
        pvs(),
        {
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "manual",
                "csi": {"driver": "static.example.com", "volumeHandle": "vol-1"},
            },
        },
    )
    try:
        claim = {
            "metadata": {"name": "claim"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "manual",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        kube.create(pvcs(namespace), claim)
        bound = kube.wait(pvcs(namespace, "claim"), phase_is("Bound"), 60, "the claim to bind")
        assert bound["spec"]["volumeName"] == pv_name
    finally:
        kube.delete(pvs(pv_name))
