"""Copies of the JSON-decoded trees lifecycle works on (an AppWrapper's status, its conditions,
its component entries), taken on every pass so that a decision never changes what the caches hold.

Not :func:`services.lifecycle.templating.copy_tree`: that one walks without recursion and bounds
the depth, for templates a user may nest far deeper than Python's recursion limit, and is slower
than :func:`copy.deepcopy` for it; the trees copied here are lifecycle's own status structures,
a few levels deep, copied many times a second.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["copy_json"]

# Values a copy may share with the original: nothing can change them in place.
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A deep copy of a tree of dicts and lists such as JSON decodes to, several times faster
    than :func:`copy.deepcopy` (which looks up how to copy each value by its type and records
    every one it copied, for objects that refer to themselves; JSON never does). Anything else
    in the tree (a tuple, a datetime) is copied by :func:`copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)
