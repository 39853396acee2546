"""Checked values of command-line flags: each function takes the flag's text and returns its value, or
raises argparse.ArgumentTypeError with a message naming what is expected (argparse adds the flag)."""

from __future__ import annotations

import argparse
import os
import re
import urllib.parse
from collections.abc import Callable

from csi.failures import InvalidParameterError
from csi.validation import check_string


def size(text: str) -> int:
    """Bytes from '10Gi', '512Mi', '1G', '1000'."""
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
    units.update({"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12})
    text = text.strip()
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], units[suffix]
            break
    else:
        number, factor = text, 1
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use bytes or a suffix like 10Gi)")
    return int(number) * factor


def positive(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


# Spec, GetPluginInfo: "domain name notation", at most 63 characters, alphanumeric at both ends, with
# dashes, dots and alphanumerics between.
DRIVER_NAME = re.compile(r"[A-Za-z0-9]([-.A-Za-z0-9]{0,61}[A-Za-z0-9])?")


def driver_name(text: str) -> str:
    if text and not DRIVER_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a CSI driver name: at most 63 characters, letters, digits, '-' and '.', "
            "beginning and ending with a letter or digit (e.g. ebs.csi.example.com)"
        )
    return text


def node_id(text: str) -> str:
    """A node id COs can send back: the spec's string limits (128 bytes, no control characters)."""
    try:
        check_string(text, "the node id")
    except InvalidParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def whole_number(highest: int) -> Callable[[str], int]:
    """The flag type of a whole number from 0 to `highest` (the range of the field it is sent in)."""

    def parse(text: str) -> int:
        if not text.isdigit() or int(text) > highest:
            raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {highest}, got {text!r}")
        return int(text)

    return parse


INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
# Kubernetes keeps a node's attach limit in CSINode's int32 `allocatable.count` (NodeGetInfo's is int64).
attach_limit = whole_number(INT32_MAX)


def endpoint(text: str) -> str:
    """unix:///absolute/path.sock, or tcp://<loopback host>:<port>."""
    if text.startswith("unix:///") and len(text) > len("unix:///"):
        return text
    if text.startswith("tcp://"):
        try:
            host, _ = parse_address(text[len("tcp://") :])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected tcp://127.0.0.1:<port 0-65535>, got {text!r}"
            ) from None
        if host in ("127.0.0.1", "localhost", "::1"):
            return text
        raise argparse.ArgumentTypeError(f"tcp endpoints must be loopback (127.0.0.1, ::1), got {text!r}")
    raise argparse.ArgumentTypeError(f"expected unix:///absolute/path/to/csi.sock, got {text!r}")


def endpoint_or_default(text: str) -> str:
    """An endpoint as `endpoint` checks it, or "" for a subcommand's "the main --endpoint"."""
    return endpoint(text) if text else text


def parse_address(address: str) -> tuple[str, int]:
    """'host:port', '[v6]:port' or ':port' (all interfaces) -> (host, port); anything else -> ValueError."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port or :port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def listen_address(text: str) -> str:
    if text:
        try:
            parse_address(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


# botocore's own check of a region name (a DNS label), made when the flag is read rather than at start-up.
AWS_REGION = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def aws_region(text: str) -> str:
    if text and not AWS_REGION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an AWS region name (e.g. us-east-1)")
    return text


def url(text: str) -> str:
    """An http:// or https:// URL with a host ("" allowed: not set)."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {exc}") from None
    if text and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL with a host, got {text!r}")
    return text


def seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def batch_window(text: str) -> float:
    value = float(text) if text.replace(".", "", 1).isdigit() else -1.0
    if not 0 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"must be seconds from 0 to 0.5, got {text!r}")
    return value


def key_values(text: str) -> dict[str, str]:
    """`key=value,key2=value2` (white space around keys and values dropped); "" -> {}."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value[,key=value...], got {item!r}")
        if key in out:
            raise argparse.ArgumentTypeError(f"{key!r} is given twice")
        out[key] = value.strip()
    return out


def block_size(text: str) -> int:
    value = size(text)
    if value and (value & (value - 1) or not 4096 <= value <= 1024**2):
        raise argparse.ArgumentTypeError(f"must be a power of two from 4Ki to 1Mi (or 0), got {text!r}")
    return value


# A Kubernetes label value, as topology segment values are labels on the node: at most 63 characters,
# alphanumeric at both ends, with '-', '_', '.' and alphanumerics between.
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def label_value(text: str) -> str:
    """A topology value: a Kubernetes label value ('' allowed; a required one is checked by the caller)."""
    if not LABEL_VALUE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Kubernetes label value: at most 63 characters, letters, digits, '-', '_' "
            "and '.', beginning and ending with a letter or digit"
        )
    return text


def zone(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return label_value(text)


def absolute(path: str) -> str:
    if not os.path.isabs(path) or os.path.normpath(path) != path.rstrip("/") or ".." in path.split("/"):
        raise argparse.ArgumentTypeError(f"must be an absolute, normalised path, got {path!r}")
    return path
