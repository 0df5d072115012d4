"""Which asyncio event loop a service process runs on.

uvloop (libuv underneath) by default: the loop's own work — waking for sockets and timers,
reading the API server's TLS stream, writing to NATS — is done in C, which in the N = 100
benchmark shortened lifecycle's reaction tail (p99 about halved) for slightly less CPU
(bench/README.md). ``RESPAWN_EVENT_LOOP=asyncio`` runs the standard library's loop instead, for
a platform uvloop does not support or to rule the loop out when chasing a problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["EVENT_LOOPS", "EVENT_LOOP_ENV", "EventLoopError", "choose", "run"]

EVENT_LOOP_ENV = "RESPAWN_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")

T = TypeVar("T")


class EventLoopError(ValueError):
    """The variable names no event loop this process can run."""


def choose(env: Mapping[str, str]) -> str:
    """The event loop ``env`` asks for (pure): ``uvloop`` when unset or empty."""
    name = env.get(EVENT_LOOP_ENV, "").strip().lower() or EVENT_LOOPS[0]
    if name not in EVENT_LOOPS:
        allowed = " or ".join(EVENT_LOOPS)
        raise EventLoopError(f"{EVENT_LOOP_ENV}={env[EVENT_LOOP_ENV]!r} is not supported; use {allowed}")
    return name


def runner(name: str) -> Callable[[Coroutine[Any, Any, T]], T]:
    """``asyncio.run`` or ``uvloop.run``."""
    if name == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError as exc:  # a build without it: say so rather than fall back silently
        raise EventLoopError(f"uvloop is not installed ({exc}); set {EVENT_LOOP_ENV}=asyncio") from exc
    return uvloop.run


def run(main: Coroutine[Any, Any, T], env: Mapping[str, str]) -> T:
    """Run ``main`` to completion on the loop ``env`` chooses."""
    try:
        chosen = runner(choose(env))
    except EventLoopError:
        main.close()  # never awaited: close it, or Python warns about it at exit
        raise
    return chosen(main)
