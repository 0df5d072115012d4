"""Health under a completion policy (respawn.dev/completion-policy): per pod set, minSucceeded
makes the workload succeed early and minFailed tolerates failed pods."""

from __future__ import annotations

import json
from typing import Any

from shared.messages import PodObservation
from tests.unit.test_health_rules import MIN, T0, aw_obs, failed_pod, pod, verdict_of


def policy(**entries: dict[str, int]) -> dict[str, str]:
    return {"respawn.dev/completion-policy": json.dumps({k.lstrip("p"): v for k, v in entries.items()})}


def in_set(obs: PodObservation, pod_set: int) -> PodObservation:
    return obs.model_copy(update={"pod_set": pod_set})


def test_the_launchers_success_is_the_workloads_while_its_servers_still_run() -> None:
    aw = aw_obs(replicas=3, annotations=policy(p0={"minSucceeded": 1}))
    launcher = in_set(pod("launcher", "Succeeded"), 0)
    servers = [in_set(pod(f"server-{i}"), 1) for i in range(2)]
    verdict = verdict_of([aw, launcher, *servers], T0 + MIN)
    assert verdict.state == "Succeeded"
    assert verdict.message == "1 pods of pod set 0 succeeded (minSucceeded 1 by the completion policy)"


def test_without_a_policy_running_servers_keep_the_workload_running() -> None:
    aw = aw_obs(replicas=3)
    launcher = in_set(pod("launcher", "Succeeded"), 0)
    servers = [in_set(pod(f"server-{i}"), 1) for i in range(2)]
    assert verdict_of([aw, launcher, *servers], T0 + MIN).state == "Healthy"


def test_a_succeeded_pod_of_another_pod_set_does_not_meet_the_policy() -> None:
    aw = aw_obs(replicas=3, annotations=policy(p0={"minSucceeded": 1}))
    observations: list[Any] = [aw, in_set(pod("launcher"), 0), in_set(pod("server-0", "Succeeded"), 1)]
    observations.append(in_set(pod("server-1"), 1))
    assert verdict_of(observations, T0 + MIN).state == "Healthy"


def test_failed_pods_below_min_failed_are_tolerated() -> None:
    aw = aw_obs(replicas=3, annotations=policy(p0={"minFailed": 2}))
    workers = [in_set(failed_pod("w-0", finished_at=T0), 0), in_set(pod("w-1"), 0), in_set(pod("w-2"), 0)]
    assert verdict_of([aw, *workers], T0 + 5 * MIN).state == "Healthy"


def test_reaching_min_failed_makes_the_workload_unhealthy_and_names_the_pods() -> None:
    aw = aw_obs(replicas=3, annotations=policy(p0={"minFailed": 2}))
    workers = [
        in_set(failed_pod("w-0", finished_at=T0), 0),
        in_set(failed_pod("w-1", finished_at=T0), 0),
        in_set(pod("w-2"), 0),
    ]
    verdict = verdict_of([aw, *workers], T0 + 5 * MIN)
    assert verdict.state == "Unhealthy" and verdict.reason == "FoundFailedPods"
    assert "2 failed pods: w-0, w-1" in verdict.message


def test_a_pod_without_a_pod_set_fails_the_workload_as_by_default() -> None:
    aw = aw_obs(replicas=2, annotations=policy(p0={"minFailed": 2}))
    verdict = verdict_of([aw, failed_pod("w-0", finished_at=T0), in_set(pod("w-1"), 0)], T0 + 5 * MIN)
    assert verdict.state == "Unhealthy"


def test_when_every_pod_is_done_tolerated_failures_count_as_completed() -> None:
    aw = aw_obs(replicas=2, annotations=policy(p0={"minFailed": 2}))
    done = [in_set(failed_pod("w-0", finished_at=T0), 0), in_set(pod("w-1", "Succeeded"), 0)]
    assert verdict_of([aw, *done], T0 + 5 * MIN).state == "Succeeded"


def test_a_bad_policy_is_ignored_with_a_warning() -> None:
    aw = aw_obs(replicas=2, annotations={"respawn.dev/completion-policy": "{bad"})
    verdict = verdict_of(
        [aw, in_set(failed_pod("w-0", finished_at=T0), 0), in_set(pod("w-1"), 0)], T0 + 5 * MIN
    )
    assert verdict.state == "Unhealthy"
    assert any("using the default completion policy" in w for w in verdict.warnings)
