"""The watcher's bookkeeping for a stream at its limit, with no servers: which objects lost their
latest observation, and when a watch is asked to list again. Publishing again what was
discarded, against real servers: tests/integration/test_watcher_isolation.py."""

from __future__ import annotations

import asyncio
from typing import Any

from services.watcher import service
from shared.config import OperatorConfig
from shared.runtime import Runtime


class Unused:
    """The bus or the Kubernetes client of a watcher whose test never reaches them: any use of
    one fails the test, so nothing here stands in for a server."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"this test's watcher must not use its {self.what} (it used .{name})")


def watcher() -> service.Watcher:
    rt = Runtime(
        name="watcher",
        config=OperatorConfig(),
        bus=Unused("bus"),  # type: ignore[arg-type]
        kube=Unused("Kubernetes client"),  # type: ignore[arg-type]
        probes=None,
    )
    return service.Watcher(rt)


def test_an_observation_below_the_first_sequence_or_past_the_last_is_discarded() -> None:
    seqs = {"a": 3, "b": 10, "c": 12, "d": 20}
    # "e" was never published (refused): nothing to restore.
    assert service.discarded(["a", "b", "c", "d", "e"], seqs, first=10, last=15) == {"a": 3, "d": 20}
    # An empty stream (first is one past last): every one of them is gone.
    assert service.discarded(["b", "c"], seqs, first=16, last=15) == {"b": 10, "c": 12}


def test_a_watch_lists_again_at_most_once_per_gap_which_grows_while_objects_keep_being_discarded() -> None:
    w = watcher()
    period = w.check_period
    w.live["pods"] = {"p1", "p2"}
    w.publisher.seqs.update({"p1": 1, "p2": 2})
    w.relists["pods"] = relist = asyncio.Event()

    def check(first: int, now: float) -> bool:
        """A check at ``now``; whether the watch was asked to list again (and then lists)."""
        relist.clear()
        w.restore_discarded(first, first + 10, now=now)
        asked = relist.is_set()
        w.relisting.discard("pods")  # its list is done before the next check
        return asked

    assert check(first=2, now=0.0)  # p1 lost: listed at once
    w.publisher.restore.clear()
    w.publisher.seqs["p1"] = 4  # restored, and p2 lost in turn
    assert not check(first=3, now=period / 2)  # too soon after the last list
    assert check(first=3, now=period)  # the gap, once the check period, has passed
    w.publisher.seqs["p2"] = 6
    w.publisher.seqs["p1"] = 1
    assert not check(first=3, now=2 * period)  # the gap is now twice the check period
    assert check(first=3, now=3 * period)
    # A check that finds nothing discarded starts the gaps over.
    w.publisher.seqs["p1"] = 5
    assert not check(first=3, now=4 * period)
    w.publisher.seqs["p1"] = 1
    assert check(first=3, now=4 * period)


def test_a_watch_is_not_asked_again_while_its_list_is_under_way() -> None:
    w = watcher()
    w.live["pods"] = {"p1"}
    w.publisher.seqs["p1"] = 1
    w.relists["pods"] = relist = asyncio.Event()
    assert w.restore_discarded(2, 5, now=0.0) == 1 and relist.is_set()
    relist.clear()
    assert w.restore_discarded(2, 5, now=1000.0) == 0 and not relist.is_set()
