"""Restart storms and the progress heartbeat end to end: watcher, health and lifecycle on the testbed.

A crash loop is written into a pod's status as a kubelet would write it (restart count rising,
the container waiting in CrashLoopBackOff, the pod still Running); the heartbeat is written with
``kubectl annotate --overwrite``, as the documented sidecar does. Verdicts are read from the
verdict stream as an external subscriber would.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import sim
from respawn.testbed.cluster import kubectl
from shared.appwrapper.model import read_appwrapper
from shared.messages import Verdict, decode
from shared.stalls import HEARTBEAT_ANNOTATION, HEARTBEAT_TIMEOUT_ANNOTATION, RESTART_STORM_ANNOTATION
from tests.integration.objects import apply
from tests.integration.test_health_e2e import (
    Stack,
    VerdictFeed,
    appwrapper,
    feed,
    get,
    healthy,
    nc,
    pod,
    stack,
    unhealthy,
)
from tests.waiting import holds, until

pytestmark = pytest.mark.testbed

__all__ = ["nc", "stack"]  # fixtures, used by name


async def submit(
    stack: Stack, nc: Any, namespace: str, name: str, workload: dict[str, Any], **annotations: str
) -> VerdictFeed:
    verdicts = await feed(nc, namespace, name)
    apply(stack.kubeconfig, namespace, appwrapper(name, workload, **annotations))
    return verdicts


async def running(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await until(
        f"pod {name} Running",
        lambda: get(kubeconfig, namespace, "pods", "--field-selector", f"metadata.name={name}")["items"],
        done=lambda items: bool(items) and items[0].get("status", {}).get("phase") == "Running",
    )
    return found[0]


def crash(kubeconfig: Path, namespace: str, body: dict[str, Any], restarts: int) -> None:
    sim.crash_loop_pod(kubeconfig, namespace, body, restarts)


def beat(kubeconfig: Path, namespace: str, kind: str, name: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kubectl(
        kubeconfig, "annotate", "--overwrite", kind, name, "-n", namespace, f"{HEARTBEAT_ANNOTATION}={now}"
    )


async def drain(verdicts: VerdictFeed) -> list[Verdict]:
    """Read whatever verdicts have arrived, without waiting for more than a moment."""
    with contextlib.suppress(TimeoutError):
        while True:
            msg = await verdicts.sub.next_msg(timeout=0.2)
            verdicts.seen.append(decode(Verdict, msg.data, msg.headers))
    return verdicts.seen


async def test_a_crash_looping_running_pod_is_a_restart_storm_and_the_workload_is_reset(
    stack: Stack, nc: Any, namespace: str
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        stack,
        nc,
        namespace,
        "cl",
        pod("cl-0", restart_policy="OnFailure"),
        **{
            RESTART_STORM_ANNOTATION: "3/5m",
            "workload.codeflare.dev.appwrapper/retryPausePeriodDuration": "1s",
        },
    )
    body = await running(kc, namespace, "cl-0")
    first_uid = body["metadata"]["uid"]
    for restarts in (1, 2, 3):
        crash(kc, namespace, body, restarts)
    final = await verdicts.wait(unhealthy("RestartStorm"))

    assert (final.failure_class, final.failure_code) == ("Unknown", "RestartStorm")
    assert final.counts_toward_retry and not final.terminal
    assert "container c of pod cl-0 restarted 3 times within 5m0s" in final.message
    # The pod was Running throughout: the storm alone made the workload Unhealthy, and lifecycle
    # reset it (a counted retry) and created the pod again.
    aw = await until(
        "cl reset once and running again",
        lambda: get(kc, namespace, "appwrapper", "cl"),
        done=lambda aw: read_appwrapper(aw).resetting_count == 1 and read_appwrapper(aw).phase == "Running",
        within=60,
    )
    assert read_appwrapper(aw).resetting_count == 1
    again = await running(kc, namespace, "cl-0")
    assert again["metadata"]["uid"] != first_uid


async def test_a_long_crash_loop_back_off_wait_is_a_restart_storm_after_the_failure_grace_period(
    stack: Stack, nc: Any, namespace: str
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        stack,
        nc,
        namespace,
        "bo",
        pod("bo-0", restart_policy="OnFailure"),
        **{"workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "3s"},
    )
    body = await running(kc, namespace, "bo-0")
    crash(kc, namespace, body, 1)
    grace = await verdicts.wait(healthy("RestartStorm"))
    final = await verdicts.wait(unhealthy("RestartStorm"))

    assert grace.deadline is not None and grace.first_unhealthy_at is not None
    assert (grace.deadline - grace.first_unhealthy_at).total_seconds() == 3
    assert final.deadline == grace.deadline and final.decided_at >= grace.deadline
    assert (final.failure_class, final.failure_code) == ("Unknown", "CrashLoopBackOff")
    assert "waiting in CrashLoopBackOff after 1 restarts" in final.message


async def test_a_workload_that_never_beats_is_stalled(stack: Stack, nc: Any, namespace: str) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(stack, nc, namespace, "hb", pod("hb-0"), **{HEARTBEAT_TIMEOUT_ANNOTATION: "3s"})
    await running(kc, namespace, "hb-0")
    final = await verdicts.wait(unhealthy("Stalled"))

    assert (final.failure_class, final.failure_code) == ("Unknown", "Stalled")
    assert "no progress heartbeat within the heartbeat timeout 3s" in final.message
    assert final.counts_toward_retry and not final.terminal


async def test_a_fresh_heartbeat_keeps_the_workload_healthy_and_a_stale_one_stalls_it(
    stack: Stack, nc: Any, namespace: str
) -> None:
    kc = stack.kubeconfig
    verdicts = await submit(
        stack, nc, namespace, "fresh", pod("fresh-0"), **{HEARTBEAT_TIMEOUT_ANNOTATION: "4s"}
    )
    await running(kc, namespace, "fresh-0")
    beat(kc, namespace, "pod", "fresh-0")

    def not_stalled(seen: list[Verdict]) -> bool:
        return not any(v.reason == "Stalled" for v in seen)

    async def beating_on(kind: str, name: str) -> list[Verdict]:
        beat(kc, namespace, kind, name)
        return await drain(verdicts)

    # Twice the timeout with a heartbeat each second on the pod, then on the AppWrapper.
    await holds(
        "no Stalled verdict while the pod beats",
        lambda: beating_on("pod", "fresh-0"),
        done=not_stalled,
        during=8,
        every=1,
    )
    await holds(
        "no Stalled verdict while the AppWrapper beats",
        lambda: beating_on("appwrapper", "fresh"),
        done=not_stalled,
        during=8,
        every=1,
    )
    assert any(v.state == "Healthy" for v in verdicts.seen)

    # The beats stop: the last one goes stale.
    stopped = datetime.now(UTC)
    final = await verdicts.wait(unhealthy("Stalled"))
    assert final.decided_at >= stopped
    assert "the last at" in final.message
