"""Node quarantine on a real nats-server: autopilot counts the nodes verdicts blame and publishes
the quarantine; a restart keeps it; it ends on time; lifecycle's follower sees it.

Verdicts are published on RESPAWN_VERDICTS as health publishes them, node observations as the
watcher does; autopilot runs in this process (it needs no Kubernetes) on a server of its own per
test. tests/integration/test_autopilot_e2e.py runs the whole chain on the testbed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest

from respawn.cli import status
from respawn.testbed.nats import NatsServer
from services.autopilot.service import AutopilotService
from services.lifecycle.quarantined import QuarantinedNodes
from shared import subjects
from shared.bus import Bus
from shared.config import NodeQuarantineConfig, OperatorConfig
from shared.kubetime import utcnow
from shared.messages import QUARANTINE_RESOURCE, NodeObservation, NodeVerdict, ObjectRef, Verdict, decode
from shared.runtime import Runtime
from tests.waiting import holds, until

pytestmark = pytest.mark.nats

NODES = ("n0", "n1", "n2", "n3")


def quarantine_config(**overrides: object) -> NodeQuarantineConfig:
    # 4 nodes at 50 %: two places.
    settings: dict[str, object] = {"threshold": 3, "window": "10m", "duration": "10m", "maxShare": 0.5}
    settings.update(overrides)
    return NodeQuarantineConfig.model_validate(settings)


@contextlib.asynccontextmanager
async def autopilot(bus: Bus, config: NodeQuarantineConfig) -> AsyncIterator[AutopilotService]:
    svc = AutopilotService(
        Runtime(
            name="autopilot", config=OperatorConfig(node_quarantine=config), bus=bus, kube=None, probes=None
        )
    )
    task = asyncio.create_task(svc.run())
    try:
        await until("autopilot to finish its replay", lambda: svc.caught_up)
        yield svc
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def nodes(bus: Bus) -> None:
    for name in NODES:
        await bus.publish(
            subjects.node_obs(name), NodeObservation(name=name, observed_at=utcnow()), msg_id=None
        )


async def fault(
    bus: Bus, workload: str, blamed: Sequence[str], *, kind: str = "Infrastructure", attempt: int = 0
) -> Verdict:
    verdict = Verdict(
        ref=ObjectRef(namespace="team", name=workload, uid=f"uid-{workload}"),
        state="Unhealthy",
        reason="FoundFailedPods",
        nodes=tuple(blamed),
        resetting_count=attempt,
        decided_at=utcnow(),
        failure_class="Unknown",
        failure_code="ExitCode:1",
        fault_kind=kind,
    )
    await bus.publish(subjects.verdict("team", workload), verdict, msg_id=None)
    return verdict


async def stored(bus: Bus) -> NodeVerdict | None:
    try:
        msg = await bus.js.get_last_msg(
            subjects.NODE_VERDICTS_STREAM, subjects.node_verdict(QUARANTINE_RESOURCE)
        )
    except Exception:
        return None
    return decode(NodeVerdict, msg.data, msg.headers)


async def quarantined(bus: Bus) -> tuple[str, ...]:
    verdict = await stored(bus)
    return verdict.no_schedule if verdict is not None else ()


async def test_a_node_blamed_by_three_workloads_is_quarantined_and_application_faults_do_not_count(
    own_bus: Bus, own_nats: NatsServer
) -> None:
    await nodes(own_bus)
    async with autopilot(own_bus, quarantine_config()) as svc:
        await fault(own_bus, "a", ["n1"])
        await fault(own_bus, "b", ["n1"], kind="Application")
        first = await fault(own_bus, "c", ["n1", "n2"])
        # The same attempt again (a repeated verdict) and one that says nothing of its kind.
        await own_bus.publish(subjects.verdict("team", "c"), first.model_copy(update={"seq": 2}), msg_id=None)
        await fault(own_bus, "d", ["n1"], kind="")
        # Verdicts are handled in order: once one published after them is counted, they all were.
        await fault(own_bus, "z", ["n0"])
        await until("the verdicts handled", lambda: svc.quarantine.book.count("n0") == 1)
        assert svc.quarantine.book.count("n1") == 2
        await holds(
            "no quarantine with two infrastructure faults",
            lambda: svc.quarantine.book.entries == {},
            during=1.0,
        )
        await fault(own_bus, "e", ["n1"])
        await until("n1 quarantined", lambda: quarantined(own_bus), done=lambda v: v == ("n1",))
    verdict = await stored(own_bus)
    assert verdict is not None
    [entry] = verdict.quarantine
    assert (entry.node, entry.state, entry.failures) == ("n1", "Quarantined", 3)
    assert entry.workloads == ("team/a", "team/c", "team/e")
    assert entry.until is not None and entry.until - entry.since == timedelta(minutes=10)
    # `respawn status` reads the same entries.
    assert await status.fetch_quarantine(own_nats.url) == [entry]


async def test_a_restart_keeps_the_quarantine_and_rebuilds_the_counts_from_the_verdicts(own_bus: Bus) -> None:
    await nodes(own_bus)
    async with autopilot(own_bus, quarantine_config()) as svc:
        for workload in ("a", "b", "c"):
            await fault(own_bus, workload, ["n1"])
        await fault(own_bus, "d", ["n2"])
        await fault(own_bus, "e", ["n2"])
        await until("n1 quarantined", lambda: quarantined(own_bus), done=lambda v: v == ("n1",))
        await until("n2's faults counted", lambda: svc.quarantine.book.count("n2") == 2)
    before = await stored(own_bus)
    async with autopilot(own_bus, quarantine_config()) as svc:
        # The same entries, not a new quarantine; n1's faults, used up by it, do not count again.
        assert svc.quarantine.book.entries["n1"] == before.quarantine[0] if before else False
        assert svc.quarantine.book.count("n1") == 0
        assert svc.quarantine.book.count("n2") == 2
        await fault(own_bus, "f", ["n2"])
        await until("n2 quarantined too", lambda: quarantined(own_bus), done=lambda v: v == ("n1", "n2"))
    after = await stored(own_bus)
    assert after is not None and before is not None
    assert after.quarantine[0] == before.quarantine[0]


async def test_a_quarantine_ends_after_its_duration(own_bus: Bus) -> None:
    await nodes(own_bus)
    async with autopilot(own_bus, quarantine_config(duration="2s")):
        for workload in ("a", "b", "c"):
            await fault(own_bus, workload, ["n3"])
        await until("n3 quarantined", lambda: quarantined(own_bus), done=lambda v: v == ("n3",))
        await until("n3 released", lambda: quarantined(own_bus), done=lambda v: v == (), within=10.0)
    verdict = await stored(own_bus)
    assert verdict is not None
    assert [(e.node, e.state) for e in verdict.quarantine] == [("n3", "Released")]


async def test_past_the_cap_the_worst_node_is_quarantined_and_the_other_held(own_bus: Bus) -> None:
    await nodes(own_bus)
    # 4 nodes at 25 %: one place.
    async with autopilot(own_bus, quarantine_config(maxShare=0.25)):
        for workload in ("a", "b", "c"):
            await fault(own_bus, workload, ["n0"])
        await until("n0 quarantined", lambda: quarantined(own_bus), done=lambda v: v == ("n0",))
        for workload in ("d", "e", "f"):
            await fault(own_bus, workload, ["n2"])

        async def states() -> list[tuple[str, str]]:
            verdict = await stored(own_bus)
            return [(e.node, e.state) for e in verdict.quarantine] if verdict else []

        await until("n2 held", states, done=lambda v: v == [("n0", "Quarantined"), ("n2", "Held")])
    assert await quarantined(own_bus) == ("n0",)


async def test_dry_run_reports_and_keeps_nobody_off(own_bus: Bus) -> None:
    await nodes(own_bus)
    async with autopilot(own_bus, quarantine_config(dryRun=True)):
        for workload in ("a", "b", "c"):
            await fault(own_bus, workload, ["n1"])

        async def states() -> list[tuple[str, str]]:
            verdict = await stored(own_bus)
            return [(e.node, e.state) for e in verdict.quarantine] if verdict else []

        await until("n1 reported", states, done=lambda v: v == [("n1", "DryRun")])
    assert await quarantined(own_bus) == ()


async def test_lifecycle_follows_the_quarantine(own_bus: Bus) -> None:
    await nodes(own_bus)
    follower = QuarantinedNodes()
    task = asyncio.create_task(follower.run(own_bus))
    try:
        async with autopilot(own_bus, quarantine_config(duration="3s")):
            for workload in ("a", "b", "c"):
                await fault(own_bus, workload, ["n2"])
            await until("lifecycle to keep n2 off", lambda: follower.nodes == {"n2"})
            await until("lifecycle to let n2 back", lambda: follower.nodes == frozenset(), within=10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
