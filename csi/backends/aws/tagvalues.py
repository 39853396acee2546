"""Placeholders in `tagSpecification_<n>` tag values of volumes: `{{ .PVCName }}` and its kind, filled
from the claim metadata the external-provisioner passes with --extra-create-metadata (the chart runs it
so; DiskOptions.metadata). Snapshot tags take none (NO_FIELDS): an action there is refused too.

The EBS CSI driver renders tag values with Go's text/template; StorageClasses written for it mostly use
the bare placeholders below. Ballast fills those (with Go's `{{-`/`-}}` white-space trimming), and an
action it does not fill -- a function, a pipeline, `if` -- is refused with INVALID_ARGUMENT naming the
key, never written to the tag as it stands. A placeholder whose metadata the sidecar did not pass
becomes the empty string, as the EBS driver renders it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from csi import keys
from csi.failures import InvalidParameterError

# placeholder -> the key the sidecar passes its value under
VOLUME_FIELDS = {"PVCNamespace": keys.PVC_NAMESPACE, "PVCName": keys.PVC_NAME, "PVName": keys.PV_NAME}
NO_FIELDS: dict[str, str] = {}

_FIELD = re.compile(r"\.([A-Za-z][A-Za-z0-9_]*)")
_TRIM = (" ", "\t", "\r", "\n")  # Go: a trim marker is "-" beside one white-space character


def interpolate(key: str, value: str, fields: Mapping[str, str], params: Mapping[str, str]) -> str:
    """`value` with each `{{ .Field }}` of `fields` replaced by its parameter in `params`. An action
    that is not such a placeholder, or a `{{` never closed -> InvalidParameterError."""
    out: list[str] = []
    pos = 0
    while (start := value.find("{{", pos)) >= 0:
        end = value.find("}}", start + 2)
        if end < 0:
            raise InvalidParameterError(f"parameter {key}: '{{{{' is never closed by '}}}}' in {value!r}")
        inner = value[start + 2 : end]
        text = value[pos:start]
        if inner[:1] == "-" and inner[1:2] in _TRIM:
            text, inner = text.rstrip(), inner[1:]
        trim_after = inner[-1:] == "-" and inner[-2:-1] in _TRIM
        if trim_after:
            inner = inner[:-1]
        out += [text, _field(key, inner.strip(), fields, params)]
        pos = end + 2
        if trim_after:
            pos = len(value) - len(value[pos:].lstrip())
    out.append(value[pos:])
    return "".join(out)


def _field(key: str, action: str, fields: Mapping[str, str], params: Mapping[str, str]) -> str:
    found = _FIELD.fullmatch(action)
    if found is None or found.group(1) not in fields:
        named = ", ".join("{{ ." + f + " }}" for f in fields)
        allowed = f"the placeholders are {named} (no functions or pipelines)" if fields else "it takes none"
        raise InvalidParameterError(
            f"parameter {key}: {{{{ {action} }}}} is not supported in this tag value; {allowed}"
        )
    return params.get(fields[found.group(1)], "")
