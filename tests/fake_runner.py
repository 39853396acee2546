"""The one shared fake command runner for csi.mount.Mounter.

FakeRunner records every argv it is asked to run (`calls`) and answers from scripted rules: the first
rule whose argv prefix matches wins; an unmatched command succeeds with empty output. Tests assert on
`calls` (what would have run) and steer failures through `on(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from csi.mount import Result


@dataclass
class Rule:
    prefix: tuple[str, ...]
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    times: int = -1  # -1: forever
    effect: Callable[[Sequence[str]], None] | None = None


@dataclass
class FakeRunner:
    rules: list[Rule] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def on(
        self,
        *prefix: str,
        returncode: int = 0,
        stdout: str = "",
        stderr: str = "",
        times: int = -1,
        effect: Callable[[Sequence[str]], None] | None = None,
    ) -> FakeRunner:
        """Answer commands starting with `prefix`; `effect(argv)` runs first (e.g. to write a file)."""
        self.rules.append(Rule(tuple(prefix), returncode, stdout, stderr, times, effect))
        return self

    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result:
        argv = tuple(argv)
        assert all(isinstance(a, str) for a in argv), f"argv must be a list of strings: {argv!r}"
        self.calls.append(argv)
        for rule in self.rules:
            if argv[: len(rule.prefix)] == rule.prefix and rule.times != 0:
                if rule.times > 0:
                    rule.times -= 1
                if rule.effect is not None:
                    rule.effect(argv)
                return Result(argv, rule.returncode, rule.stdout, rule.stderr)
        return Result(argv, 0)

    def programs(self) -> list[str]:
        """Program names in call order."""
        return [c[0] for c in self.calls]

    def ran(self, *prefix: str) -> bool:
        return any(c[: len(prefix)] == prefix for c in self.calls)
