"""`ballast-migrate status`: every in-tree or converted PV and its state, twins, inline volumes.

States: `in-tree` (with what uses it), `converted` (by whom, to which driver and handle),
`converting` / `rolling back` (a journal: its step, and who holds the lock until when, or `paused`
when no one does), `record unreadable` (a converted PV whose record cannot be used). Read-only.
An API error raises oneshot.ClusterError naming what could not be read.
"""

from __future__ import annotations

import argparse
import json
from typing import NamedTuple, TextIO

from shim.manifests import IN_TREE_SOURCES, in_tree_source_key
from shim.migrate import kube
from shim.migrate import objects as o
from shim.migrate.journal import CONVERT, JournalError
from shim.migrate.lock import ANN_JOURNAL, ANN_VERSION, PVLocks, holder_of, journal_of, pv_of
from shim.migrate.oneshot import doing
from shim.migrate.table import render_table
from shim.migrate.twins import ANN_PLUGIN, ANN_TWIN_OF, is_default, is_twin
from shim.migrate.usage import Usage, is_terminated


class VolumeRow(NamedTuple):
    pv: str
    plugin: str
    phase: str
    claim: str
    state: str
    detail: str


def _journal_row(pv: o.JsonObj | None, name: str, lease: o.JsonObj) -> VolumeRow:
    phase = o.phase(pv) if pv else "(absent)"
    try:
        journal = journal_of(lease)
    except JournalError as exc:
        return VolumeRow(name, "?", phase, "-", "stuck", f"journal unreadable: {exc}")
    assert journal is not None
    state = "converting" if journal.direction == CONVERT else "rolling back"
    holder = holder_of(lease)
    spec = lease.get("spec") or {}
    who = (
        f"held by {holder} (version {o.annotations_of(lease).get(ANN_VERSION, '?')}) "
        f"renewed {spec.get('renewTime')} for {spec.get('leaseDurationSeconds')}s"
        if holder
        else "paused (no holder: the next actor resumes it)"
    )
    claim = str(journal.claim) if journal.claim else "-"
    return VolumeRow(name, journal.plugin, phase, claim, state, f"next step {journal.step}; {who}")


def _volume_row(pv: o.JsonObj, usage: Usage) -> VolumeRow | None:
    name, phase = o.name_of(pv), o.phase(pv)
    claim = str(o.claim_ref(pv) or "-")
    plugin = o.in_tree_plugin(pv)
    if plugin is not None:
        with doing(f"finding the pods and VolumeAttachments that use PV {name}"):
            users = usage.users(pv)
        detail = f"in use by {', '.join(users)}" if users else "not in use"
        return VolumeRow(name, plugin, phase, claim, "in-tree", detail)
    if o.ANN_ORIGINAL not in o.annotations_of(pv):
        return None
    try:
        record = o.recorded_original(pv)
    except o.RecordError as exc:
        return VolumeRow(name, "?", phase, claim, "record unreadable", str(exc))
    csi = (pv.get("spec") or {}).get("csi") or {}
    by = o.annotations_of(pv).get(o.ANN_CONVERTED_BY, "?")
    detail = f"by {by}; {csi.get('driver')} {csi.get('volumeHandle')}"
    return VolumeRow(name, o.in_tree_plugin(record or {}) or "?", phase, claim, "converted", detail)


def volume_rows(
    args: argparse.Namespace, client: kube.KubeClient, locks: PVLocks, usage: Usage
) -> list[VolumeRow]:
    with doing("listing PersistentVolumes"):
        listed = client.list_all(kube.PVS, labelSelector=args.selector or None)[0]
    with doing(f"listing the lock Leases in namespace {locks.namespace}"):
        leases = {pv_of(lease): lease for lease in locks.list_leases()}
    pvs = {o.name_of(pv): pv for pv in listed}
    rows: list[VolumeRow] = []
    for name in sorted(set(pvs) | set(leases)):
        pv = pvs.get(name)
        if name in leases and o.annotations_of(leases[name]).get(ANN_JOURNAL):
            row: VolumeRow | None = _journal_row(pv, name, leases[name])
        else:
            row = None if pv is None else _volume_row(pv, usage)
        if (
            row is not None
            and (not args.pv or name in args.pv)
            and (not args.plugin or row.plugin in args.plugin)
        ):
            rows.append(row)
    return rows


def twin_rows(client: kube.KubeClient) -> list[list[str]]:
    with doing("listing StorageClasses"):
        classes = client.list_all(kube.STORAGE_CLASSES)[0]
    return [
        [
            o.name_of(sc),
            o.annotations_of(sc).get(ANN_TWIN_OF, ""),
            o.annotations_of(sc).get(ANN_PLUGIN, ""),
            str(sc.get("provisioner", "")),
            "yes" if is_default(sc) else "no",
        ]
        for sc in classes
        if is_twin(sc)
    ]


def inline_rows(client: kube.KubeClient) -> list[list[str]]:
    rows = []
    with doing("listing pods"):
        pods = client.list_all(kube.PODS)[0]
    for pod in pods:
        if is_terminated(pod):
            continue
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            key = in_tree_source_key(volume)
            if key is not None:
                where = f"{(pod.get('metadata') or {}).get('namespace')}/{o.name_of(pod)}"
                rows.append([where, str(volume.get("name", "")), IN_TREE_SOURCES[key].plugin])
    return rows


def run(args: argparse.Namespace, client: kube.KubeClient, locks: PVLocks, usage: Usage, out: TextIO) -> int:
    volumes = volume_rows(args, client, locks, usage)
    twins, inline = twin_rows(client), inline_rows(client)
    if args.output == "json":
        doc = {
            "volumes": [r._asdict() for r in volumes],
            "storageClassTwins": [
                dict(zip(("name", "twinOf", "plugin", "provisioner", "default"), t, strict=True))
                for t in twins
            ],
            "inlineVolumes": [dict(zip(("pod", "volume", "plugin"), i, strict=True)) for i in inline],
        }
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    out.write(
        render_table(["PV", "PLUGIN", "PHASE", "CLAIM", "STATE", "DETAIL"], [list(r) for r in volumes])
        if volumes
        else "no in-tree or converted PersistentVolumes\n"
    )
    if twins:
        out.write("\n" + render_table(["TWIN", "TWIN OF", "PLUGIN", "PROVISIONER", "DEFAULT"], twins))
    if inline:
        out.write("\n" + render_table(["POD", "INLINE VOLUME", "PLUGIN (reported, not converted)"], inline))
    return 0
