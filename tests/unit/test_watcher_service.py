"""The watcher's handling of one object when publishing fails: what clears by itself is retried,
what never will is dead-lettered with the object's identity, and the next object goes on.
(The same against a real nats-server: tests/integration/test_watcher_isolation.py.)"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.watcher import service, translate
from shared.bus import Published
from shared.config import NatsConfig, OperatorConfig
from shared.messages import AppWrapperObservation, Message
from shared.runtime import Runtime

AW = AppWrapperObservation.KIND


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class FakeBus:
    """Fails the publishes of the names in ``failures`` with their exception, once each."""

    def __init__(self, failures: dict[str, BaseException]) -> None:
        self.failures = failures
        self.published: list[tuple[str, Message, float | None]] = []
        self.ids: list[str | None] = []
        self.dead: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None, ttl: float | None = None
    ) -> Published:
        name = message.ref.name  # type: ignore[attr-defined]  # every message here has a ref
        failure = self.failures.pop(name, None)
        if failure is not None:
            raise failure
        self.published.append((subject, message, ttl))
        self.ids.append(msg_id)
        return Published(stream="RESPAWN_OBSERVATIONS", seq=len(self.published), duplicate=False)

    async def dead_letter(self, subject: str, payload: dict[str, Any], **kw: Any) -> None:
        self.dead.append((subject, payload, kw))


def watcher(bus: FakeBus) -> service.Watcher:
    config = OperatorConfig(nats=NatsConfig(tombstoneTTL=timedelta(minutes=5)))
    rt = Runtime(name="watcher", config=config, bus=bus, kube=object(), probes=None)  # type: ignore[arg-type]
    return service.Watcher(rt)


def appwrapper(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "3"},
    }


async def handle(w: service.Watcher, name: str, *, deleted: bool = False) -> None:
    await w.handle(appwrapper(name), translate.appwrapper_observation, AW, deleted=deleted)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # The retry delay is the backoff's business; here only that a retry happens matters.
    monkeypatch.setattr(service.Backoff, "next", lambda self: 0.0)


# ------------------------------------------------------------------ the stream at its limit


def test_an_observation_below_the_first_sequence_or_past_the_last_is_discarded() -> None:
    seqs = {"a": 3, "b": 10, "c": 12, "d": 20}
    # "e" was never published (refused): nothing to restore.
    assert service.discarded(["a", "b", "c", "d", "e"], seqs, first=10, last=15) == {"a": 3, "d": 20}
    # An empty stream (first is one past last): every one of them is gone.
    assert service.discarded(["b", "c"], seqs, first=16, last=15) == {"b": 10, "c": 12}


async def test_a_discarded_observation_is_published_again_unchanged_with_an_id_of_its_own() -> None:
    bus = FakeBus({})
    w = watcher(bus)
    await handle(w, "a")
    await handle(w, "b")
    subject_a = bus.published[0][0]
    w.live["appwrappers"] = {subject_a, bus.published[1][0]}
    w.relists["appwrappers"] = relist = asyncio.Event()
    before = metric("respawn_watcher_observations_restored_total", kind=AW)

    # The stream now starts at 2: a's observation (sequence 1) is gone, b's is stored.
    assert w.restore_discarded(first=2, last=2, now=0.0) == 1
    assert relist.is_set() and w.publisher.restore == {subject_a: 1}

    await handle(w, "b")  # unchanged and stored: skipped as always
    await handle(w, "a")  # unchanged but discarded: published again
    assert [m.ref.name for _, m, _ in bus.published] == ["a", "b", "a"]  # type: ignore[attr-defined]
    assert bus.ids[2] == f"{bus.ids[0]}:restored:1"
    assert w.publisher.restore == {} and w.publisher.seqs[subject_a] == 3
    assert metric("respawn_watcher_observations_restored_total", kind=AW) == before + 1
    await handle(w, "a")  # and from then on skipped again while unchanged
    assert len(bus.published) == 3


def test_a_watch_lists_again_at_most_once_per_gap_which_grows_while_objects_keep_being_discarded() -> None:
    w = watcher(FakeBus({}))
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
    w = watcher(FakeBus({}))
    w.live["pods"] = {"p1"}
    w.publisher.seqs["p1"] = 1
    w.relists["pods"] = relist = asyncio.Event()
    assert w.restore_discarded(2, 5, now=0.0) == 1 and relist.is_set()
    relist.clear()
    assert w.restore_discarded(2, 5, now=1000.0) == 0 and not relist.is_set()
