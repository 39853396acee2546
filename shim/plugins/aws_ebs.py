"""AWS EBS: kubernetes.io/aws-ebs <-> ebs.csi.aws.com (spec 4.2)."""

from __future__ import annotations

import re

from shim import fields, topology
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, goneturl, registry, storageclass

TOPOLOGY_KEY = "topology.ebs.csi.aws.com/zone"
IOPS_PER_GB_KEY = "iopspergb"
ALLOW_INCREASE_IOPS_KEY = "allowautoiopspergbincrease"
_VOLUME_ID = re.compile(r"vol-[^/]*")


def kubernetes_volume_id_to_ebs_volume_id(kubernetes_id: str) -> str:
    """`vol-...` from `aws://<zone>/vol-...`; IDs without the `aws://` prefix are returned verbatim."""
    if not kubernetes_id.startswith("aws://"):
        return kubernetes_id
    try:
        path = goneturl.url_path(kubernetes_id)
    except ValueError as err:
        raise TranslationError(f"Invalid disk name ({kubernetes_id}): {err}") from err
    aws_id = path.strip("/")
    if not _VOLUME_ID.fullmatch(aws_id):
        raise TranslationError(f"Invalid format for AWS volume ({kubernetes_id})")
    return aws_id


def region_from_zones(zones: list[str]) -> str:
    """The one region of AWS zones (`us-west-2a`, local zones, wavelength zones); anything else fails."""
    if not zones:
        raise TranslationError("no zones specified")
    regions: set[bytes] = set()  # Go slices bytes: a 2-byte last part may be one non-ASCII character
    for zone in zones:
        parts = zone.encode("utf-8").split(b"-")
        if len(parts) in (3, 4) and len(parts[-1]) == 2:
            regions.add(b"-".join([*parts[:-1], parts[-1][:1]]))
        elif len(parts) in (5, 7):
            regions.add(b"-".join(parts[:3]))
        else:
            raise TranslationError(f"Unexpected zone format: {zone} is not a valid AWS zone")
    if len(regions) != 1:
        raise TranslationError(f"multiple or no regions gotten from zones, got: {sorted(regions)}")
    return fields.go_string(regions.pop())


def _ebs_to_csi(driver: str, ebs: JSON) -> JSON:
    try:
        handle = kubernetes_volume_id_to_ebs_volume_id(fields.string(ebs, "volumeID"))
    except TranslationError as err:
        raise TranslationError(f"failed to translate Kubernetes ID to EBS Volume ID {err}") from err
    return base.csi_source(
        driver,
        handle,
        read_only=fields.boolean(ebs, "readOnly"),
        fs_type=fields.string(ebs, "fsType"),
        volume_attributes={"partition": str(fields.int32(ebs, "partition"))},
    )


def _iops_parameter(key: str, value: str, params: dict[str, str]) -> bool:
    if fields.go_lower(key) != IOPS_PER_GB_KEY:
        return False
    params[key] = value
    params[ALLOW_INCREASE_IOPS_KEY] = "true"
    return True


class AWSElasticBlockStore(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/aws-ebs"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        csi = _ebs_to_csi(self.csi_name, base.take_source(pv, self.source_key))
        topology.translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY)
        base.spec_of(pv)["csi"] = csi
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        ebs: JSON = {
            "volumeID": fields.string(csi, "volumeHandle"),
            "fsType": fields.string(csi, "fsType"),
            "readOnly": fields.boolean(csi, "readOnly"),
        }
        attributes = fields.string_map(csi, "volumeAttributes") or {}
        if "partition" in attributes:
            try:
                ebs["partition"] = fields.atoi(attributes["partition"])
            except TranslationError as err:
                raise TranslationError(
                    f"failed to convert partition {attributes['partition']} to integer: {err}"
                ) from err
        topology.translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, region_from_zones)
        base.spec_of(pv)[self.source_key] = fields.compact(ebs, keep=("volumeID",))
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        csi = _ebs_to_csi(self.csi_name, fields.source(volume, self.source_key) or {})
        return base.new_pv(f"{self.csi_name}-{csi['volumeHandle']}", csi, [base.READ_WRITE_ONCE])

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        return storageclass.translate_zonal_storage_class(
            storageclass.require_sc(sc), TOPOLOGY_KEY, rename_fs_type=True, extra=_iops_parameter
        )
