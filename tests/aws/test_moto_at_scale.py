"""benchmarks/moto_at_scale.py changes moto's speed, not its answers: on one moto state, read through
tests/motoproxy.py as the benchmark reads it, every answer with its patches on equals the answer without
them; only the text of DescribeVolumes' NextToken differs (moto's own offset instead of the proxy's).

The state covers what the patches touch: volumes with no tags, one, and several (the driver's two listed
tag keys among them), a tag added and one removed after creation, a volume attached and one deleted, a
tag value holding a wildcard character, snapshots and an instance with tags; the reads are the driver's
own listing sweep, paged and unpaged DescribeVolumes under tag, tag-key, tag-value, wildcard, status and
volume-id filters, DescribeTags, DescribeSnapshots, DescribeInstances, and ListVolumes on the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from benchmarks.moto_at_scale import TOKEN_PREFIX, at_scale
from csi.backends.aws import AwsBackend
from csi.backends.aws import params as P
from csi.backends.aws.backend import LISTED_TAG_KEYS
from csi.backends.aws.volumes import LIVE_VOLUME_STATES
from tests.motoproxy import running_proxy
from tests.motoserver import ZONE, make_client, run_instance

PV_NAME = LISTED_TAG_KEYS[1]
FILTERS: list[list[dict[str, Any]]] = [
    *(
        [{"Name": "tag-key", "Values": [key]}, {"Name": "status", "Values": LIVE_VOLUME_STATES}]
        for key in LISTED_TAG_KEYS
    ),
    [],
    [{"Name": f"tag:{P.TAG_VOLUME_NAME}", "Values": ["pvc-01*", "pvc-100"]}],
    [{"Name": "tag-key", "Values": ["kubernetes.io/*", "team"]}],
    [{"Name": "tag-value", "Values": ["a*b", "late"]}],
    [{"Name": "status", "Values": ["in-use"]}],
]


def _arrange(ec2: Any) -> list[str]:
    """130 volumes in the shapes listed in the module docstring; their ids."""
    ids = []
    for i in range(130):
        tags = [{"Key": P.TAG_VOLUME_NAME, "Value": f"pvc-{i:03d}"}] if i % 3 else []
        tags += [{"Key": PV_NAME, "Value": f"pv-{i:03d}"}] if i % 4 == 0 else []
        tags += [{"Key": "team", "Value": "a*b" if i % 10 else "plain"}] if i % 5 == 0 else []
        specs = [{"ResourceType": "volume", "Tags": tags}] if tags else []
        ids.append(
            ec2.create_volume(AvailabilityZone=ZONE, Size=1 + i % 3, TagSpecifications=specs)["VolumeId"]
        )
    ec2.create_tags(Resources=[ids[4], ids[9]], Tags=[{"Key": "late", "Value": "late"}])
    ec2.delete_tags(Resources=[ids[7]], Tags=[{"Key": P.TAG_VOLUME_NAME}])
    ec2.delete_volume(VolumeId=ids[2])
    instance = run_instance(ec2)
    ec2.create_tags(Resources=[instance], Tags=[{"Key": "team", "Value": "a*b"}])
    ec2.attach_volume(VolumeId=ids[1], InstanceId=instance, Device="/dev/sdf")
    for vid in ids[3:6]:
        ec2.create_snapshot(
            VolumeId=vid,
            TagSpecifications=[{"ResourceType": "snapshot", "Tags": [{"Key": "team", "Value": vid}]}],
        )
    return [vid for vid in ids if vid != ids[2]]


def _bare(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("ResponseMetadata", "NextToken")}


def _described(client: Any, ids: list[str]) -> tuple[list[Any], list[str]]:
    """The EC2 answers the module docstring lists, and the DescribeVolumes tokens seen."""
    answers: list[Any] = []
    tokens: list[str] = []
    for filters in [*FILTERS, [{"Name": "volume-id", "Values": ids[10:60]}]]:
        answers.append(_bare(client.describe_volumes(Filters=filters)))
        token = ""
        while True:
            page = client.describe_volumes(
                Filters=filters, MaxResults=25, **({"NextToken": token} if token else {})
            )
            answers.append(_bare(page))
            token = page.get("NextToken", "")
            if not token:
                break
            tokens.append(token)
    answers.append(_bare(client.describe_volumes(VolumeIds=ids[:5])))
    answers.append(_bare(client.describe_tags()))
    answers.append(
        _bare(client.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "tag-key", "Values": ["team"]}]))
    )
    answers.append(_bare(client.describe_instances(Filters=[{"Name": "tag:team", "Values": ["a*b"]}])))
    return answers, tokens


def _listed(client: Any) -> list[Any]:
    """The driver's listing sweep, and ListVolumes paged 20 at a time, on a fresh backend."""
    backend = AwsBackend(client, zone=ZONE, node_id="", imds=None)
    try:
        pages, token = [], ""
        while True:
            page = backend.list_volumes(max_entries=20, starting_token=token)
            pages.append(page.items)
            token = page.next_token
            if not token:
                return [backend._listed(), pages]
    finally:
        backend.close()


def _reads(client: Any, ids: list[str]) -> tuple[list[Any], list[str]]:
    answers, tokens = _described(client, ids)
    return [*answers, *_listed(client)], tokens


@pytest.fixture
def reader(moto_endpoint: str, account: str) -> Iterator[Callable[[], tuple[list[Any], list[str]]]]:
    ec2 = make_client(moto_endpoint, account)
    ids = _arrange(ec2)
    with running_proxy(moto_endpoint) as proxy:
        client = make_client(proxy.endpoint, account)
        yield lambda: _reads(client, ids)


def test_the_patched_server_answers_as_moto_does(reader: Callable[[], tuple[list[Any], list[str]]]) -> None:
    from moto.ec2.models.core import TaggedEC2Resource

    plain, plain_tokens = reader()
    original = TaggedEC2Resource.get_tags
    with at_scale():
        assert TaggedEC2Resource.get_tags is not original
        patched, patched_tokens = reader()
    assert TaggedEC2Resource.get_tags is original  # the shared test server is left as it was

    assert len(plain) == len(patched)
    for i, (a, b) in enumerate(zip(plain, patched, strict=True)):
        assert a == b, f"answer {i} differs"
    # both paths really ran: the proxy paged plain moto, moto paged itself under the patch
    assert plain_tokens and all(t.startswith("motoproxy-") for t in plain_tokens)
    assert len(patched_tokens) == len(plain_tokens)
    assert all(t.startswith(TOKEN_PREFIX) for t in patched_tokens)
