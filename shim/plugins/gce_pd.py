"""GCE Persistent Disk: kubernetes.io/gce-pd <-> pd.csi.storage.gke.io (spec 4.1)."""

from __future__ import annotations

from shim import fields, topology
from shim.errors import TranslationError
from shim.fields import JSON
from shim.plugins import base, registry, storageclass

TOPOLOGY_KEY = "topology.gke.io/zone"
UNSPECIFIED = "UNSPECIFIED"
_HANDLE_ELEMENTS = 6


def zonal_handle(project: str, zone: str, disk: str) -> str:
    return f"projects/{project}/zones/{zone}/disks/{disk}"


def regional_handle(project: str, region: str, disk: str) -> str:
    return f"projects/{project}/regions/{region}/disks/{disk}"


def region_from_zones(zones: list[str]) -> str:
    """The one region `{locale}-{region}` of GCE zones `{locale}-{region}-{zone}`; anything else fails."""
    if not zones:
        raise TranslationError("no zones specified")
    regions: set[str] = set()
    for zone in zones:
        parts = zone.split("-")
        if len(parts) != 3:
            raise TranslationError(
                f"zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            )
        regions.add(f"{parts[0]}-{parts[1]}")
    if len(regions) != 1:
        raise TranslationError(f"multiple or no regions gotten from zones, got: {sorted(regions)}")
    return regions.pop()


def pd_name_from_volume_id(volume_handle: str) -> str:
    """Disk name (6th `/` element) of a CSI handle; fewer than 6 elements fails."""
    parts = volume_handle.split("/")
    if len(parts) < _HANDLE_ELEMENTS:
        raise TranslationError(
            f"failed to get id components. Got: {len(parts)}, wanted {_HANDLE_ELEMENTS} components or more"
        )
    return parts[5]


def backward_compatible_access_modes(modes: list[str] | None) -> list[str] | None:
    """PD CSI supports one of RWO/ROX: RWX counts as RWO, RWO wins over ROX, anything else becomes RWO."""
    if modes is None:
        return None
    present = {base.READ_WRITE_ONCE if m == base.READ_WRITE_MANY else m for m in modes}
    if base.READ_WRITE_ONCE not in present and base.READ_ONLY_MANY in present:
        return [base.READ_ONLY_MANY]
    return [base.READ_WRITE_ONCE]


def _partition_attribute(partition: int) -> str:
    return "" if partition == 0 else str(partition)


class GCEPersistentDisk(base.InTreePlugin):
    info = registry.BY_IN_TREE_NAME["kubernetes.io/gce-pd"]

    def translate_pv_to_csi(self, pv: JSON) -> JSON:
        gce = base.take_source(pv, self.source_key)
        pd_name = fields.string(gce, "pdName")
        pv_labels = topology.labels(pv)
        zones_label = pv_labels.get(topology.BETA_ZONE, "") or pv_labels.get(topology.GA_ZONE, "")
        zones = zones_label.split(topology.MULTI_ZONE_DELIMITER)
        if len(zones) == 1 and zones[0]:
            handle = zonal_handle(UNSPECIFIED, zones[0], pd_name)
        elif len(zones) > 1:
            try:
                region = region_from_zones(zones)
            except TranslationError as err:
                raise TranslationError(f"failed to get region from zones: {err}") from err
            handle = regional_handle(UNSPECIFIED, region, pd_name)
        else:
            handle = zonal_handle(UNSPECIFIED, UNSPECIFIED, pd_name)
        csi = base.csi_source(
            self.csi_name,
            handle,
            read_only=fields.boolean(gce, "readOnly"),
            fs_type=fields.string(gce, "fsType"),
            volume_attributes={"partition": _partition_attribute(fields.int32(gce, "partition"))},
        )
        topology.translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY)
        spec = base.spec_of(pv)
        spec["csi"] = csi
        modes = backward_compatible_access_modes(fields.str_list(spec, "accessModes"))
        if modes is not None:
            spec["accessModes"] = modes
        return pv

    def translate_csi_to_pv(self, pv: JSON) -> JSON:
        csi = base.take_csi(pv)
        gce: JSON = {"pdName": pd_name_from_volume_id(fields.string(csi, "volumeHandle"))}
        partition = (fields.string_map(csi, "volumeAttributes") or {}).get("partition", "")
        if partition:
            try:
                gce["partition"] = fields.atoi(partition)
            except TranslationError as err:
                raise TranslationError(f"failed to convert partition {partition} to integer: {err}") from err
        gce.update(
            fields.compact(
                {"fsType": fields.string(csi, "fsType"), "readOnly": fields.boolean(csi, "readOnly")}
            )
        )
        topology.translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, region_from_zones)
        base.spec_of(pv)[self.source_key] = fields.compact(gce, keep=("pdName",))
        return pv

    def translate_inline_to_csi(self, volume: JSON, pod_namespace: str) -> JSON:
        gce = fields.source(volume, self.source_key) or {}
        pd_name = fields.string(gce, "pdName")
        read_only = fields.boolean(gce, "readOnly")
        csi = base.csi_source(
            self.csi_name,
            zonal_handle(UNSPECIFIED, UNSPECIFIED, pd_name),
            read_only=read_only,
            fs_type=fields.string(gce, "fsType"),
            volume_attributes={"partition": _partition_attribute(fields.int32(gce, "partition"))},
        )
        mode = base.READ_ONLY_MANY if read_only else base.READ_WRITE_ONCE
        pv = base.new_pv(f"{self.csi_name}-{pd_name}", csi, [mode])
        pv["spec"]["volumeMode"] = base.FILESYSTEM
        return pv

    def translate_storage_class(self, sc: JSON | None) -> JSON | None:
        return storageclass.translate_zonal_storage_class(
            storageclass.require_sc(sc), TOPOLOGY_KEY, rename_fs_type=True
        )

    def repair_volume_handle(self, volume_handle: str, node_id: str) -> str:
        """Fill an UNSPECIFIED project (and zone/region) of a handle from the node ID
        `projects/{p}/zones/{z}/instances/{name}`; handles with a project are returned as they are."""
        tok = volume_handle.split("/")
        if len(tok) < _HANDLE_ELEMENTS:
            raise TranslationError(
                f"volume handle has wrong number of elements; got {len(tok)}, "
                f"wanted {_HANDLE_ELEMENTS} or more"
            )
        if tok[1] != UNSPECIFIED:
            return volume_handle
        node = node_id.split("/")
        if len(node) < _HANDLE_ELEMENTS:
            raise TranslationError(
                f"node handle has wrong number of elements; got {len(node)}, "
                f"wanted {_HANDLE_ELEMENTS} or more"
            )
        if tok[2] == "zones":
            zone = node[3] if tok[3] == UNSPECIFIED else tok[3]
            return zonal_handle(node[1], zone, tok[5])
        if tok[2] == "regions":
            region = tok[3]
            if region == UNSPECIFIED:
                try:
                    region = region_from_zones([node[3]])
                except TranslationError as err:
                    raise TranslationError(f"failed to get region from zone {node[3]}: {err}") from err
            return regional_handle(node[1], region, tok[5])
        raise TranslationError(
            f"expected volume handle to have zones or regions regionality value, got: {tok[2]}"
        )
