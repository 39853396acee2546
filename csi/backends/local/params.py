"""What the local backend accepts as parameters: no StorageClass parameters of its own, and three
mutable parameters (CreateVolume.mutable_parameters, ControllerModifyVolume) recorded as metadata:
`iops` (1..1000000), `throughput` (MiB/s, 1..100000) and `tier` (standard | performance)."""

from __future__ import annotations

from collections.abc import Mapping

from csi import values
from csi.failures import InvalidParameterError

MUTABLE_PARAMETERS: dict[str, values.Parser] = {
    "iops": values.whole(1, 1_000_000),
    "throughput": values.whole(1, 100_000),
    "tier": values.choice("standard", "performance"),
}


def validate(parameters: Mapping[str, str]) -> dict[str, str]:
    """StorageClass parameters: the local backend takes none of its own."""
    if parameters:
        raise InvalidParameterError(
            f"unknown parameter(s) for the local backend: {', '.join(sorted(parameters))}"
        )
    return {}


def validate_mutable(parameters: Mapping[str, str]) -> dict[str, str]:
    """Mutable parameters, normalised; an unknown key or a bad value -> InvalidParameterError."""
    out: dict[str, str] = {}
    for key, value in sorted(parameters.items()):
        parser = MUTABLE_PARAMETERS.get(key)
        if parser is None:
            raise InvalidParameterError(
                f"unknown mutable parameter {key!r}; supported: {', '.join(sorted(MUTABLE_PARAMETERS))}"
            )
        out[key] = values.checked(parser, key, value, "mutable parameter")
    return out
