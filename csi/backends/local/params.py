"""What the local backend accepts as parameters: no StorageClass parameters of its own, and three
mutable parameters (CreateVolume.mutable_parameters, ControllerModifyVolume) recorded as metadata:
`iops` (1..1000000), `throughput` (MiB/s, 1..100000) and `tier` (standard | performance).

Deployed as ebs.csi.aws.com (standing in for EBS, where in-tree aws-ebs migration sends volumes) it takes
EBS's StorageClass and VolumeAttributesClass parameters instead, checked by the aws backend's pure
parameter rules, and refuses exactly what EBS refuses."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from csi import values
from csi.backends.local.layout import EBS_DRIVER_NAME
from csi.failures import InvalidParameterError

MUTABLE_PARAMETERS: dict[str, values.Parser] = {
    "iops": values.whole(1, 1_000_000),
    "throughput": values.whole(1, 100_000),
    "tier": values.choice("standard", "performance"),
}


def validate(parameters: Mapping[str, str]) -> dict[str, str]:
    """StorageClass parameters: the local backend takes none of its own."""
    unknown("", parameters)
    return {}


def unknown(what: str, parameters: Mapping[str, str]) -> None:
    """Any of `parameters` -> InvalidParameterError naming each key quoted (an empty key, or one holding
    a newline or NUL, stays readable and cannot forge the rest of the message)."""
    if parameters:
        listed = ", ".join(repr(k) for k in sorted(parameters))
        raise InvalidParameterError(f"unknown {what}parameter(s) for the local backend: {listed}")


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


class Parameters:
    """The parameter rules of one deployment: the local backend's own, or EBS's when standing in."""

    def __init__(self, driver_name: str) -> None:
        self._ebs: ModuleType | None = None
        self._ebs_mutable: ModuleType | None = None
        if driver_name == EBS_DRIVER_NAME:
            from csi.backends.aws import mutable as ebs_mutable  # EBS's rules: only for this name
            from csi.backends.aws import params as ebs

            self._ebs, self._ebs_mutable = ebs, ebs_mutable

    def validate(self, parameters: Mapping[str, str]) -> dict[str, str]:
        """Checked StorageClass parameters (recorded with the volume); bad -> InvalidParameterError."""
        if self._ebs is None:
            return validate(parameters)
        checked: dict[str, str] = self._ebs.validate(parameters)
        return checked

    def validate_mutable(self, parameters: Mapping[str, str]) -> dict[str, str]:
        if self._ebs_mutable is None:
            return validate_mutable(parameters)
        checked: dict[str, str] = self._ebs_mutable.validate(parameters)
        return checked

    def check_size(self, parameters: Mapping[str, str], size_bytes: int) -> None:
        """Standing in for EBS: what EBS refuses for this size (out of the type's range, IOPS below its
        minimum) -> OutOfRangeError / InvalidParameterError. The local backend itself takes any size."""
        if self._ebs is not None:
            self._ebs.create_arguments(parameters, self._ebs.gib(size_bytes))
