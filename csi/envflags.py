"""Flags with an environment-variable fallback, checked exactly like the flag.

argparse runs `type` over a string default but never checks `choices`, and `action="append"` adds the
flag's values to a default list; so a plain environment-derived default slips past the flag's checks,
or mixes with the flag. Here such a flag's default is an `EnvDefault` marker instead. After parsing,
`EnvArgumentParser` replaces every marker the command line left in place (the flag was not given)
with the variable's value (an empty one counts as unset) or else the default, each run through the
flag's own `type` and `choices`. A bad variable exits 2 with a message naming the flag and the
variable; a given flag always wins, the variable is then not read at all.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any, NamedTuple, TypeVar, overload

_N = TypeVar("_N")


class EnvDefault(NamedTuple):
    """A flag's default: the variable `var`, else `default`, both spelled as on the command line.

    `separator` (append flags): the text holds several values, split on it; empty pieces are dropped.
    """

    var: str
    default: str
    separator: str = ""


class _Append(argparse._AppendAction):
    """action="append" whose first value replaces an EnvDefault rather than adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if isinstance(getattr(namespace, self.dest, None), EnvDefault):
            setattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)


class EnvArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that resolves EnvDefault markers; its subparsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "append", _Append)

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """argparse's parse, then every flag not given takes its variable or default (exit 2 if bad)."""
        parsed, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            fallback = getattr(parsed, action.dest, None)
            if isinstance(fallback, EnvDefault):
                setattr(parsed, action.dest, self._resolve(action, fallback))
        return parsed, rest

    def _resolve(self, action: argparse.Action, fallback: EnvDefault) -> Any:
        """The value of a flag not given: from its variable when set, else its default."""
        text = os.environ.get(fallback.var, "")
        try:
            return self._convert(action, fallback, text or fallback.default)
        except argparse.ArgumentError as exc:
            source = f"the environment variable {fallback.var}" if text else "its default"
            self.error(f"{exc} (from {source})")

    def _convert(self, action: argparse.Action, fallback: EnvDefault, text: str) -> Any:
        """`text` through the flag's type and choices, as argparse does for a value on the command line."""
        if not fallback.separator:
            return self._checked(action, text)
        return [self._checked(action, piece) for piece in text.split(fallback.separator) if piece]

    def _checked(self, action: argparse.Action, text: str) -> Any:
        value = self._get_value(action, text)
        self._check_value(action, value)
        return value
