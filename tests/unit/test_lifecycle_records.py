"""The announced record written a moment late: one write per burst of transitions, none for an
AppWrapper that went away, the newest marker, the incarnation it was owed for, retries, and a
flush when the process stops. The clock is passed in; the write is a recording stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from services.lifecycle.records import RETRIES, DeferredRecords
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION

KEY = ("team-a", "train")


def aw(uid: str = "uid-1") -> dict[str, Any]:
    return {"metadata": {"namespace": KEY[0], "name": KEY[1], "uid": uid}}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Writes:
    """Records every write; answers with ``results`` in turn (then True)."""

    def __init__(self, *results: bool | None) -> None:
        self.results = list(results)
        self.calls: list[tuple[dict[str, Any], dict[str, str | None]]] = []

    async def __call__(self, ref: Mapping[str, Any], annotations: Mapping[str, str | None]) -> bool | None:
        self.calls.append((dict(ref), dict(annotations)))
        return self.results.pop(0) if self.results else True


def make(writes: Writes, clock: Clock, delay: float = 5.0) -> DeferredRecords:
    return DeferredRecords(writes, delay=delay, clock=clock)


def test_a_record_is_written_only_once_its_delay_has_passed() -> None:
    clock, writes = Clock(), Writes()
    records = make(writes, clock)
    records.owe(KEY, aw(), "Running/0/a")
    assert asyncio.run(records.write_due()) == 0 and writes.calls == []
    clock.t += 4.9
    assert asyncio.run(records.write_due()) == 0
    clock.t += 0.1
    assert asyncio.run(records.write_due()) == 1
    assert writes.calls == [
        ({"namespace": "team-a", "name": "train", "uid": "uid-1"}, {ANNOUNCED_ANNOTATION: "Running/0/a"})
    ]
    assert len(records) == 0


def test_a_burst_of_transitions_is_one_write_of_the_newest_at_the_first_ones_time() -> None:
    clock, writes = Clock(), Writes()
    records = make(writes, clock)
    records.owe(KEY, aw(), "Suspended/0/a")
    clock.t += 3
    records.owe(KEY, aw(), "Resuming/0/b")
    clock.t += 1
    records.owe(KEY, aw(), "Running/0/c")
    assert records.marker(KEY, "uid-1") == "Running/0/c"
    clock.t += 1  # 5 s after the first, 1 s after the last: due (a busy one is not postponed)
    assert asyncio.run(records.write_due()) == 1
    assert [annotations for _, annotations in writes.calls] == [{ANNOUNCED_ANNOTATION: "Running/0/c"}]


def test_an_appwrapper_that_went_away_is_never_written() -> None:
    clock, writes = Clock(), Writes()
    records = make(writes, clock)
    records.owe(KEY, aw(), "Terminating/0/a")
    records.forget(KEY)
    clock.t += 60
    assert asyncio.run(records.write_due()) == 0 and writes.calls == []
    assert records.marker(KEY, "uid-1") is None


def test_what_is_owed_counts_only_for_the_incarnation_it_was_owed_for() -> None:
    clock, writes = Clock(), Writes()
    records = make(writes, clock)
    records.owe(KEY, aw("uid-1"), "Running/0/a")
    assert records.marker(KEY, "uid-2") is None
    # A new AppWrapper of the same name: its own record, at its own time.
    clock.t += 3
    records.owe(KEY, aw("uid-2"), "Suspended/0/b")
    clock.t += 2
    assert asyncio.run(records.write_due()) == 0
    clock.t += 3
    assert asyncio.run(records.write_due()) == 1
    assert writes.calls[0][0]["uid"] == "uid-2"


def test_a_record_superseded_by_a_write_that_went_at_once_is_not_written_again() -> None:
    clock, writes = Clock(), Writes()
    records = make(writes, clock)
    records.owe(KEY, aw(), "Running/0/a")
    records.taken(KEY)
    clock.t += 10
    assert asyncio.run(records.write_due()) == 0 and writes.calls == []


def test_a_failed_write_is_tried_again_after_the_delay_and_dropped_after_the_retries() -> None:
    clock, writes = Clock(), Writes(*([False] * (RETRIES + 1)))
    records = make(writes, clock)
    records.owe(KEY, aw(), "Running/0/a")
    for attempt in range(RETRIES + 1):
        clock.t += 5
        assert asyncio.run(records.write_due()) == 0
        assert len(writes.calls) == attempt + 1
        # Until dropped, it still counts as written for this process's passes.
        assert records.marker(KEY, "uid-1") == ("Running/0/a" if attempt < RETRIES else None)
    assert len(records) == 0


def test_a_gone_incarnation_drops_the_record_at_once() -> None:
    clock, writes = Clock(), Writes(None)
    records = make(writes, clock)
    records.owe(KEY, aw(), "Running/0/a")
    clock.t += 5
    assert asyncio.run(records.write_due()) == 0
    assert len(records) == 0 and len(writes.calls) == 1


def test_a_newer_record_owed_while_one_is_written_is_written_next() -> None:
    clock = Clock()
    records: DeferredRecords

    class Slow(Writes):
        async def __call__(
            self, ref: Mapping[str, Any], annotations: Mapping[str, str | None]
        ) -> bool | None:
            result = await super().__call__(ref, annotations)
            if len(self.calls) == 1:
                records.owe(KEY, aw(), "Running/1/b")  # a reset ended while the write was in flight
            return result

    writes = Slow()
    records = make(writes, clock)
    records.owe(KEY, aw(), "Running/0/a")
    clock.t += 5
    asyncio.run(records.write_due())
    assert records.marker(KEY, "uid-1") == "Running/1/b"
    asyncio.run(records.write_due())  # due at once
    assert [a[ANNOUNCED_ANNOTATION] for _, a in writes.calls] == ["Running/0/a", "Running/1/b"]
    assert len(records) == 0


def test_the_loop_writes_as_records_fall_due_and_flushes_the_rest_when_stopped() -> None:
    writes = Writes()

    async def scenario() -> None:
        records = DeferredRecords(writes, delay=0.05)
        loop = asyncio.create_task(records.run())
        records.owe(KEY, aw(), "Running/0/a")
        deadline = asyncio.get_running_loop().time() + 5
        while not writes.calls:
            assert asyncio.get_running_loop().time() < deadline, "never written"
            await asyncio.sleep(0.01)
        # One owed with a long delay is written when the loop is cancelled (the process stops).
        records.delay = 3600
        records.owe(
            ("team-b", "other"), {"metadata": {"namespace": "team-b", "name": "other"}}, "Suspended/0/x"
        )
        await asyncio.sleep(0.05)
        assert len(writes.calls) == 1
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
        assert [ref["name"] for ref, _ in writes.calls] == ["train", "other"]
        assert len(records) == 0

    asyncio.run(scenario())


def test_a_record_waits_for_the_reconcile_under_way_and_is_not_written_if_it_superseded_it() -> None:
    clock, writes = Clock(), Writes()
    lock = asyncio.Lock()

    async def scenario() -> None:
        records = DeferredRecords(writes, delay=5, clock=clock, lock=lambda key: lock)
        records.owe(KEY, aw(), "Running/0/a")
        clock.t += 5
        async with lock:  # a reconcile of the AppWrapper is under way
            write = asyncio.create_task(records.write_due())
            await asyncio.sleep(0.01)
            assert writes.calls == [], "written in the middle of a reconcile"
            records.taken(KEY)  # its own patch (a reset began) carried the newest record
        assert await write == 0
        assert writes.calls == []

    asyncio.run(scenario())
