"""The services' event loop: uvloop unless RESPAWN_EVENT_LOOP says asyncio; anything else stops
the process at start with one line."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys

import pytest

from shared import eventloop


def test_uvloop_is_the_default() -> None:
    assert eventloop.choose({}) == "uvloop"
    assert eventloop.choose({"RESPAWN_EVENT_LOOP": ""}) == "uvloop"


@pytest.mark.parametrize("value", ["asyncio", "ASYNCIO", " asyncio "])
def test_asyncio_on_request(value: str) -> None:
    assert eventloop.choose({"RESPAWN_EVENT_LOOP": value}) == "asyncio"


def test_unknown_loop_is_refused_by_name() -> None:
    refused = r"RESPAWN_EVENT_LOOP='trio' is not supported; use uvloop or asyncio"
    with pytest.raises(eventloop.EventLoopError, match=refused):
        eventloop.choose({"RESPAWN_EVENT_LOOP": "trio"})


@pytest.mark.parametrize(("value", "loop_module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_run_uses_the_chosen_loop(value: str, loop_module: str) -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    assert eventloop.run(which(), {"RESPAWN_EVENT_LOOP": value}) == loop_module


def test_refused_coroutine_is_closed_not_leaked() -> None:
    async def never() -> None:  # pragma: no cover - must not run
        raise AssertionError("ran")

    coro = never()
    with pytest.raises(eventloop.EventLoopError):
        eventloop.run(coro, {"RESPAWN_EVENT_LOOP": "nope"})
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


def test_service_with_unknown_loop_exits_2_with_one_line() -> None:
    env = {**os.environ, "RESPAWN_EVENT_LOOP": "gevent"}
    done = subprocess.run(
        [sys.executable, "-m", "services.autopilot"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "autopilot: RESPAWN_EVENT_LOOP='gevent' is not supported; use uvloop or asyncio"
    ]
