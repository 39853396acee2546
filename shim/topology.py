"""Node-affinity, topology-label and allowedTopologies helpers shared by the plugin translators.

Functions taking a PV mutate it in place (the facade hands plugins a private copy). Label keys and the
order of checks follow Kubernetes' csi-translation-lib (spec section 3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from shim import fields
from shim.errors import TranslationError
from shim.fields import JSON

GA_ZONE = "topology.kubernetes.io/zone"
GA_REGION = "topology.kubernetes.io/region"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
MULTI_ZONE_DELIMITER = "__"
OPERATOR_IN = "In"

RegionParser = Callable[[list[str]], str]


def node_selector_terms(pv: JSON) -> list[JSON] | None:
    """spec.nodeAffinity.required.nodeSelectorTerms, or None when any level is missing."""
    spec = fields.child(pv, "spec")
    affinity = None if spec is None else fields.child(spec, "nodeAffinity")
    return terms_of_affinity(affinity)


def terms_of_affinity(affinity: JSON | None) -> list[JSON] | None:
    """required.nodeSelectorTerms of a VolumeNodeAffinity, or None."""
    required = None if affinity is None else fields.child(affinity, "required")
    return fields.obj_list(required, "nodeSelectorTerms")


def expressions(term: JSON) -> list[JSON]:
    """A term's matchExpressions (never matchFields); [] when absent."""
    return fields.obj_list(term, "matchExpressions") or []


def labels(pv: JSON) -> dict[str, str]:
    """metadata.labels for reading; {} when absent."""
    meta = fields.child(pv, "metadata")
    return fields.string_map(meta, "labels") or {}


def set_label(pv: JSON, key: str, value: str) -> None:
    """Set metadata.labels[key], creating metadata/labels when needed."""
    fields.set_metadata(pv, "labels", key, value)


def topology_key_exists(key: str, affinity: JSON | None) -> bool:
    """Whether any matchExpression of any required term has `key`."""
    for term in terms_of_affinity(affinity) or []:
        if any(fields.string(req, "key") == key for req in expressions(term)):
            return True
    return False


def get_topology_label(pv: JSON) -> tuple[str, str]:
    """(zone label, region label) the PV speaks: GA or beta, by affinity keys, then labels; default GA."""
    spec = fields.child(pv, "spec")
    affinity = None if spec is None else fields.child(spec, "nodeAffinity")
    if topology_key_exists(GA_ZONE, affinity):
        return GA_ZONE, GA_REGION
    if topology_key_exists(BETA_ZONE, affinity):
        return BETA_ZONE, BETA_REGION
    pv_labels = labels(pv)
    if GA_ZONE in pv_labels:
        return GA_ZONE, GA_REGION
    if BETA_ZONE in pv_labels:
        return BETA_ZONE, BETA_REGION
    return GA_ZONE, GA_REGION


def get_topology_values(pv: JSON, key: str) -> list[str]:
    """Sorted, de-duplicated values of every required matchExpression with `key`."""
    values: set[str] = set()
    for term in node_selector_terms(pv) or []:
        for req in expressions(term):
            if fields.string(req, "key") == key:
                values.update(fields.str_list(req, "values") or [])
    return sorted(values)


def replace_topology(pv: JSON, old_key: str, new_key: str) -> None:
    """Rename the key of every required matchExpression `old_key` -> `new_key`; never merges or fails."""
    for term in node_selector_terms(pv) or []:
        for req in expressions(term):
            if fields.string(req, "key") == old_key:
                req["key"] = new_key


def add_topology(pv: JSON, key: str, zones: list[str] | None) -> None:
    """Append `key In zones` (trimmed, non-empty, unique, sorted) to every required term.

    Creates the affinity and one empty term when absent. No valid zone -> TranslationError, PV untouched.
    """
    cleaned = sorted({z for z in (fields.go_trim_space(z) for z in zones or []) if z})
    if not cleaned:
        raise TranslationError("there are no valid zones to add to pv")
    spec = fields.ensure_child(pv, "spec")
    required = fields.ensure_child(fields.ensure_child(spec, "nodeAffinity"), "required")
    terms = fields.obj_list(required, "nodeSelectorTerms")
    if not terms:
        terms = [{}]
        required["nodeSelectorTerms"] = terms
    for term in terms:
        found = fields.obj_list(term, "matchExpressions")
        if found is None:
            found = []
            term["matchExpressions"] = found
        found.append({"key": key, "operator": OPERATOR_IN, "values": list(cleaned)})


def translate_topology_in_tree_to_csi(pv: JSON, csi_key: str) -> None:
    """Zone requirements (or the zone label, split on "__") -> `csi_key`; beta region requirements -> GA."""
    zone_label, region_label = get_topology_label(pv)
    if get_topology_values(pv, zone_label):
        replace_topology(pv, zone_label, csi_key)
    else:
        pv_labels = labels(pv)
        if zone_label in pv_labels:
            with contextlib.suppress(TranslationError):  # Kubernetes ignores a label without any usable zone.
                add_topology(pv, csi_key, pv_labels[zone_label].split(MULTI_ZONE_DELIMITER))
    if region_label == BETA_REGION and get_topology_values(pv, region_label):
        replace_topology(pv, region_label, GA_REGION)


def translate_topology_csi_to_in_tree(pv: JSON, csi_key: str, region_parser: RegionParser | None) -> None:
    """`csi_key` requirements -> the PV's zone label; optional region requirements; missing zone label set."""
    zone_label, _ = get_topology_label(pv)
    replace_topology(pv, csi_key, zone_label)
    if region_parser is not None:
        try:
            region_topology_handler(pv, region_parser)
        except TranslationError as err:
            raise TranslationError(
                f"failed to translate topology: failed to handle region topology: {err}"
            ) from err
    zones = get_topology_values(pv, zone_label)
    if zones and zone_label not in labels(pv):
        set_label(pv, zone_label, MULTI_ZONE_DELIMITER.join(zones))


def region_topology_handler(pv: JSON, region_parser: RegionParser) -> None:
    """Add a region requirement (parsed from its zones) to each term lacking one; label a single region."""
    terms = node_selector_terms(pv)
    if not terms:
        return
    zone_label, region_label = get_topology_label(pv)
    for term in terms:
        zones: list[str] = []
        has_region = False
        for req in expressions(term):
            key = fields.string(req, "key")
            if key == region_label:
                has_region = True
                break
            if key == zone_label:
                zones.extend(fields.str_list(req, "values") or [])
        if has_region:
            continue
        region = region_parser(zones)
        found = fields.obj_list(term, "matchExpressions")
        if found is None:
            found = []
            term["matchExpressions"] = found
        found.append({"key": region_label, "operator": OPERATOR_IN, "values": [region]})
    regions = get_topology_values(pv, region_label)
    if len(regions) == 1 and region_label not in labels(pv):
        set_label(pv, region_label, regions[0])


def translate_allowed_topologies(terms: list[JSON] | None, csi_key: str) -> list[JSON] | None:
    """New StorageClass topology terms, GA/beta zone requirements re-keyed to `csi_key`; None stays None."""
    if terms is None:
        return None
    result: list[JSON] = []
    for term in terms:
        new_term: JSON = {}
        for req in fields.obj_list(term, "matchLabelExpressions") or []:
            if fields.string(req, "key") in (GA_ZONE, BETA_ZONE):
                req = {"key": csi_key, "values": req.get("values")}
            new_term.setdefault("matchLabelExpressions", []).append(req)
        result.append(new_term)
    return result


def generate_topology_selectors(key: str, values: list[str]) -> list[JSON]:
    """One allowedTopologies term `key in values`."""
    return [{"matchLabelExpressions": [{"key": key, "values": values}]}]
