"""The part of Go's net/url.Parse that EBS volume-ID normalisation depends on.

Only absolute URLs with an authority (`scheme://...`) are handled; the function returns the decoded path
or raises ValueError where Go's parser returns an error (control bytes, bad %-escapes, invalid host
characters, bad ports, invalid userinfo, malformed IP literals).
"""

from __future__ import annotations

import ipaddress
import string

from shim.fields import go_string

_HEX = set(string.hexdigits)
_HOST_OK = set(string.ascii_letters + string.digits + "!$&'()*+,;=:[]<>\"-_.~")
_USERINFO_OK = set(string.ascii_letters + string.digits + "-._:~!$&'()*+,;=%@")


def _unescape(text: str, *, host: bool = False) -> bytes:
    raw = text.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) < 2 or not all(chr(b) in _HEX for b in pair):
                raise ValueError(f"invalid URL escape {raw[i : i + 3]!r}")
            if host and int(chr(pair[0]), 16) < 8 and raw[i : i + 3] != b"%25":
                raise ValueError(f"invalid URL escape {raw[i : i + 3]!r}")
            out.append(int(pair.decode(), 16))
            i += 3
            continue
        if host and c < 0x80 and chr(c) not in _HOST_OK:
            raise ValueError(f"invalid character {chr(c)!r} in host name")
        out.append(c)
        i += 1
    return bytes(out)


def _valid_optional_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all("0" <= c <= "9" for c in port[1:]))


def _check_host(host: str) -> None:
    bracket = host.rfind("[")
    if bracket > 0:
        raise ValueError("invalid IP-literal")
    if bracket == 0:
        close = host.rfind("]")
        if close < 0:
            raise ValueError("missing ']' in host")
        if not _valid_optional_port(host[close + 1 :]):
            raise ValueError("invalid port after host")
        literal = host[1:close]
        zone_at = literal.find("%25")
        if zone_at >= 0:
            address = _unescape(literal[:zone_at], host=True).decode("utf-8", "replace")
            _unescape(literal[zone_at:])
        else:
            address = _unescape(literal, host=True).decode("utf-8", "replace")
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError as err:
            raise ValueError(f"invalid host: {err}") from err
        if parsed.version == 4:
            raise ValueError("invalid IP-literal")
        return
    if ":" in host and not _valid_optional_port(host[host.rfind(":") :]):
        raise ValueError("invalid port after host")
    _unescape(host, host=True)


def url_path(raw: str) -> str:
    """The percent-decoded path of `raw` (which must start with `<scheme>://`), as Go's url.Parse finds it."""
    before_fragment, _, fragment = raw.partition("#")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in before_fragment):
        raise ValueError("net/url: invalid control character in URL")
    rest = before_fragment.split(":", 1)[1]
    rest = rest.split("?", 1)[0]
    authority, slash, path = rest[2:].partition("/")
    at = authority.rfind("@")
    _check_host(authority[at + 1 :])
    if at >= 0:
        userinfo = authority[:at]
        if not all(c in _USERINFO_OK for c in userinfo):
            raise ValueError("net/url: invalid userinfo")
        for part in userinfo.split(":", 1):
            _unescape(part)
    decoded = go_string(_unescape(slash + path))
    if fragment:
        _unescape(fragment)
    return decoded
