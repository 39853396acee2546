"""Feature gates for in-tree -> CSI migration, parsed like Kubernetes' `--feature-gates` flag.

Contract:
- `FeatureGates` is immutable; `with_overrides` returns a new object (later settings win).
- Only the gates in `GATES` exist; an unknown name or a value that is not a Go boolean raises
  `FeatureGateError` naming the offending entry.
- Ballast's defaults are all off (opt-in); nothing is locked in Ballast. `GATES` also records how each
  gate ended up in Kubernetes (stage, whether it was locked to true), for documentation only.
- Migration of a plugin is *enabled* when `CSIMigration` and the plugin's `CSIMigration<X>` gate are on,
  and *complete* when, in addition, its `InTreePlugin<X>Unregister` gate is on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

from shim.plugins.registry import PLUGINS

UMBRELLA_GATE = "CSIMigration"

GateRole = Literal["umbrella", "migration", "unregister"]


class FeatureGateError(ValueError):
    """A `--feature-gates` value, gate name or plugin name that cannot be accepted."""


class GateSpec(NamedTuple):
    """One known gate: its Ballast default and, for the docs, its fate in Kubernetes."""

    name: str
    role: GateRole
    plugin: str | None  # in-tree plugin name; None for the umbrella gate
    default: bool  # Ballast's default (always False: migration is opt-in)
    kubernetes_stage: Literal["GA", "alpha"]  # the last stage the gate reached in Kubernetes
    kubernetes_locked: bool  # True when Kubernetes locked it to true (GA, cannot be turned off)
    kubernetes_history: str


class PluginGates(NamedTuple):
    """The two per-plugin gates of one in-tree plugin."""

    plugin: str
    migration: str
    unregister: str


# In-tree plugin name -> its gates, from the plugin registry (suffixes are Kubernetes' exact spellings).
PLUGIN_GATES: Mapping[str, PluginGates] = MappingProxyType(
    {
        p.in_tree_name: PluginGates(
            p.in_tree_name, f"CSIMigration{p.gate_suffix}", f"InTreePlugin{p.gate_suffix}Unregister"
        )
        for p in PLUGINS
    }
)
UMBRELLA_HISTORY = "alpha 1.14, beta (on) 1.17, GA 1.25 locked to true; removed after 1.26"


def _build_specs() -> tuple[GateSpec, ...]:
    """The umbrella gate, then each plugin's migration gate, then each plugin's Unregister gate."""
    specs = [GateSpec(UMBRELLA_GATE, "umbrella", None, False, "GA", True, UMBRELLA_HISTORY)]
    for p in PLUGINS:
        migration = PLUGIN_GATES[p.in_tree_name].migration
        specs.append(GateSpec(migration, "migration", p.in_tree_name, False, "GA", True, p.migration_history))
    for p in PLUGINS:
        unregister = PLUGIN_GATES[p.in_tree_name].unregister
        specs.append(
            GateSpec(unregister, "unregister", p.in_tree_name, False, "alpha", False, p.unregister_history)
        )
    return tuple(specs)


GATES: tuple[GateSpec, ...] = _build_specs()
GATES_BY_NAME: Mapping[str, GateSpec] = MappingProxyType({g.name: g for g in GATES})

# Go's strconv.ParseBool, which Kubernetes uses for gate values.
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})


def parse_bool(value: str) -> bool:
    """Go `strconv.ParseBool`; anything else raises FeatureGateError."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise FeatureGateError(f"invalid boolean {value!r} (use true or false)")


def _check_name(name: str) -> None:
    if name in GATES_BY_NAME:
        return
    import difflib  # only on this error path: it is slow to import

    message = f"unrecognized feature gate {name!r}"
    close = difflib.get_close_matches(name, GATES_BY_NAME, n=1, cutoff=0.8)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    raise FeatureGateError(message)


def parse_feature_gates(text: str) -> dict[str, bool]:
    """Parse `A=true,B=false` into an ordered dict; later entries win, an empty item (nothing between
    two commas) is skipped, as Kubernetes does.

    Whitespace around names and values is ignored. Raises FeatureGateError for an item without `=`
    (white space alone included, which Kubernetes refuses too), an unknown gate or a non-boolean value,
    naming the item.
    """
    result: dict[str, bool] = {}
    for raw in text.split(","):
        if not raw:
            continue
        item = raw.strip()
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise FeatureGateError(f"malformed feature gate {item!r}: expected Name=true or Name=false")
        _check_name(name)
        try:
            result[name] = parse_bool(value)
        except FeatureGateError as exc:
            raise FeatureGateError(f"feature gate {name}: {exc}") from None
    return result


class FeatureGates(Mapping[str, bool]):
    """Effective gate values: Ballast defaults overlaid with explicit settings.

    Acts as a read-only mapping of every known gate to its effective value.
    """

    __slots__ = ("_explicit",)

    def __init__(self, overrides: Mapping[str, bool] | None = None) -> None:
        explicit: dict[str, bool] = {}
        for name, value in (overrides or {}).items():
            _check_name(name)
            if not isinstance(value, bool):
                raise FeatureGateError(f"feature gate {name}: value must be a boolean, got {value!r}")
            explicit[name] = value
        self._explicit: Mapping[str, bool] = MappingProxyType(explicit)

    @classmethod
    def parse(cls, text: str) -> FeatureGates:
        """Gates from a `--feature-gates` string (see `parse_feature_gates`); "" gives the defaults."""
        return cls(parse_feature_gates(text))

    def with_overrides(self, overrides: Mapping[str, bool] | str) -> FeatureGates:
        """A new FeatureGates with `overrides` (a mapping or flag string) applied on top of this one."""
        extra = parse_feature_gates(overrides) if isinstance(overrides, str) else dict(overrides)
        return FeatureGates({**self._explicit, **extra})

    @property
    def explicit(self) -> Mapping[str, bool]:
        """Only the gates that were set explicitly, in the order they were first set."""
        return self._explicit

    def enabled(self, name: str) -> bool:
        """Effective value of gate `name`; an unknown name raises FeatureGateError."""
        _check_name(name)
        return self._explicit.get(name, GATES_BY_NAME[name].default)

    def __getitem__(self, name: str) -> bool:
        if name not in GATES_BY_NAME:
            raise KeyError(name)
        return self.enabled(name)

    def __iter__(self) -> Iterator[str]:
        return iter(GATES_BY_NAME)

    def __len__(self) -> int:
        return len(GATES_BY_NAME)

    def is_migration_enabled(self, in_tree_plugin_name: str) -> bool:
        """True when CSIMigration and the plugin's CSIMigration<X> gate are on.

        A name that is not one of the seven migratable in-tree plugins gives False (as in Kubernetes).
        """
        gates = PLUGIN_GATES.get(in_tree_plugin_name)
        if gates is None:
            return False
        return self.enabled(UMBRELLA_GATE) and self.enabled(gates.migration)

    def is_plugin_unregistered(self, in_tree_plugin_name: str) -> bool:
        """True when the plugin's InTreePlugin<X>Unregister gate is on (the legacy path is gone)."""
        gates = PLUGIN_GATES.get(in_tree_plugin_name)
        return gates is not None and self.enabled(gates.unregister)

    def is_migration_complete(self, in_tree_plugin_name: str) -> bool:
        """True when migration is enabled for the plugin and its Unregister gate is on too."""
        return self.is_migration_enabled(in_tree_plugin_name) and self.is_plugin_unregistered(
            in_tree_plugin_name
        )

    def __str__(self) -> str:
        """The explicit settings in `--feature-gates` syntax; parsing it gives an equal object."""
        return ",".join(f"{name}={'true' if value else 'false'}" for name, value in self._explicit.items())

    def __repr__(self) -> str:
        return f"FeatureGates.parse({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        """Equal when every effective value is equal (explicitly setting a default changes nothing)."""
        if not isinstance(other, FeatureGates):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(self.items()))
