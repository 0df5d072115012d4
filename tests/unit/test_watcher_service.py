"""The watcher's handling of one object when publishing fails: what clears by itself is retried,
what never will is dead-lettered with the object's identity, and the next object goes on.
(The same against a real nats-server: tests/integration/test_watcher_isolation.py.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.watcher import service, translate
from shared.bus import PermanentPublishError
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
        self.dead: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    async def publish(
        self, subject: str, message: Message, *, msg_id: str | None, ttl: float | None = None
    ) -> None:
        name = message.ref.name  # type: ignore[attr-defined]  # every message here has a ref
        failure = self.failures.pop(name, None)
        if failure is not None:
            raise failure
        self.published.append((subject, message, ttl))

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


async def test_a_transient_failure_is_retried_until_the_object_is_published() -> None:
    bus = FakeBus({"a": TimeoutError("nats: timeout")})
    w = watcher(bus)
    await handle(w, "a")
    assert [m.ref.name for _, m, _ in bus.published] == ["a"]  # type: ignore[attr-defined]
    assert bus.dead == []


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (PermanentPublishError("permission", "s", "the server refused it"), "permission"),
        (ValueError("a bug"), "unexpected"),
    ],
)
async def test_a_failure_no_retry_can_clear_is_dead_lettered_and_the_next_object_goes_on(
    failure: BaseException, reason: str
) -> None:
    bus = FakeBus({"bad": failure})
    w = watcher(bus)
    before = metric("respawn_watcher_objects_failed_total", kind=AW, reason=reason)
    await handle(w, "bad")
    await handle(w, "good")
    assert [m.ref.name for _, m, _ in bus.published] == ["good"]  # type: ignore[attr-defined]
    [(subject, summary, kw)] = bus.dead
    assert subject == translate.subject_for(
        translate.appwrapper_observation(appwrapper("bad"), deleted=False, now=service.now())
    )
    assert summary["name"] == "bad" and summary["uid"] == "uid-bad" and summary["reason"] == reason
    assert (kw["reason"], kw["name"], kw["uid"], kw["resource_version"]) == (reason, "bad", "uid-bad", "3")
    assert metric("respawn_watcher_objects_failed_total", kind=AW, reason=reason) == before + 1


async def test_a_tombstone_carries_the_configured_ttl_and_a_state_does_not() -> None:
    bus = FakeBus({})
    w = watcher(bus)
    await handle(w, "a")
    await handle(w, "a", deleted=True)
    assert [(m.deleted, ttl) for _, m, ttl in bus.published] == [(False, None), (True, 300.0)]  # type: ignore[attr-defined]


async def test_a_dead_letter_that_cannot_be_written_does_not_stop_the_watch() -> None:
    class NoDeadLetters(FakeBus):
        async def dead_letter(self, subject: str, payload: dict[str, Any], **kw: Any) -> None:
            raise PermanentPublishError("permission", subject, "may not dead-letter")

    bus = NoDeadLetters({"bad": ValueError("a bug")})
    w = watcher(bus)
    await handle(w, "bad")
    await handle(w, "good")
    assert [m.ref.name for _, m, _ in bus.published] == ["good"]  # type: ignore[attr-defined]
