"""The watcher's publisher keeps many observations in flight on a real NATS server, and still
stores the observations of each subject in the order they were submitted.

- Node observations of several subjects, submitted interleaved through a small window: never
  more in flight than the window, the window filled, and each subject's versions stored in
  order, the last one last.
- An observation that can never be published goes to its error handler; the ones around it are
  stored all the same.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from services.watcher import service, translate
from shared import subjects
from shared.bus import Bus, PermanentPublishError
from shared.config import OperatorConfig
from shared.messages import NodeObservation, decode
from shared.runtime import Runtime

pytestmark = pytest.mark.nats

WINDOW = 4


def publisher(bus: Bus) -> service.Publisher:
    rt = Runtime(name="watcher", config=OperatorConfig(), bus=bus, kube=None, probes=None)
    return service.Publisher(rt, window=WINDOW)


def node_version(name: str, version: int) -> translate.Prepared:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "resourceVersion": str(version), "labels": {"version": str(version)}}
    }
    prepared = translate.prepare(
        translate.node_observation,
        obj,
        observation_kind=NodeObservation.KIND,
        deleted=False,
        now=datetime.now(UTC),
    )
    assert isinstance(prepared, translate.Prepared)
    return prepared


@contextlib.asynccontextmanager
async def arrivals(bus: Bus, names: list[str]) -> AsyncIterator[dict[str, list[int]]]:
    """Per node, the versions of its observations in the order the server stored them (the
    stream keeps only the latest of a subject, so they are read as they arrive)."""
    wanted = {subjects.node_obs(name): name for name in names}
    found: dict[str, list[int]] = {name: [] for name in names}

    async def arrived(msg: Any) -> None:
        if msg.subject in wanted:
            found[wanted[msg.subject]].append(int(decode(NodeObservation, msg.data).resource_version))

    sub = await bus.nc.subscribe(subjects.node_obs_filter(), cb=arrived)
    await bus.nc.flush()
    try:
        yield found
        await bus.nc.flush()  # what was stored before this has been delivered
    finally:
        await sub.unsubscribe()


async def never_fails(exc: Exception) -> None:
    raise AssertionError(f"a publish failed: {exc!r}")


async def test_many_in_flight_and_each_subject_stored_in_order(bus: Bus) -> None:
    p = publisher(bus)
    names = [f"n-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    versions = 15
    most_in_flight = 0
    async with arrivals(bus, names) as stored:
        for version in range(1, versions + 1):
            for name in names:
                await p.submit(node_version(name, version), deleted=False, on_error=never_fails)
                most_in_flight = max(most_in_flight, len(p.inflight))
                assert len(p.inflight) <= WINDOW
        await p.drain()
    assert not p.inflight
    # Submitting did not wait for each acknowledgement in turn: the window filled.
    assert most_in_flight == WINDOW
    assert stored == {name: list(range(1, versions + 1)) for name in names}
    for name in names:
        assert p.last[subjects.node_obs(name)] == node_version(name, versions).fingerprint


async def test_an_observation_that_can_never_be_published_goes_to_its_handler_and_the_rest_are_stored(
    bus: Bus,
) -> None:
    p = publisher(bus)
    name = f"n-{uuid.uuid4().hex[:8]}"
    good = node_version(name, 1)
    bad = translate.Prepared(good.message, subjects.node_obs(name) + ". bad", "fp", f"bad-{name}")
    failures: list[Exception] = []

    async def record(exc: Exception) -> None:
        failures.append(exc)

    async with arrivals(bus, [name]) as stored:
        await p.submit(good, deleted=False, on_error=never_fails)
        await p.submit(bad, deleted=False, on_error=record)
        await p.submit(node_version(name, 2), deleted=False, on_error=never_fails)
        await p.drain()
    assert len(failures) == 1 and isinstance(failures[0], PermanentPublishError), failures
    assert stored == {name: [1, 2]}
