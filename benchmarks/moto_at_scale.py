"""moto's server made fast enough to hold 10,000 tagged volumes, for bench_aws's ListVolumes paging:
the same answers at a cost that grows with what a call returns, not with the square of what moto holds.

Why moto (5.2) is slow there. Every tagged EC2 model reads its own tags through
`TaggedEC2Resource.get_tags`, which calls `describe_tags(filters={"resource-id": [id]})`: a copy of the
region's whole tag table and a regular-expression match of the id against every tag of every resource.
DescribeVolumes reads each volume's tags twice (the `tag-key` filter tests every volume moto holds, then
the answer renders every match's tagSet), so one call over N tagged volumes costs about 2 x N x N regex
matches; CreateVolume renders its tags too, so making N volumes is quadratic as well. On top of that moto
ignores MaxResults: every page of a paged DescribeVolumes renders every matching volume, and
tests/motoproxy.py cuts that answer down to the page EC2 would have sent.

Two changes, made in the server process only (`python -m benchmarks.moto_at_scale -H host -p port`
takes moto.server's arguments), never in the driver or the tests' moto:

- `get_tags` reads the resource's own entry of the tag table: the same tags, in the same order, with
  the same fields as the scan (an id holding a wildcard character, which no EC2 id does, still scans).
- DescribeVolumes with MaxResults answers one page itself, in moto's order, with an offset NextToken of
  its own, as EC2 pages. The proxy pages moto's answer only when it is longer than MaxResults, so it
  passes these pages on unchanged: the driver reads the pages it would read from plain moto behind the
  proxy, and only the tokens' text differs.

tests/aws/test_moto_at_scale.py holds both to unpatched moto's answers on the same state.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TOKEN_PREFIX = "moto-at-scale-"
_WILDCARD = re.compile(r"[*?\[\\]")


def _indexed_get_tags(
    original: Callable[[Any], list[dict[str, str]]],
) -> Callable[[Any], list[dict[str, str]]]:
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def get_tags(self: Any) -> list[dict[str, str]]:
        resource_id = self.id
        table = getattr(self.ec2_backend, "tags", None)
        if not resource_id or not isinstance(table, dict) or _WILDCARD.search(resource_id):
            return original(self)
        tags = table.get(resource_id)  # .get: the table is a defaultdict, and a read must not add to it
        if not tags:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
        return [
            {"resource_id": resource_id, "key": k, "value": v, "resource_type": kind} for k, v in tags.items()
        ]

    return get_tags


def _paged_describe_volumes(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    from moto.core.responses import ActionResult

    def describe_volumes(self: Any) -> Any:
        size = self._get_int_param("MaxResults")
        if size is None:
            return original(self)
        volumes = self.ec2_backend.describe_volumes(
            volume_ids=self._get_param("VolumeIds", []), filters=self._filters_from_querystring()
        )
        token = self._get_param("NextToken") or ""
        start = int(token.removeprefix(TOKEN_PREFIX)) if token.startswith(TOKEN_PREFIX) else 0
        answer: dict[str, Any] = {"Volumes": volumes[start : start + size]}
        if start + size < len(volumes):
            answer["NextToken"] = f"{TOKEN_PREFIX}{start + size}"
        return ActionResult(answer)

    return describe_volumes


@contextmanager
def at_scale() -> Iterator[None]:
    """moto's EC2 with the indexed tag lookup and paged DescribeVolumes while inside; restored after."""
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.responses.elastic_block_store import ElasticBlockStore

    get_tags, describe = TaggedEC2Resource.get_tags, ElasticBlockStore.describe_volumes
    TaggedEC2Resource.get_tags = _indexed_get_tags(get_tags)  # type: ignore[method-assign,assignment]
    ElasticBlockStore.describe_volumes = _paged_describe_volumes(describe)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]
        ElasticBlockStore.describe_volumes = describe  # type: ignore[method-assign]


def main() -> None:
    from moto import server

    with at_scale():
        server.main(sys.argv[1:])


if __name__ == "__main__":
    main()
