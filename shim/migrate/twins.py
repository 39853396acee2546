"""CSI twins of in-tree StorageClasses.

Naming rule: the twin of StorageClass `<name>` is `<name>-csi`; when that would pass 253 characters,
the name is cut and ends in `-csi-<first 10 hex of sha256(name)>` instead. A twin carries the label
app.kubernetes.io/managed-by=ballast-migrate and the annotations migration.ballast.io/twin-of
(the original's name) and migration.ballast.io/plugin. An existing StorageClass of that name that is
not our twin of the same class is never changed (Warning Event on the original, skipped).

The twin has the translated parameters and allowedTopologies (shim.Translator), the CSI driver as
provisioner, and the original's reclaimPolicy, volumeBindingMode, allowVolumeExpansion and
mountOptions. StorageClass parameters are immutable, so an existing twin is never rewritten.

The default-class annotation moves to the twin only when `move_default` is set (the controller's
--move-default-class): the twin is marked default first, then the original unmarked, and the twin
records it (migration.ballast.io/default-class-moved) so removal moves it back. Twins are removed
(once their plugin is rolled back) only when no PVC names them in spec.storageClassName.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from shim import TranslationError, Translator
from shim.migrate.events import WARNING, EventRecorder, Ref
from shim.migrate.kube import STORAGE_CLASSES, ApiError, KubeClient
from shim.migrate.metrics import Metrics
from shim.migrate.objects import MANAGED_BY, MANAGER, PREFIX, JsonObj, annotations_of, name_of

SUFFIX = "-csi"
ANN_TWIN_OF = PREFIX + "twin-of"
ANN_PLUGIN = PREFIX + "plugin"
ANN_DEFAULT_MOVED = PREFIX + "default-class-moved"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
PASSED_THROUGH = ("reclaimPolicy", "volumeBindingMode", "allowVolumeExpansion", "mountOptions")
MAX_NAME = 253


class TwinResult(NamedTuple):
    storage_class: str
    twin: str
    result: str  # done, noop, waiting, skipped, planned
    message: str


def twin_name(name: str) -> str:
    """The twin's name for StorageClass `name` (see the module docstring)."""
    plain = name + SUFFIX
    if len(plain) <= MAX_NAME:
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    tail = f"{SUFFIX}-{digest}"
    return name[: MAX_NAME - len(tail)].rstrip(".-") + tail


def is_twin(sc: JsonObj) -> bool:
    return (sc.get("metadata") or {}).get("labels", {}).get(MANAGED_BY) == MANAGER and bool(
        annotations_of(sc).get(ANN_TWIN_OF)
    )


def is_default(sc: JsonObj) -> bool:
    return annotations_of(sc).get(DEFAULT_CLASS) == "true"


def build_twin(translator: Translator, sc: JsonObj) -> JsonObj:
    """The twin of in-tree StorageClass `sc`; TranslationError when it cannot be translated."""
    plugin = str(sc["provisioner"])
    translated = translator.translate_in_tree_storage_class_to_csi(plugin, sc)
    labels = {**((sc.get("metadata") or {}).get("labels") or {}), MANAGED_BY: MANAGER}
    twin: JsonObj = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": twin_name(name_of(sc)),
            "labels": labels,
            "annotations": {ANN_TWIN_OF: name_of(sc), ANN_PLUGIN: plugin},
        },
        "provisioner": translator.get_csi_name_from_in_tree_name(plugin),
    }
    for key in ("parameters", "allowedTopologies"):
        if translated.get(key):
            twin[key] = translated[key]
    twin.update({key: sc[key] for key in PASSED_THROUGH if sc.get(key) is not None})
    return twin


class Twins:
    """Creates and removes twins (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        translator: Translator,
        events: EventRecorder,
        metrics: Metrics,
        move_default: bool,
    ) -> None:
        self._client = client
        self._translator = translator
        self._events = events
        self._metrics = metrics
        self._move_default = move_default

    def _get(self, name: str) -> JsonObj | None:
        return self._client.get_or_none(STORAGE_CLASSES, name)

    def desired(self, sc: JsonObj) -> JsonObj | TwinResult:
        """The twin `sc` should have, or why it has none (skipped: Event + metric)."""
        try:
            return build_twin(self._translator, sc)
        except TranslationError as exc:
            self._metrics.skips.labels("translation-failed").inc()
            message = f"no CSI twin: translation fails: {exc}"
            self._events.emit(
                Ref.of(sc, "storage.k8s.io/v1", "StorageClass"), WARNING, "MigrationSkipped", message
            )
            return TwinResult(name_of(sc), twin_name(name_of(sc)), "skipped", message)

    def ensure(self, sc: JsonObj) -> TwinResult:
        """Create the twin of in-tree StorageClass `sc` (and move the default mark when asked)."""
        twin = self.desired(sc)
        if isinstance(twin, TwinResult):
            return twin
        name, twin_of = twin["metadata"]["name"], name_of(sc)
        existing = self._get(name)
        if existing is None:
            try:
                existing = self._client.create(STORAGE_CLASSES, twin)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                existing = self._get(name) or twin
            result = "done"
        else:
            result = "noop"
        if annotations_of(existing).get(ANN_TWIN_OF) != twin_of or not is_twin(existing):
            self._metrics.skips.labels("twin-name-taken").inc()
            message = (
                f"no CSI twin: StorageClass {name} exists and is not its twin; rename it or the original"
            )
            self._events.emit(
                Ref.of(sc, "storage.k8s.io/v1", "StorageClass"), WARNING, "MigrationSkipped", message
            )
            return TwinResult(twin_of, name, "skipped", message)
        if self._move_default and is_default(sc):
            self._move(existing, sc)
            result = "done"
        return TwinResult(twin_of, name, result, f"twin {name} provisions with {twin['provisioner']}")

    def _move(self, twin: JsonObj, original: JsonObj) -> None:
        self._client.patch(
            STORAGE_CLASSES,
            name_of(twin),
            {"metadata": {"annotations": {DEFAULT_CLASS: "true", ANN_DEFAULT_MOVED: "true"}}},
        )
        self._client.patch(
            STORAGE_CLASSES, name_of(original), {"metadata": {"annotations": {DEFAULT_CLASS: "false"}}}
        )

    def remove(self, twin: JsonObj, claims: list[str]) -> TwinResult:
        """Delete our twin `twin` unless `claims` (PVCs naming it) is non-empty; default mark goes back."""
        name, original = name_of(twin), annotations_of(twin).get(ANN_TWIN_OF, "")
        if claims:
            message = f"twin kept while {len(claims)} claim(s) use it: {', '.join(claims[:5])}"
            self._events.emit(
                Ref.of(twin, "storage.k8s.io/v1", "StorageClass"), "Normal", "TwinInUse", message
            )
            return TwinResult(original, name, "waiting", message)
        moved = annotations_of(twin).get(ANN_DEFAULT_MOVED) == "true"
        if moved and not self._move_default:
            message = (
                "twin kept: it carries the default-class mark moved from its original; run with "
                "--move-default-class to move it back, or move it by hand"
            )
            self._events.emit(
                Ref.of(twin, "storage.k8s.io/v1", "StorageClass"), WARNING, "TwinIsDefault", message
            )
            return TwinResult(original, name, "waiting", message)
        if moved and self._get(original) is not None:
            self._client.patch(
                STORAGE_CLASSES, original, {"metadata": {"annotations": {DEFAULT_CLASS: "true"}}}
            )
        try:
            self._client.delete(STORAGE_CLASSES, name, preconditions={"uid": twin["metadata"]["uid"]})
        except ApiError as exc:
            if not exc.not_found:
                raise
        return TwinResult(original, name, "done", f"twin {name} removed")
