"""`ballast-migrate`: translate manifests between in-tree and CSI form, plan a migration, and run it
(`controller`, `apply`, `rollback`, `status`: shim.migrate, imported only for those commands).

Exit codes: 0 success (`plan`: nothing blocks), 1 something cannot be translated (`plan`: something
blocks; `apply`/`rollback`: something is blocked, or a request they cannot go on without failed),
2 usage or input errors (bad flags, invalid YAML/JSON, unknown kind, missing fields, an unusable
kubeconfig, an unreachable cluster, credentials the cluster refuses). Errors are one line per problem on
stderr, naming the document and field, or the request that failed; no traceback. `translate` prints
nothing when any document fails, so partial output is never applied.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import yaml

from shim import TranslationError, Translator
from shim.failpoints import FailpointSpecError
from shim.gates import GATES, FeatureGateError, FeatureGates
from shim.manifests import (
    JsonObj,
    Manifest,
    ManifestError,
    expand_lists,
    in_tree_source_key,
    is_list_kind,
    load_cluster,
    load_sources,
    pod_spec,
    pod_spec_path,
)
from shim.migrate import options as migrate_options
from shim.migrate.options import KubeConfigError, UsageError
from shim.migrate.table import render_table
from shim.plan import PlanItem, Planner, installed_drivers

EXIT_OK = 0
EXIT_BLOCKED = 1
EXIT_USAGE = 2

# Annotation on the PV that `translate` prints for an inline pod volume (Kubernetes builds it in memory).
INLINE_SOURCE_ANNOTATION = "migration.ballast.io/inline-volume-of"


# ---------------------------------------------------------------- translate


@dataclass
class TranslateResult:
    documents: list[JsonObj] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _fail(manifest: Manifest, where: str, exc: TranslationError) -> str:
    return str(manifest.error(where, f"cannot translate: {exc}"))


def _translate_forward(translator: Translator, manifest: Manifest, result: TranslateResult) -> list[JsonObj]:
    obj, group, kind = manifest.obj, manifest.group, manifest.kind
    if (group, kind) == ("", "PersistentVolume"):
        key = in_tree_source_key(obj["spec"])
        if key is None:
            return [obj]
        try:
            return [translator.translate_in_tree_pv_to_csi(obj)]
        except TranslationError as exc:
            result.errors.append(_fail(manifest, f"spec.{key}", exc))
            return []
    if (group, kind) == ("storage.k8s.io", "StorageClass"):
        provisioner = obj["provisioner"]
        if not translator.is_migratable_in_tree_plugin_by_name(provisioner):
            return [obj]
        try:
            translated = translator.translate_in_tree_storage_class_to_csi(provisioner, obj)
            translated["provisioner"] = translator.get_csi_name_from_in_tree_name(provisioner)
        except TranslationError as exc:
            result.errors.append(_fail(manifest, "parameters", exc))
            return []
        return [translated]
    spec, path = pod_spec(obj), pod_spec_path(obj)
    if spec is None or path is None:
        return [obj]
    documents = [obj]
    namespace = manifest.namespace or "default"
    for i, volume in enumerate(spec.get("volumes") or []):
        key = in_tree_source_key(volume)
        if key is None:
            continue
        where = f"{'.'.join(path)}.volumes[{i}].{key}"
        try:
            pv = translator.translate_in_tree_inline_volume_to_csi(volume, namespace)
        except TranslationError as exc:
            result.errors.append(_fail(manifest, where, exc))
            continue
        pv = {"apiVersion": "v1", "kind": "PersistentVolume", **pv}
        metadata = pv.setdefault("metadata", {})
        metadata.setdefault("annotations", {})[INLINE_SOURCE_ANNOTATION] = (
            f"{manifest.label} volume {volume['name']}"
        )
        documents.append(pv)
    return documents


def _translate_reverse(translator: Translator, manifest: Manifest, result: TranslateResult) -> list[JsonObj]:
    obj, group, kind = manifest.obj, manifest.group, manifest.kind
    if (group, kind) == ("", "PersistentVolume"):
        csi = obj["spec"].get("csi")
        if csi is None or not translator.is_migrated_csi_driver_by_name(csi["driver"]):
            return [obj]
        try:
            return [translator.translate_csi_pv_to_in_tree(obj)]
        except TranslationError as exc:
            result.errors.append(_fail(manifest, "spec.csi", exc))
            return []
    if (group, kind) == ("storage.k8s.io", "StorageClass") and translator.is_migrated_csi_driver_by_name(
        obj["provisioner"]
    ):
        result.warnings.append(
            f"{manifest.location} ({manifest.label}): StorageClasses have no CSI -> in-tree translation; "
            "printed unchanged"
        )
    return [obj]


def translate_manifests(
    translator: Translator, manifests: Sequence[Manifest], reverse: bool
) -> TranslateResult:
    """Translate every manifest (Lists item by item); untouched objects pass through as they are."""
    step = _translate_reverse if reverse else _translate_forward
    result = TranslateResult()
    for manifest in manifests:
        if is_list_kind(manifest.obj):
            items: list[JsonObj] = []
            for item in expand_lists([manifest]):
                items.extend(step(translator, item, result))
            result.documents.append({**manifest.obj, "items": items})
        else:
            result.documents.extend(step(translator, manifest, result))
    return result


def _becomes_text(item: PlanItem) -> str:
    if not item.becomes:
        return "-"
    if "provisioner" in item.becomes:
        parameters = ",".join(f"{k}={v}" for k, v in item.becomes["parameters"].items())
        return f"{item.becomes['provisioner']} {parameters}".rstrip()
    return f"{item.becomes.get('driver', item.driver)} {item.becomes.get('volumeHandle', '')}".rstrip()


def _plan_report(items: Sequence[PlanItem], gates: FeatureGates, drivers: set[str]) -> JsonObj:
    return {
        "featureGates": str(gates),
        "installedDrivers": sorted(drivers),
        "items": [i.to_json() for i in items],
        "blocked": sum(1 for i in items if i.blockers),
    }


def _write_plan(
    items: Sequence[PlanItem], gates: FeatureGates, drivers: set[str], output: str, out: TextIO
) -> None:
    if output == "json":
        out.write(json.dumps(_plan_report(items, gates, drivers), indent=2) + "\n")
        return
    if output == "yaml":
        out.write(yaml.safe_dump(_plan_report(items, gates, drivers), sort_keys=False))
        return
    if not items:
        out.write("no PersistentVolume, StorageClass or pod volume uses an in-tree plugin\n")
        return
    rows = [[i.object, i.plugin, i.migration, _becomes_text(i), "; ".join(i.blockers) or "-"] for i in items]
    out.write(render_table(["OBJECT", "PLUGIN", "MIGRATION", "BECOMES", "BLOCKED BY"], rows))
    blocked = sum(1 for i in items if i.blockers)
    out.write(f"\n{len(items)} using in-tree plugins, {blocked} blocked\n")


# ---------------------------------------------------------------- gates


def _write_gates(gates: FeatureGates, output: str, out: TextIO) -> None:
    records = [
        {
            "name": g.name,
            "plugin": g.plugin or "",
            "default": g.default,
            "value": gates.enabled(g.name),
            "kubernetesStage": g.kubernetes_stage,
            "kubernetesLocked": g.kubernetes_locked,
            "kubernetesHistory": g.kubernetes_history,
        }
        for g in GATES
    ]
    if output == "json":
        out.write(json.dumps(records, indent=2) + "\n")
    elif output == "yaml":
        out.write(yaml.safe_dump(records, sort_keys=False))
    else:
        rows = [
            [
                g.name,
                g.plugin or "(all)",
                "on" if gates.enabled(g.name) else "off",
                "locked to true" if g.kubernetes_locked else g.kubernetes_stage,
                g.kubernetes_history,
            ]
            for g in GATES
        ]
        out.write(render_table(["GATE", "PLUGIN", "VALUE", "IN KUBERNETES", "KUBERNETES HISTORY"], rows))


# ---------------------------------------------------------------- main


def _dump_documents(documents: Sequence[JsonObj], output: str, out: TextIO) -> None:
    if output == "json":
        for document in documents:
            out.write(json.dumps(document, indent=2) + "\n")
    elif documents:
        out.write(yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True))


def _inputs(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help=help_text)
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="PATH",
        help="a file or directory, like kubectl's -f (repeatable; adds to PATH)",
    )


def _add_translate(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    translate = commands.add_parser(
        "translate",
        help="print manifests in CSI form",
        description="Print the CSI form of PersistentVolumes and StorageClasses that use in-tree plugins. "
        "For in-tree pod volumes (Pods, Deployments, ...), the object is printed unchanged and followed "
        "by the PersistentVolume Kubernetes builds for it in memory, annotated with "
        f"{INLINE_SOURCE_ANNOTATION}. Other objects pass through unchanged.",
    )
    _inputs(translate, "files or directories; - or none: stdin")
    translate.add_argument(
        "--reverse", action="store_true", help="translate CSI PersistentVolumes back to in-tree"
    )
    translate.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")


def _add_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = commands.add_parser(
        "plan",
        help="list what would migrate and what blocks it",
        description="List every PersistentVolume, StorageClass and pod volume using an in-tree plugin: "
        "whether migration is on under --feature-gates, what it becomes, and what blocks it. "
        "Exit 0 when nothing blocks, 1 when something does, 2 on bad input.",
    )
    _inputs(plan, "files or directories; - for stdin")
    plan.add_argument("--kubeconfig", help="read PVs, StorageClasses, Pods and CSIDrivers from this cluster")
    plan.add_argument("--context", help="kubeconfig context (default: current)")
    plan.add_argument("--feature-gates", default="", metavar="A=true,B=false", help="migration gates")
    plan.add_argument(
        "--csi-driver",
        action="append",
        default=[],
        metavar="NAME",
        help="treat this CSI driver as installed (repeatable), in addition to CSIDriver objects",
    )
    plan.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ballast-migrate",
        description="Translate Kubernetes in-tree volume manifests to CSI, plan a migration, and run it.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_translate(commands)
    _add_plan(commands)
    gates = commands.add_parser("gates", help="list the migration feature gates and their values")
    gates.add_argument("--feature-gates", default="", metavar="A=true,B=false")
    gates.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    migrate_options.add_commands(commands)
    return parser


def _run_translate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    manifests = load_sources([*args.paths, *args.filename] or ["-"])
    result = translate_manifests(Translator(), manifests, args.reverse)
    for warning in result.warnings:
        err.write(f"ballast-migrate: warning: {warning}\n")
    if result.errors:
        for error in result.errors:
            err.write(f"ballast-migrate: {error}\n")
        return EXIT_BLOCKED
    _dump_documents(result.documents, args.output, out)
    return EXIT_OK


def _run_plan(args: argparse.Namespace, out: TextIO) -> int:
    gates = FeatureGates.parse(args.feature_gates)
    paths = [*args.paths, *args.filename]
    if args.kubeconfig and paths:
        raise UsageError("give either manifest paths or --kubeconfig, not both")
    if not args.kubeconfig and not paths:
        raise UsageError("give manifest paths (- for stdin) or --kubeconfig")
    manifests = load_cluster(args.kubeconfig, args.context) if args.kubeconfig else load_sources(paths)
    objects = expand_lists(manifests)
    drivers = installed_drivers(objects, args.csi_driver)
    planner = Planner(Translator(), gates, drivers)
    items = [item for manifest in objects for item in planner.plan(manifest)]
    _write_plan(items, gates, drivers, args.output, out)
    return EXIT_BLOCKED if any(i.blockers for i in items) else EXIT_OK


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "gates":
        _write_gates(FeatureGates.parse(args.feature_gates), args.output, out)
        return EXIT_OK
    if args.command == "translate":
        return _run_translate(args, out, err)
    if args.command == "plan":
        return _run_plan(args, out)
    from shim.migrate import commands  # the controller's modules load only for its commands

    try:
        return commands.run(args, out)
    except commands.ClusterError as exc:
        err.write(f"ballast-migrate: {exc}\n")
        return exc.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    out, err = sys.stdout, sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return _run(args, out, err)
    except (ManifestError, FeatureGateError, UsageError, KubeConfigError, FailpointSpecError) as exc:
        message = str(exc) if not isinstance(exc, FeatureGateError) else f"--feature-gates: {exc}"
        err.write(f"ballast-migrate: {message}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
