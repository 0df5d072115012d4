"""Respawn end to end with its streams at their limits, on a real nats-server of its own.

watcher, health and lifecycle run as their own processes with ``RESPAWN_OBSERVATIONS`` and the
dead-letter stream configured small (``nats.streams.*`` through the environment, as an operator
would). The observation stream is then filled past its limit, so JetStream discards its oldest
messages: the latest states of the objects that changed least recently. What fills it does not
matter, only that it pushes the oldest out, so the test publishes on subjects no consumer reads.

The watcher must go on publishing and publish again what was discarded of objects that still
exist, health go on detecting and lifecycle go on resetting, and a health replica started after
the overflow must know an AppWrapper whose original observations were discarded. The dead
letters, at their limit, keep the newest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.bus import MSG_ID_HEADER
from shared.messages import AppWrapperObservation, LifecycleEvent, Verdict, decode
from tests.integration.conftest import services_on
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, jobs, running_pods, wait_phase
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

DEAD_LETTER_MAX_MSGS = 5
JUNK = 12  # undecodable observations, each dead-lettered by health (their one consumer)


def observations_limit(kubeconfig: Path) -> int:
    """A limit the objects that exist now fit in twice over (so that restoring them does not
    discard each other), with room for this test's own, and small enough to fill quickly."""
    appwrappers = len(sim.get_json(kubeconfig, "appwrappers", "-A")["items"])
    nodes = len(sim.get_json(kubeconfig, "nodes")["items"])
    # An AppWrapper is one observation, a component and a pod or more.
    return max(100, 2 * (4 * appwrappers + nodes) + 50)


def limits(max_msgs: int) -> dict[str, str]:
    return {
        "RESPAWN_NATS_STREAMS_OBSERVATIONS_MAX_MSGS": str(max_msgs),
        "RESPAWN_NATS_STREAMS_OBSERVATIONS_MAX_BYTES": "2MiB",
        "RESPAWN_NATS_STREAMS_DEAD_LETTER_MAX_MSGS": str(DEAD_LETTER_MAX_MSGS),
        "RESPAWN_NATS_STREAMS_DEAD_LETTER_MAX_BYTES": "64KiB",
        "RESPAWN_WATCHER_DISCARD_CHECK_PERIOD": "1s",
    }


@pytest.fixture
def services(testbed: Endpoints, own_nats: NatsServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Start services on ``own_nats`` with small stream limits: ``start(name, instance)``."""
    env = limits(observations_limit(testbed.kubeconfig))
    with services_on(testbed.kubeconfig, own_nats.url, tmp_path / "logs") as start_service:

        def start(name: str, instance: str = "") -> ServiceProcess:
            return start_service(name, instance=instance, env=env)

        yield {"start": start, "max_msgs": int(env["RESPAWN_NATS_STREAMS_OBSERVATIONS_MAX_MSGS"])}


async def fill(js: Any, count: int, start: int) -> None:
    """``count`` messages of 512 bytes on subjects no Respawn consumer reads."""
    for i in range(start, start + count):
        await js.publish(f"{subjects.OBS_PREFIX}.filler.f{i}", b"x" * 512)


async def stored(js: Any, subject: str) -> Any:
    """The message stored on ``subject``, None if there is none."""
    try:
        return await js.get_last_msg(subjects.OBSERVATIONS_STREAM, subject)
    except Exception:
        return None


def pods_ready(msg: Any) -> bool:
    """An AppWrapper observation whose status says its pods are ready (its last change while
    it runs)."""
    body = decode(AppWrapperObservation, msg.data, msg.headers).body
    conditions = body.get("status", {}).get("conditions", [])
    return any(c.get("type") == "PodsReady" and c.get("status") == "True" for c in conditions)


def restored(msg: Any) -> bool:
    return msg is not None and ":restored:" in (msg.headers or {}).get(MSG_ID_HEADER, "")


async def test_at_their_limits_the_streams_discard_the_oldest_and_nothing_is_lost(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, own_nats: NatsServer, services: dict[str, Any]
) -> None:
    kc = testbed.kubeconfig
    start, max_msgs = services["start"], services["max_msgs"]
    watcher, health, lifecycle = start("watcher"), start("health", "first"), start("lifecycle")
    old_aw = subjects.appwrapper_obs(namespace, "old", "appwrapper", "old")

    # A long-running workload, observed before the stream overflows.
    apply(kc, namespace, manifests.job_appwrapper("old", annotations=FAST_RESET))
    await wait_phase(kc, namespace, "old", "Running")
    [pod] = await until("old's pod running", lambda: running_pods(kc, namespace, "old"))
    old_pod = subjects.appwrapper_obs(namespace, "old", "pod", pod["metadata"]["name"])

    async with Observer(own_nats.url) as obs:
        js = obs.nc.jetstream()
        # Only once old has settled: an observation that changes after the fill is published
        # anew, not restored, as it must be.
        first_seen = await until(
            "old's AppWrapper observed with its pods ready, and its pod running",
            lambda: _both(js, old_aw, old_pod),
            done=lambda pair: all(pair) and pods_ready(pair[0]) and b"Running" in pair[1].data,
        )
        originals = [m.seq for m in first_seen]

        # Past the limit: JetStream discards the oldest, old's observations among them.
        await fill(js, max_msgs, 0)
        info = await js.stream_info(subjects.OBSERVATIONS_STREAM)
        assert info.state.first_seq > max(originals)
        assert info.state.messages <= max_msgs
        # The watcher notices and publishes them again, as they are.
        again = await until(
            "old's observations published again",
            lambda: _both(js, old_aw, old_pod),
            done=lambda pair: all(restored(m) for m in pair),
            within=20,
        )
        assert all(m.seq > max(originals) for m in again)

        # The dead letters at their limit: the newest kept, and the services go on.
        for i in range(JUNK):
            await js.publish(
                subjects.appwrapper_obs(namespace, "junk", "pod", f"junk-{i}"), b"\xc1 not msgpack"
            )
        dead = await until(
            "every junk observation dead-lettered by health",
            lambda: js.stream_info(subjects.DEAD_LETTER_STREAM),
            done=lambda i: i.state.last_seq >= JUNK,
        )
        assert dead.state.messages == DEAD_LETTER_MAX_MSGS
        assert dead.state.first_seq == dead.state.last_seq - DEAD_LETTER_MAX_MSGS + 1

        # With the stream full, a pod failure is still observed, judged and reset.
        apply(
            kc,
            namespace,
            manifests.job_appwrapper(
                "normal", pod_annotations={sim.SUCCEED_AFTER: "8s"}, annotations=FAST_RESET
            ),
        )
        await wait_phase(kc, namespace, "normal", "Running")
        [failing] = await until("normal's pod running", lambda: running_pods(kc, namespace, "normal"))
        sim.fail_pod(kc, namespace, failing["metadata"]["name"], exit_code=1)
        done = await wait_phase(kc, namespace, "normal", "Succeeded", within=60)
        assert read_appwrapper(done).resetting_count == 1
        assert (await js.stream_info(subjects.OBSERVATIONS_STREAM)).state.messages == max_msgs

        # Overflowing again, then a health replica that replays the stream after it: it knows old,
        # whose observations it finds only as the watcher published them again.
        health.stop()
        mark = (await js.stream_info(subjects.OBSERVATIONS_STREAM)).state.last_seq
        await fill(js, max_msgs, max_msgs)
        assert (await js.stream_info(subjects.OBSERVATIONS_STREAM)).state.first_seq > max(
            m.seq for m in again
        )
        await until(
            "old's observations published again after the second overflow",
            lambda: _both(js, old_aw, old_pod),
            done=lambda pair: all(restored(m) and m.seq > mark for m in pair),
            within=20,
        )
        late = start("health", "late")
        sim.fail_pod(kc, namespace, pod["metadata"]["name"], exit_code=1)
        verdict = await obs.wait_last(
            subjects.VERDICTS_STREAM,
            subjects.verdict(namespace, "old"),
            Verdict,
            lambda v: v.state == "Unhealthy",
        )
        assert verdict.reason == "FoundFailedPods"
        await until(
            "old reset once and running again",
            lambda: read_appwrapper(get_appwrapper(kc, namespace, "old")),
            done=lambda aw: (aw.phase, aw.resetting_count) == ("Running", 1),
            within=40,
        )
        events = await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, "old"), LifecycleEvent
        )
        assert [e.event for e in events].count("ResetStarted") == 1

    for process in (watcher, lifecycle, late):
        assert process.alive(), f"{process.name} died"

    for name in ("old", "normal"):
        kubectl(kc, "delete", "appwrapper", name, "-n", namespace, "--wait=false")
    await until(
        "the AppWrappers and their Jobs to be gone",
        lambda: (
            not (
                get_appwrapper(kc, namespace, "old")
                or get_appwrapper(kc, namespace, "normal")
                or jobs(kc, namespace)
            )
        ),
    )


async def _both(js: Any, first: str, second: str) -> tuple[Any, Any]:
    return await stored(js, first), await stored(js, second)
