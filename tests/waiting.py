"""The tests wait through the tools' one polling helper (``respawn.waiting``); re-exported here so
that a test reads ``from tests.waiting import until`` like any other test support module.

The deadlines of :func:`until` and :func:`until_sync` (how long something that must happen may
take) are stretched by ``RESPAWN_TEST_PATIENCE``: by default 2 in a pytest-xdist worker, where
other workers' testbeds share the machine's cores, and 1 otherwise. What must *not* happen for a
while (:func:`holds`, :func:`holds_sync`) keeps its length.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from respawn import waiting
from respawn.waiting import WaitTimeout, holds, holds_sync

__all__ = ["PATIENCE", "WaitTimeout", "holds", "holds_sync", "until", "until_sync"]

T = TypeVar("T")


def _patience() -> float:
    given = os.environ.get("RESPAWN_TEST_PATIENCE")
    if given:
        return float(given)
    return 2.0 if os.environ.get("PYTEST_XDIST_WORKER") else 1.0


PATIENCE = _patience()


def _within(helper: Callable[..., Any]) -> float:
    default: float = inspect.signature(helper).parameters["within"].default
    return default


async def until(what: str, check: Any, *, within: float = _within(waiting.until), **kw: Any) -> Any:
    """:func:`respawn.waiting.until`, its deadline stretched by :data:`PATIENCE`."""
    return await waiting.until(what, check, within=within * PATIENCE, **kw)


def until_sync(
    what: str, check: Callable[[], T], *, within: float = _within(waiting.until_sync), **kw: Any
) -> T:
    """:func:`respawn.waiting.until_sync`, its deadline stretched by :data:`PATIENCE`."""
    return waiting.until_sync(what, check, within=within * PATIENCE, **kw)
