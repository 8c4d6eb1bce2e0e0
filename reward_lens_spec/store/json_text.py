"""``json.dumps(obj, indent=2[, sort_keys=True])``'s exact text, made by one recursive function instead of the
standard library's generator chain (which it uses whenever ``indent`` is set: its C encoder is compact-only), so
a store document costs about half as much to serialise. A value the standard encoder would reject or treat
specially (any type besides dict, list, tuple, str, int, float, bool, None; a float or int subclass; a
non-string key other than int, float, bool or None) is handed to ``json.dumps`` itself: same text, same errors.
"""
from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as _str

_INF = float("inf")


class _Other(Exception):
    """A value this encoder leaves to ``json.dumps``."""


def dumps_indented(obj, *, sort_keys: bool = False) -> str:
    """``json.dumps(obj, indent=2, sort_keys=sort_keys)``."""
    out: list[str] = []
    try:
        _encode(obj, out, "\n", sort_keys, set())
    except (_Other, RecursionError):
        return json.dumps(obj, indent=2, sort_keys=sort_keys)
    return "".join(out)


def _float(o: float) -> str:
    if o != o:
        return "NaN"
    if o == _INF:
        return "Infinity"
    if o == -_INF:
        return "-Infinity"
    return float.__repr__(o)


def _key(k) -> str:
    t = type(k)
    if t is str:
        return k
    if t is bool:
        return "true" if k else "false"
    if t is int:
        return int.__repr__(k)
    if t is float:
        return _float(k)
    if k is None:
        return "null"
    raise _Other


def _encode(o, out: list, nl: str, sort_keys: bool, seen: set) -> None:
    t = type(o)
    if t is str:
        out.append(_str(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif t is int:
        out.append(int.__repr__(o))
    elif t is float:
        out.append(_float(o))
    elif t is dict:
        if not o:
            out.append("{}")
            return
        if id(o) in seen:
            raise _Other                              # json.dumps raises its own "Circular reference"
        seen.add(id(o))
        inner = nl + "  "
        items = sorted(o.items()) if sort_keys else o.items()
        first = True
        for k, v in items:
            out.append(("{" if first else ",") + inner + _str(_key(k)) + ": ")
            first = False
            _encode(v, out, inner, sort_keys, seen)
        out.append(nl + "}")
        seen.discard(id(o))
    elif t is list or t is tuple:
        if not o:
            out.append("[]")
            return
        if id(o) in seen:
            raise _Other
        seen.add(id(o))
        inner = nl + "  "
        first = True
        for v in o:
            out.append(("[" if first else ",") + inner)
            first = False
            _encode(v, out, inner, sort_keys, seen)
        out.append(nl + "]")
        seen.discard(id(o))
    else:
        raise _Other
