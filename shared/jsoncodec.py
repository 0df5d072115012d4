"""JSON on the hot paths: orjson, with the standard library behind it for what orjson refuses.

Every pod change is decoded by the watcher and by lifecycle's pod cache, and the watcher encodes
each one again (its fingerprint, what a replica keeps for a takeover): with :mod:`json` that was
the largest single item in both services' profiles. orjson decodes a pod in less than half the
time and encodes in a fraction of it (``python -m bench.watchpath``), but it differs on a few
things a user's object (an AppWrapper's template) may hold: integers wider than 64 bits (it would
read them as floats, losing digits), lone surrogates, nesting deeper than its fixed limits. Those
go to :mod:`json`, so every input is read and written as before, only faster in the common case.
A value always takes the same path, so the bytes it encodes to are stable (the watcher's
fingerprints rely on that).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["Kept", "dumps", "keep", "kept", "loads", "pack"]

# Every ASCII digit becomes "0" and every other byte a space: a run of 19 zeros in the result is
# a number orjson may not read exactly (64 bits hold 19 or 20 digits; it reads a wider integer
# as a float). Finding it this way (two passes in C) costs a fraction of the decode it guards.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_LONG_NUMBER = b"0" * 19


def loads(raw: bytes | str) -> Any:
    """:func:`json.loads`, faster: what orjson cannot read is read by :mod:`json`, which raises
    exactly what it always did (``ValueError``, ``RecursionError``)."""
    if isinstance(raw, str) or _long_number(raw):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _long_number(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of 19 or more digits (in a number or a string, either way)."""
    return _LONG_NUMBER in raw.translate(_DIGITS_ONLY)


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON (no spaces) as UTF-8 bytes; ``sort_keys`` for a canonical form (digests).

    What orjson cannot encode (a key that is not a string, an integer over 64 bits, nesting over
    its limit) is encoded by :mod:`json`, which raises what it always did (``TypeError``,
    ``ValueError``, ``RecursionError``)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError:
        # ASCII with escapes: a lone surrogate in a string stays readable by loads().
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":")).encode()


def pack(value: Any) -> bytes:
    """:func:`dumps` for bytes kept for long (the objects a cache or a takeover keeps): in a
    buffer of exactly their size. orjson hands back its working buffer, grown by doubling and
    never shrunk, so a kept object could occupy up to twice its length (8 KB for a 5.9 KB pod);
    a copy of a few microseconds makes it exact."""
    return bytes(memoryview(dumps(value)))


# An object as a cache keeps it for long: its compact JSON (:func:`pack`), or the object itself
# when it cannot be encoded (nested deeper than any encoder goes).
Kept = bytes | dict[str, Any]


def keep(obj: dict[str, Any]) -> Kept:
    """``obj`` as a cache keeps it: as Python objects a watch event's object takes several times
    the memory of its JSON, and caches keep thousands of them."""
    try:
        return pack(obj)
    except (TypeError, ValueError, RecursionError):
        return obj


def kept(value: Kept) -> dict[str, Any]:
    """The object :func:`keep` kept, an object of the caller's own (decoded afresh; a kept
    object is copied at its top level)."""
    if isinstance(value, bytes):
        decoded: dict[str, Any] = loads(value)
        return decoded
    return dict(value)
