"""tests/waiting.py: what a test sees when it waits, whether the wait succeeds or not."""

from __future__ import annotations

import itertools
import time

import pytest

from respawn.waiting import holds, holds_sync, until, until_sync
from tests import waiting as tests_waiting


def counter() -> itertools.count[int]:
    return itertools.count(1)


async def test_until_returns_the_first_value_that_is_done() -> None:
    seen = counter()
    assert await until("three", lambda: next(seen), done=lambda n: n >= 3, every=0) == 3


async def test_until_awaits_a_coroutine_check() -> None:
    seen = counter()

    async def check() -> int:
        return next(seen)

    assert await until("two", check, done=lambda n: n == 2, every=0) == 2


async def test_until_times_out_naming_what_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the moon; last seen: \[\]"):
        await until("the moon", lambda: [], within=0.05, every=0.01)


def test_until_sync_times_out_naming_what_and_the_last_value_seen() -> None:
    seen = counter()
    with pytest.raises(AssertionError, match=r"waiting for a big number; last seen: \d+"):
        until_sync("a big number", lambda: next(seen), done=lambda n: n > 10**9, within=0.05, every=0.01)


def test_an_exception_in_the_check_fails_at_once_without_retrying() -> None:
    calls = counter()

    def check() -> bool:
        next(calls)
        raise AssertionError("invariant broken")

    started = time.monotonic()
    with pytest.raises(AssertionError, match="invariant broken"):
        until_sync("anything", check, within=10)
    assert next(calls) == 2 and time.monotonic() - started < 1


async def test_holds_returns_when_the_check_held_throughout() -> None:
    calls = counter()
    await holds("still true", lambda: next(calls), during=0.05, every=0.01)
    assert next(calls) > 2


async def test_holds_fails_as_soon_as_the_check_stops_holding() -> None:
    seen = counter()
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"below three stopped holding; seen: 3"):
        await holds("below three", lambda: next(seen), done=lambda n: n < 3, during=10, every=0)
    assert time.monotonic() - started < 1


def test_holds_sync_fails_as_soon_as_the_check_stops_holding() -> None:
    with pytest.raises(AssertionError, match=r"the pod stayed stopped holding; seen: False"):
        holds_sync("the pod stayed", lambda: False, during=10)


async def test_the_tests_deadlines_are_stretched_by_their_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tests_waiting, "PATIENCE", 3.0)
    with pytest.raises(AssertionError, match=r"timed out after 0\.15\d*s waiting for the sun"):
        await tests_waiting.until("the sun", lambda: [], within=0.05, every=0.01)
    with pytest.raises(AssertionError, match=r"timed out after 0\.15\d*s waiting for the stars"):
        tests_waiting.until_sync("the stars", lambda: [], within=0.05, every=0.01)
