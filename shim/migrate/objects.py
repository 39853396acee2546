"""Pure helpers over PersistentVolume dicts: what a conversion records, creates, and checks.

Contract:
- `record_of(pv)` is the part of a PV a conversion keeps and a rollback restores: apiVersion, kind,
  metadata.name/labels/annotations/ownerReferences and spec; never server-set fields or status.
- `convert_target` is the CSI PV a conversion creates: shim.Translator's translation of the record
  (node affinity, volume handle, attributes), with the record's access modes kept, reclaim policy
  Retain until the last step, and annotations naming the record and the journal.
- `rollback_target` is the in-tree PV a rollback creates: the record, except that the live claimRef
  and a capacity grown while converted are kept (the binding and the disk size are facts by then).
- `disk_difference` is the rollback safety check: reverse translation of the current CSI PV must
  name the same disk as the record.
Nothing here does I/O; everything copies its input.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from shim import TranslationError, Translator
from shim.manifests import IN_TREE_SOURCES, in_tree_source_key
from shim.translate import json_copy

JsonObj = dict[str, Any]

PREFIX = "migration.ballast.io/"
ANN_ORIGINAL = PREFIX + "original"  # on a converted CSI PV: the in-tree record (JSON)
ANN_CONVERTED_BY = PREFIX + "converted-by"  # holder identity of the actor that converted it
ANN_JOURNAL_ID = PREFIX + "journal-id"  # on a PV a journal created, until its last step
OWN_ANNOTATIONS = (ANN_ORIGINAL, ANN_CONVERTED_BY, ANN_JOURNAL_ID)
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "ballast-migrate"

RETAIN = "Retain"
DELETE = "Delete"
_KEPT_METADATA = ("name", "labels", "annotations", "ownerReferences")


class RecordError(ValueError):
    """A PV's record annotation cannot be used (not JSON, not an in-tree PV, or another PV's)."""


class UnknownPluginError(RecordError):
    """A record whose volume source is not one of the seven plugins this version migrates."""


class ClaimRef(NamedTuple):
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def name_of(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def uid_of(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def annotations_of(obj: JsonObj) -> dict[str, str]:
    found = (obj.get("metadata") or {}).get("annotations") or {}
    return dict(found)


def phase(pv: JsonObj) -> str:
    return str((pv.get("status") or {}).get("phase", ""))


def reclaim_policy(pv: JsonObj) -> str:
    return str((pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or DELETE)


def claim_ref(pv: JsonObj) -> ClaimRef | None:
    ref = (pv.get("spec") or {}).get("claimRef")
    if not isinstance(ref, dict) or not ref.get("name"):
        return None
    return ClaimRef(str(ref.get("namespace", "")), str(ref["name"]), str(ref.get("uid", "")))


def in_tree_plugin(pv: JsonObj) -> str | None:
    """The in-tree plugin name of the PV's in-tree source, or None (CSI or another source)."""
    key = in_tree_source_key(pv.get("spec") or {})
    return None if key is None else IN_TREE_SOURCES[key].plugin


def csi_driver(pv: JsonObj) -> str | None:
    csi = (pv.get("spec") or {}).get("csi")
    return str(csi.get("driver", "")) if isinstance(csi, dict) else None


def is_deleting(obj: JsonObj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def record_of(pv: JsonObj) -> JsonObj:
    """What a conversion keeps of `pv` (see the module contract); our own annotations are dropped."""
    metadata = pv.get("metadata") or {}
    kept = {k: json_copy(metadata[k]) for k in _KEPT_METADATA if metadata.get(k) is not None}
    own = {k: v for k, v in (kept.get("annotations") or {}).items() if k not in OWN_ANNOTATIONS}
    kept.pop("annotations", None)
    if own:
        kept["annotations"] = own
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": kept, "spec": json_copy(pv["spec"])}


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _shape_error(record: Any) -> str | None:
    """What is wrongly typed in a record, among the fields a rollback reads or writes back, or None.
    A record a person edited may hold anything; each of these would crash the rollback (or be refused
    by the API server on every attempt) instead of making it a bad-record skip."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for field, wanted in (("apiVersion", "v1"), ("kind", "PersistentVolume")):
        if record.get(field, wanted) != wanted:
            return f"{field} is not {wanted}"
    metadata, spec = record.get("metadata"), record.get("spec")
    if not isinstance(metadata, dict):
        return "metadata is not an object"
    if not isinstance(spec, dict):
        return "spec is not an object"
    return _metadata_error(metadata) or _spec_error(spec)


def _metadata_error(metadata: JsonObj) -> str | None:
    if not isinstance(metadata.get("name"), str):
        return "metadata.name is not a string"
    for field in ("labels", "annotations"):
        if metadata.get(field) is not None and not _string_map(metadata[field]):
            return f"metadata.{field} is not a map of strings"
    owners = metadata.get("ownerReferences")
    if owners is not None and not (isinstance(owners, list) and all(isinstance(r, dict) for r in owners)):
        return "metadata.ownerReferences is not a list of objects"
    return None


def _spec_error(spec: JsonObj) -> str | None:
    if spec.get("claimRef") is not None and not isinstance(spec["claimRef"], dict):
        return "spec.claimRef is not an object"
    capacity = spec.get("capacity")
    if capacity is None:
        return None
    if not _string_map(capacity):
        return "spec.capacity is not a map of quantities (strings)"
    for resource, value in capacity.items():
        try:
            quantity(value)
        except ValueError as exc:
            return f"spec.capacity.{resource}: {exc}"
    return None


def recorded_original(pv: JsonObj) -> JsonObj | None:
    """The in-tree record a converted PV carries, None when it has none; RecordError when unusable."""
    text = annotations_of(pv).get(ANN_ORIGINAL)
    if text is None:
        return None
    try:
        record: JsonObj = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"annotation {ANN_ORIGINAL} is not JSON: {exc}") from None
    wrong = _shape_error(record)
    if wrong is not None:
        raise RecordError(f"annotation {ANN_ORIGINAL} is not a PersistentVolume record: {wrong}")
    if name_of(record) != name_of(pv):
        raise RecordError(f"annotation {ANN_ORIGINAL} records PV {name_of(record)!r}, not this one")
    if in_tree_plugin(record) is None:
        sources = sorted(k for k, v in record["spec"].items() if isinstance(v, dict))
        raise UnknownPluginError(
            f"annotation {ANN_ORIGINAL} records a volume source this version does not migrate "
            f"({', '.join(sources)})"
        )
    return record


def _with_annotations(pv: JsonObj, extra: dict[str, str]) -> None:
    metadata = pv.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **extra}


def convert_target(translator: Translator, record: JsonObj, journal_id: str, identity: str) -> JsonObj:
    """The CSI PV for `record` (raises TranslationError when the source cannot be translated)."""
    target = translator.translate_in_tree_pv_to_csi(record)
    spec = target["spec"]
    if "accessModes" in record["spec"]:
        spec["accessModes"] = json_copy(record["spec"]["accessModes"])
    spec["persistentVolumeReclaimPolicy"] = RETAIN
    _with_annotations(
        target,
        {
            ANN_ORIGINAL: json.dumps(record, sort_keys=True, separators=(",", ":")),
            ANN_CONVERTED_BY: identity,
            ANN_JOURNAL_ID: journal_id,
        },
    )
    return target


def rollback_target(record: JsonObj, current: JsonObj, journal_id: str) -> JsonObj:
    """The in-tree PV a rollback creates from `record`, with the live claimRef and grown capacity."""
    target: JsonObj = json_copy(record)
    spec = target["spec"]
    live_ref = (current.get("spec") or {}).get("claimRef")
    if live_ref is None:
        spec.pop("claimRef", None)
    else:
        spec["claimRef"] = json_copy(live_ref)
    grown = larger_capacity(spec.get("capacity") or {}, (current.get("spec") or {}).get("capacity") or {})
    if grown:
        spec["capacity"] = grown
    spec["persistentVolumeReclaimPolicy"] = RETAIN
    _with_annotations(target, {ANN_JOURNAL_ID: journal_id})
    return target


_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIXES: dict[str, Decimal] = {
    **{k: Decimal(2) ** v for k, v in _BINARY.items()},
    **{k: Decimal(10) ** v for k, v in _DECIMAL.items()},
}


def quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("10Gi", "500M", "1e3") as a number; ValueError when malformed."""
    text = text.strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number, factor = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, factor = text, Decimal(1)
    try:
        value = Decimal(number) * factor
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite():  # Decimal also reads NaN and Infinity, which order comparisons refuse
        raise ValueError(f"not a quantity: {text!r}")
    return value


def larger_capacity(recorded: dict[str, str], current: dict[str, str]) -> dict[str, str] | None:
    """`current` capacity when its storage is larger than the record's (a grown disk), else None."""
    try:
        grown = quantity(current.get("storage", "0")) > quantity(recorded.get("storage", "0"))
    except ValueError:
        return None
    return dict(current) if grown else None


def _disk_of(translator: Translator, in_tree: JsonObj) -> tuple[str, str, str]:
    """(driver, volume handle, partition) the in-tree PV names, through forward translation."""
    csi = translator.translate_in_tree_pv_to_csi(in_tree)["spec"]["csi"]
    partition = str((csi.get("volumeAttributes") or {}).get("partition", ""))
    return str(csi["driver"]), str(csi["volumeHandle"]), partition


def disk_difference(translator: Translator, current: JsonObj, record: JsonObj) -> str | None:
    """None when the current CSI PV still names the record's disk, else a message naming both.

    The current PV is reverse-translated and the result translated forward again, so handle forms
    that name the same disk (EBS `aws://zone/vol-x` and `vol-x`, a GCE handle whose project was
    repaired) compare equal. Where reverse translation loses the disk (vSphere keeps no volume path),
    the current handle is compared with the record's translated handle instead.
    """
    try:
        wanted = _disk_of(translator, record)
        found = _disk_of(translator, translator.translate_csi_pv_to_in_tree(current))
    except TranslationError as exc:
        return f"the PV does not translate back to an in-tree volume: {exc}"
    if not found[1]:
        handle = str((current["spec"].get("csi") or {}).get("volumeHandle", ""))
        found = (csi_driver(current) or "", handle, wanted[2])
    if found == wanted:
        return None
    return (
        f"spec.csi names disk {_disk_text(found)} (by reverse translation) but the record names "
        f"{_disk_text(wanted)}; the PV was changed after conversion"
    )


def _disk_text(disk: tuple[str, str, str]) -> str:
    driver, handle, partition = disk
    text = f"{handle!r} of {driver}"
    return f"{text}, partition {partition}" if partition not in ("", "0") else text
