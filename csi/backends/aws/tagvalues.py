"""`tagSpecification_<n>` tag values as Go text/template strings, rendered as the EBS CSI driver renders
them, over the metadata the Kubernetes sidecars pass with --extra-create-metadata (the chart runs both
the provisioner and the snapshotter so): VOLUME_FIELDS for StorageClass tags, SNAPSHOT_FIELDS for
VolumeSnapshotClass tags.

A value is text with actions between `{{` and `}}`. An action is a pipeline: commands joined by `|`,
each command's value passed as the last argument of the next. A command is one operand -- a field
(`.PVCName`), a string ("..." or `...`), a whole number, true or false, a parenthesised pipeline -- or
a function applied to operands. The functions are the EBS driver's (offsets count bytes, as in Go):

    contains SUB S        whether S contains SUB: true or false
    field DELIM N S       piece N (from 0) of S split at DELIM
    substring I J S       bytes I..J of S; I < 0: from the start; J < 0 or past the end: to the end
    index SUB S           offset of the first SUB in S, or -1 (lastIndex: of the last)
    toUpper S, toLower S

`{{/* ... */}}` renders nothing; `{{- ` and ` -}}` trim the white space beside an action, as in Go.
parse() checks a value before any volume exists: an unknown field or function, a wrong argument count
or type, or an action Go has and this subset lacks (if, range, with, variables, Go's own functions)
-> InvalidParameterError naming the parameter, so a template is never written to a tag as text.
Template.render() fails the same way where only the data can be wrong (field N past the last piece,
substring out of range). A field whose metadata the sidecar did not pass is the empty string, as the
EBS driver renders it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from csi import keys
from csi.failures import InvalidParameterError

# field name -> the key the sidecar passes its value under
VOLUME_FIELDS = {"PVCNamespace": keys.PVC_NAMESPACE, "PVCName": keys.PVC_NAME, "PVName": keys.PV_NAME}
SNAPSHOT_FIELDS = {
    "VolumeSnapshotNamespace": keys.VOLUMESNAPSHOT_NAMESPACE,
    "VolumeSnapshotName": keys.VOLUMESNAPSHOT_NAME,
    "VolumeSnapshotContentName": keys.VOLUMESNAPSHOT_CONTENT_NAME,
}

Value = str | int | bool
Metadata = Mapping[str, str]
_SPACE = " \t\r\n"  # Go's trim markers and the white space they trim
_CONTROL = {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue", "nil"}


class _Refused(Exception):
    """What is wrong with a value, before the parameter's name is put in front."""


class _Node(NamedTuple):
    kind: type  # str, int or bool: checked when parsed
    value: Callable[[Metadata], Value]


class _Function(NamedTuple):
    params: tuple[type, ...]
    returns: type
    call: Callable[..., Value]


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise _Refused(f"{what} cuts a character in two") from None


def _substring(start: int, end: int, text: str) -> str:
    data = text.encode()
    if start < 0:
        lo, hi = 0, end
    elif end < 0 or end > len(data):
        lo, hi = start, len(data)
    else:
        lo, hi = start, end
    if not 0 <= lo <= hi <= len(data):
        raise _Refused(f"substring {start} {end} is out of range for {text!r} ({len(data)} bytes)")
    return _utf8(data[lo:hi], f"substring {start} {end} of {text!r}")


def _field(delim: str, n: int, text: str) -> str:
    pieces = list(text) if delim == "" else text.split(delim)
    if not 0 <= n < len(pieces):
        raise _Refused(f"field {delim!r} {n}: {text!r} has {len(pieces)} piece(s)")
    return pieces[n]


def _case(text: str, upper: bool) -> str:
    """Go's per-character mapping: a character whose other case is several characters stays."""
    mapped = ((c, c.upper() if upper else c.lower()) for c in text)
    return "".join(m if len(m) == 1 else c for c, m in mapped)


FUNCTIONS: dict[str, _Function] = {
    "contains": _Function((str, str), bool, lambda sub, s: sub in s),
    "field": _Function((str, int, str), str, _field),
    "substring": _Function((int, int, str), str, _substring),
    "index": _Function((str, str), int, lambda sub, s: s.encode().find(sub.encode())),
    "lastIndex": _Function((str, str), int, lambda sub, s: s.encode().rfind(sub.encode())),
    "toUpper": _Function((str,), str, lambda s: _case(s, True)),
    "toLower": _Function((str,), str, lambda s: _case(s, False)),
}
_TYPE_NAMES = {str: "string", int: "number", bool: "true/false"}

_TOKEN = re.compile(
    r"""(?P<space>\s+)|(?P<close>\}\})|(?P<trim>-\}\})
    |(?P<string>"(?:[^"\\\n]|\\.)*")|(?P<raw>`[^`]*`)
    |(?P<number>[+-]?(?:0[xXoObB][0-9a-fA-F_]+|[0-9][0-9_]*)(?![\w.]))
    |(?P<field>(?:\.[A-Za-z_]\w*)+)|(?P<word>[A-Za-z_]\w*)|(?P<punct>[|()])
    |(?P<variable>\$)|(?P<fraction>[+-]?[0-9][\w.]*)|(?P<character>')""",
    re.X,
)
_LACKING = {  # tokens of Go's templates this subset refuses, and why
    "variable": "variables are not supported",
    "fraction": "numbers must be whole",
    "character": "character constants are not supported",
}
_ESCAPE = re.compile(
    r"\\(?:([abfnrtv\\\"])|x([0-9a-fA-F]{2})|([0-7]{3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.?))", re.S
)
_SIMPLE_ESCAPES = dict(zip('abfnrtv\\"', '\a\b\f\n\r\t\v\\"', strict=True))


def _unquote(literal: str) -> str:
    """A Go interpreted string literal's value."""
    out, pos, body = bytearray(), 0, literal[1:-1]
    for escape in _ESCAPE.finditer(body):
        simple, hex2, octal, u4, u8, unknown = escape.groups()
        out += body[pos : escape.start()].encode()
        if unknown is not None:
            raise _Refused(f"{literal} has an escape Go does not know: {escape.group()!r}")
        if simple:
            out += _SIMPLE_ESCAPES[simple].encode()
        elif hex2 or octal:
            out.append(int(hex2, 16) if hex2 else int(octal, 8) & 0xFF)
        else:
            out += chr(int(u4 or u8, 16)).encode("utf-8", "surrogatepass")
        pos = escape.end()
    return _utf8(bytes(out) + body[pos:].encode(), literal)


def _number(literal: str) -> int:
    """A Go integer literal's value: 0x.., 0o.. or 0.. (octal), 0b.., or decimal."""
    digits = literal.lstrip("+-").lower()
    base = {"0x": 16, "0o": 8, "0b": 2}.get(digits[:2], 8 if len(digits) > 1 and digits[0] == "0" else 10)
    try:
        return int(literal, base)
    except ValueError:
        raise _Refused(f"{literal} is not a number") from None


class _Tokens:
    """One action's tokens, from just after `{{` (and its trim marker) to its `}}`: `end` is where the
    text after it starts, `trim_after` whether it ends with ` -}}`."""

    end: int
    trim_after: bool

    def __init__(self, value: str, pos: int) -> None:
        self.items: list[tuple[str, str]] = []
        after_space = False
        while True:
            found = _TOKEN.match(value, pos)
            if found is None:
                what = repr(value[pos]) if pos < len(value) else "the end"
                closing = "" if pos < len(value) else ": '{{' is never closed by '}}'"
                raise _Refused(f"unexpected {what} in an action{closing}")
            kind, text, pos = found.lastgroup or "", found.group(), found.end()
            if kind in _LACKING:
                raise _Refused(_LACKING[kind])
            if kind == "trim" and not after_space:
                raise _Refused("'-}}' needs a space before it to trim")
            if kind in ("close", "trim"):
                self.end, self.trim_after = pos, kind == "trim"
                self.items.append(("end", text))
                return
            after_space = kind == "space"
            if not after_space:
                self.items.append((kind, text))

    def peek(self) -> tuple[str, str]:
        return self.items[0]

    def take(self) -> tuple[str, str]:
        return self.items.pop(0)


@dataclass(frozen=True)
class _Parser:
    fields: Mapping[str, str]

    def pipeline(self, tokens: _Tokens) -> _Node:
        """Commands joined by `|`, up to `}}` or `)` (left for the caller)."""
        node = self.command(tokens, None)
        while tokens.peek()[0] == "punct" and tokens.peek()[1] == "|":
            tokens.take()
            node = self.command(tokens, node)
        return node

    def command(self, tokens: _Tokens, piped: _Node | None) -> _Node:
        kind, text = tokens.peek()
        if kind == "word" and text in FUNCTIONS:
            tokens.take()
            args = []
            while tokens.peek()[0] not in ("end", "punct") or tokens.peek()[1] == "(":
                args.append(self.operand(tokens))
            return _apply(text, FUNCTIONS[text], [*args, *([piped] if piped else [])])
        node = self.operand(tokens)
        if piped is not None:
            raise _Refused(f"{text} after '|' is not a function")
        if tokens.peek()[0] not in ("end", "punct") or tokens.peek()[1] == "(":
            raise _Refused(f"{text} is not a function and takes no arguments")
        return node

    def operand(self, tokens: _Tokens) -> _Node:
        kind, text = tokens.take()
        if kind == "field":
            return self.field(text)
        if kind in ("string", "raw"):
            constant = _unquote(text) if kind == "string" else text[1:-1]
            return _Node(str, lambda _m: constant)
        if kind == "number":
            number = _number(text)
            return _Node(int, lambda _m: number)
        if kind == "word" and text in ("true", "false"):
            return _Node(bool, lambda _m: text == "true")
        if (kind, text) == ("punct", "("):
            node = self.pipeline(tokens)
            if tokens.take() != ("punct", ")"):
                raise _Refused("'(' is never closed by ')'")
            return node
        if kind == "word":
            return _unsupported_word(text)
        raise _Refused(f"unexpected {text!r}")

    def field(self, text: str) -> _Node:
        name = text[1:]
        if name not in self.fields:
            named = ", ".join("." + f for f in self.fields)
            raise _Refused(f"there is no field {text}; the fields here are {named}")
        key = self.fields[name]
        return _Node(str, lambda metadata: metadata.get(key, ""))


def _apply(name: str, function: _Function, args: list[_Node]) -> _Node:
    if len(args) != len(function.params):
        raise _Refused(f"{name} takes {len(function.params)} argument(s), got {len(args)}")
    for n, (arg, wanted) in enumerate(zip(args, function.params, strict=True), 1):
        if arg.kind is not wanted:
            raise _Refused(
                f"argument {n} of {name} must be a {_TYPE_NAMES[wanted]}, not a {_TYPE_NAMES[arg.kind]}"
            )
    return _Node(function.returns, lambda m: function.call(*(a.value(m) for a in args)))


def _unsupported_word(word: str) -> _Node:
    if word in _CONTROL:
        raise _Refused(f"{word!r} is not supported in a tag value (no control actions)")
    raise _Refused(f"function {word!r} is not supported; the functions are {', '.join(sorted(FUNCTIONS))}")


def _text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


Part = str | _Node


@dataclass(frozen=True)
class Template:
    """A parsed tag value: render() it with the sidecar's metadata."""

    key: str
    parts: tuple[Part, ...]

    def render(self, metadata: Metadata) -> str:
        try:
            return "".join(p if isinstance(p, str) else _text(p.value(metadata)) for p in self.parts)
        except _Refused as refused:
            raise InvalidParameterError(f"parameter {self.key}: {refused}") from None


def parse(key: str, value: str, fields: Mapping[str, str]) -> Template:
    """`value` checked and parsed; anything it cannot render -> InvalidParameterError naming `key`."""
    try:
        return Template(key, tuple(_parts(value, _Parser(fields))))
    except _Refused as refused:
        raise InvalidParameterError(f"parameter {key}: {refused} in {value!r}") from None


def _parts(value: str, parser: _Parser) -> list[Part]:
    parts: list[Part] = []
    pos = 0
    while (start := value.find("{{", pos)) >= 0:
        text, inner = value[pos:start], start + 2
        if value[inner : inner + 1] == "-" and value[inner + 1 : inner + 2] in tuple(_SPACE):
            text, inner = text.rstrip(_SPACE), inner + 2
        parts.append(text)
        if value.startswith("/*", inner):
            pos = _comment_end(value, inner)
            continue
        tokens = _Tokens(value, inner)
        if tokens.peek()[0] == "end":
            raise _Refused("an action is empty")
        parts.append(parser.pipeline(tokens))
        if tokens.peek()[0] != "end":
            raise _Refused(f"unexpected {tokens.peek()[1]!r}")
        pos = tokens.end
        if tokens.trim_after:
            pos = len(value) - len(value[pos:].lstrip(_SPACE))
    parts.append(value[pos:])
    return [p for p in parts if p != ""]


def _comment_end(value: str, start: int) -> int:
    """Where the text after the comment action starting at `start` (its `/*`) resumes."""
    close = value.find("*/", start + 2)
    if close < 0:
        raise _Refused("'/*' is never closed by '*/'")
    rest = close + 2
    if value.startswith("}}", rest):
        return rest + 2
    if value[rest : rest + 1] in tuple(_SPACE) and value.startswith("-}}", rest + 1):
        after = rest + 4
        return len(value) - len(value[after:].lstrip(_SPACE))
    raise _Refused("a comment must end with '*/}}'")
