"""Chaos: every service replicated as in production (watcher, two health, two lifecycle, autopilot),
a random one SIGKILLed every few seconds and started again, while pod failures are injected one
at a time into workloads that are healthy at that moment. Every workload must end in the right
phase with ``resettingCount`` equal to the faults injected into it (0 lost, 0 duplicated), the
lifecycle stream must announce each reset once, and nothing may be left after deletion.

The same runs again with the NATS server and the API server the services talk to restarted, each
twice (an API server of the test's own on the testbed's etcd, so the testbed's scheduler,
controller manager and kwok go on undisturbed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from respawn.testbed.cluster import State, kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer, start_nats
from shared import subjects
from shared.messages import LifecycleEvent
from tests.integration import chaos
from tests.integration.apiserver import ApiServerReplica
from tests.integration.observe import Observer
from tests.waiting import WaitTimeout, until

pytestmark = pytest.mark.testbed

KILL_EVERY = 1.5  # seconds from a restarted process being ready to the next SIGKILL


@pytest.fixture(scope="module")
def chaos_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A NATS server of this module's own, so restarting it disturbs no other test."""
    server = start_nats(tmp_path_factory.mktemp("chaos-nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_replica(testbed: Endpoints, tmp_path: Path) -> Iterator[ApiServerReplica]:
    state = State.load(testbed.state_dir) if testbed.state_dir else None
    if testbed.mode != "local" or state is None:
        pytest.skip("restarting an API server needs the local testbed (RESPAWN_TESTBED=local)")
    replica = ApiServerReplica(state, tmp_path / "apiserver")
    replica.start()
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[Callable[[Path, str], chaos.Fleet]]:
    fleets: list[chaos.Fleet] = []

    def make(kubeconfig: Path, nats_url: str) -> chaos.Fleet:
        fleet = chaos.Fleet(kubeconfig, nats_url, tmp_path / "logs")
        fleets.append(fleet)
        fleet.start_all()
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop_all()


Disruption = Callable[[], None]


async def inject_every_fault(kubeconfig: Path, p: chaos.Plan, disruptions: list[Disruption]) -> int:
    """Inject the plan's faults, one round at a time; run the ``disruptions`` in turn as the
    faults injected pass even fractions of the plan. Returns how many disruptions ran."""
    milestones = [p.total_faults * (i + 1) // (len(disruptions) + 1) for i in range(len(disruptions))]
    ran = 0

    async def round_() -> int:
        nonlocal ran
        await asyncio.to_thread(chaos.inject_round, kubeconfig, p)
        while ran < len(disruptions) and p.injected >= milestones[ran]:
            await asyncio.to_thread(disruptions[ran])
            ran += 1
        return p.injected

    try:
        await until(
            f"all {p.total_faults} planned faults injected",
            round_,
            done=lambda injected: injected >= p.total_faults,
            within=240,
            every=0.5,
        )
    except WaitTimeout as exc:
        # Which workloads never became healthy again, and what they say: a lost reset shows here.
        found = {o.name: o for o in chaos.outcomes(kubeconfig, p)}
        waiting = [
            f"{w.name}: {w.injected}/{w.faults} injected, now {found[w.name].phase}/{found[w.name].resets}"
            for w in p.workloads
            if w.injected < w.faults
        ]
        raise AssertionError(f"{exc}; waiting: {waiting}") from None
    return ran


async def check_outcomes(kubeconfig: Path, nats_url: str, p: chaos.Plan, ledger: Callable[[], str]) -> None:
    def final() -> list[chaos.Outcome]:
        return chaos.outcomes(kubeconfig, p)

    try:
        found = await until(
            "every workload in its final phase",
            final,
            done=lambda found: all(o.phase in ("Succeeded", "Failed") for o in found),
            within=240,
            every=1.0,
        )
    finally:
        print(ledger())  # the figures, in the test's output
    assert all(o.right for o in found), ledger()
    # The lifecycle stream announced each reset once, numbered 1, 2, …
    async with Observer(nats_url) as obs:
        for w in p.workloads:
            events = await obs.all(
                subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(p.namespace, w.name), LifecycleEvent
            )
            started = [e.resetting_count for e in events if e.event == "ResetStarted"]
            assert started == list(range(1, w.expected_resets + 1)), (w.name, started, ledger())


async def delete_and_check_nothing_left(kubeconfig: Path, namespace: str) -> None:
    kubectl(kubeconfig, "delete", "appwrappers", "--all", "-n", namespace, "--wait=false")

    def left() -> dict[str, int]:
        return {
            kind: len(chaos.items(kubeconfig, kind, namespace)) for kind in ("appwrappers", "jobs", "pods")
        }

    await until(
        "nothing left after deletion", left, done=lambda n: not any(n.values()), within=120, every=1.0
    )


async def run_chaos(
    kubeconfig: Path,
    fleet: chaos.Fleet,
    nats_url: str,
    p: chaos.Plan,
    *,
    seed: int,
    restarts: list[Disruption] | None = None,
) -> None:
    """``restarts``: what else is restarted (NATS, the API server), in turn, spread over the
    faults."""
    chaos.submit(kubeconfig, p)
    with chaos.killing(fleet, every=KILL_EVERY, seed=seed) as killer:
        disruptions = list(restarts or [])
        ran = await inject_every_fault(kubeconfig, p, disruptions)
        extra = {"server restarts": ran} if disruptions else {}

        def ledger() -> str:
            return chaos.ledger(p, chaos.outcomes(kubeconfig, p), killer.kills, extra)

        await check_outcomes(kubeconfig, nats_url, p, ledger)
        # Deletion under the same chaos: finalizers and staged deletion must survive kills too.
        await delete_and_check_nothing_left(kubeconfig, p.namespace)
    assert ran == len(disruptions), f"{ran} of {len(disruptions)} restarts ran"
    assert killer.errors == [], killer.errors
    assert sum(killer.kills.values()) >= 10, dict(killer.kills)  # the chaos really happened
    assert fleet.dead() == [], f"processes that exited on their own: {fleet.dead()}"


async def test_services_sigkilled_at_random_lose_and_duplicate_no_reset(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    chaos_nats: NatsServer,
    fleet_factory: Callable[[Path, str], chaos.Fleet],
) -> None:
    kc = testbed.kubeconfig
    fleet = fleet_factory(kc, chaos_nats.url)
    p = chaos.plan(namespace, 24, doomed=2, seed=1)
    await run_chaos(kc, fleet, chaos_nats.url, p, seed=11)


async def test_nats_and_api_server_restarts_during_chaos_lose_and_duplicate_no_reset(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    chaos_nats: NatsServer,
    api_replica: ApiServerReplica,
    fleet_factory: Callable[[Path, str], chaos.Fleet],
) -> None:
    """The same, with the NATS server and the API server the services talk to each restarted
    twice, in turn, spread over the faults."""
    fleet = fleet_factory(api_replica.kubeconfig, chaos_nats.url)
    p = chaos.plan(namespace, 10, doomed=1, seed=2)
    restarts = [chaos_nats.restart, api_replica.restart, chaos_nats.restart, api_replica.restart]
    # The test itself talks to the testbed's API server, which stays up.
    await run_chaos(testbed.kubeconfig, fleet, chaos_nats.url, p, seed=12, restarts=restarts)
    assert api_replica.restarts == 2
