"""Where this node is: instance id, availability zone and instance type from IMDSv2, with overrides, and
the EBS attachment limit of the instance type.

Overrides win over metadata: the node id comes from `--node-id`/CSI_NODE_ID when it is an instance id,
the zone from `--zone` (when not the local default "local") or AWS_AVAILABILITY_ZONE, the limit from
`--max-volumes-per-node`. Metadata is read only for what no override supplies.
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from csi.failures import FailedPreconditionError

log = logging.getLogger("ballast.aws")

IMDS_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL = 21600  # seconds an IMDSv2 session token is asked to live (the most IMDS grants)
TOKEN_MARGIN = 300  # renewed this long before it would expire
ZONE_ENV = "AWS_AVAILABILITY_ZONE"
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")

# EBS volumes attachable besides the root volume. Nitro instances of these families share 28 slots
# between EBS volumes and network interfaces: 28 - root - primary ENI = 26. Xen instances allow 40 device
# names: 39. Families with a dedicated EBS limit allow a number that grows with the instance size (AWS,
# "Amazon EBS volume limits for Amazon EC2 instances"): 32 up to 12xlarge, 128 at 48xlarge; the root
# volume takes one of them.
SHARED_NITRO_LIMIT = 26
XEN_LIMIT = 39
DEFAULT_LIMIT = SHARED_NITRO_LIMIT  # unknown types: the conservative Nitro figure
_DEDICATED_BY_SIZE = {
    "16xlarge": 48,
    "24xlarge": 64,
    "32xlarge": 88,
    "48xlarge": 128,
    "metal-16xl": 39,
    "metal-24xl": 39,
    "metal-32xl": 79,
    "metal-48xl": 79,
}
_DEDICATED_SMALLEST = 32  # medium .. 12xlarge, and any size the table does not name
_XEN_FAMILIES = frozenset({"t2", "m4", "c4", "r4", "x1", "x1e", "d2", "h1", "i3", "p2", "p3", "g3", "f1"})
_DEDICATED_FAMILIES = frozenset(
    {
        "m7i",
        "m7i-flex",
        "c7i",
        "c7i-flex",
        "r7i",
        "r7iz",
        "m7a",
        "c7a",
        "r7a",
        "m8g",
        "c8g",
        "r8g",
        "x8g",
        "m8i",
        "c8i",
        "r8i",
    }
)


def attach_limit(instance_type: str) -> int:
    """How many EBS volumes the driver may attach to an instance of this type (besides its root)."""
    family, _, size = instance_type.partition(".")
    if family in _XEN_FAMILIES:
        return XEN_LIMIT
    if family in _DEDICATED_FAMILIES:
        return _DEDICATED_BY_SIZE.get(size, _DEDICATED_SMALLEST) - 1
    return DEFAULT_LIMIT


def shares_slots_with_network_interfaces(instance_type: str) -> bool:
    """Nitro types without dedicated EBS limits share their attachment slots with network interfaces."""
    family = instance_type.split(".", 1)[0]
    return family not in _XEN_FAMILIES and family not in _DEDICATED_FAMILIES


class Imds:
    """A minimal IMDSv2 client (session token, then GET). `endpoint` and `clock` are injectable for
    tests. A session token lives TOKEN_TTL seconds: it is fetched again before it expires, and at once
    when IMDS refuses it (401), so a node plugin that runs for days keeps reading metadata."""

    def __init__(
        self, endpoint: str = IMDS_ENDPOINT, timeout: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self._clock = clock
        self._token, self._fetched = "", 0.0

    def _session(self, renew: bool = False) -> str:
        if renew or not self._token or self._clock() - self._fetched > TOKEN_TTL - TOKEN_MARGIN:
            request = urllib.request.Request(
                f"{self.endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)},
            )
            fetched = self._clock()
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                self._token, self._fetched = response.read().decode(), fetched
        return self._token

    def _read(self, path: str, token: str) -> str:
        request = urllib.request.Request(
            f"{self.endpoint}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return str(response.read().decode().strip())

    def get(self, path: str) -> str:
        """The metadata value at `latest/meta-data/<path>`; FailedPreconditionError when unreachable."""
        try:
            try:
                return self._read(path, self._session())
            except urllib.error.HTTPError as refused:
                if refused.code != 401:  # not a token IMDS no longer takes
                    raise
                return self._read(path, self._session(renew=True))
        except (urllib.error.URLError, OSError) as exc:
            raise FailedPreconditionError(
                f"instance metadata ({path}) is unavailable ({exc}); give --node-id, --zone or "
                f"{ZONE_ENV}, and --max-volumes-per-node instead"
            ) from exc


@dataclass(frozen=True)
class Placement:
    node_id: str
    zone: str
    max_volumes: int
    instance_type: str = ""  # known when read from metadata: the limit is then recomputed per call


def _entries(listing: str) -> list[str]:
    return [line.strip().rstrip("/") for line in listing.splitlines() if line.strip()]


def launched_volumes(imds: Imds) -> int:
    """EBS volumes mapped at launch besides the root (`ebsN` in block-device-mapping)."""
    return len([e for e in _entries(imds.get("block-device-mapping/")) if e.startswith("ebs")])


def free_attach_slots(imds: Imds, instance_type: str, instance_stores: int = 0) -> int:
    """The slots this driver may use now: the type's limit, minus EBS volumes mapped at launch besides
    the root (`ebsN` in block-device-mapping), minus, on types that share slots with network
    interfaces and instance store volumes, every interface beyond the primary one and the
    `instance_stores` NVMe instance store volumes the node sees. Read from metadata on each call:
    interfaces come and go (CNI plugins attach them), so the limit moves."""
    limit = attach_limit(instance_type) - launched_volumes(imds)
    if shares_slots_with_network_interfaces(instance_type):
        interfaces = _entries(imds.get("network/interfaces/macs/"))
        limit -= max(0, len(interfaces) - 1) + instance_stores
    return max(0, limit)


def resolve_placement(
    imds: Imds | None,
    node_id: str,
    zone: str,
    max_volumes: int,
    env: Mapping[str, str] | None = None,
) -> Placement:
    """This node's id, zone and volume limit: overrides first, IMDSv2 for the rest (imds None: none)."""
    env = os.environ if env is None else env

    def metadata(path: str) -> str:
        if imds is None:
            raise FailedPreconditionError(f"instance metadata is disabled and no override gives {path}")
        return imds.get(path)

    if not INSTANCE_ID.fullmatch(node_id):
        try:
            node_id = metadata("instance-id")
        except FailedPreconditionError:
            if not node_id:
                raise
            log.warning("node id %r is not an EC2 instance id and metadata is unavailable; using it", node_id)
    if not zone or zone == "local":
        zone = env.get(ZONE_ENV, "") or metadata("placement/availability-zone")
    instance_type = ""
    if max_volumes <= 0:
        try:
            instance_type = metadata("instance-type")
            max_volumes = attach_limit(instance_type)
        except FailedPreconditionError:
            max_volumes = DEFAULT_LIMIT
    return Placement(node_id=node_id, zone=zone, max_volumes=max_volumes, instance_type=instance_type)
