"""Properties of the health rules over arbitrary sequences of observations and clock readings.

* Nothing raises, whatever arrives in whatever order.
* Redelivering an observation changes nothing (apply is idempotent).
* A verdict is emitted only for a change: evaluating again at the same instant, or at any later
  instant before the announced ``next_deadline``, with no new input, emits nothing. The same
  holds for an instance seeded with the verdict read back from the stream (after msgpack).
* Every Unhealthy verdict has a cause (reason and message); a Healthy verdict that names a
  condition also says when it was first seen and when its grace period ends.
* ``seq`` goes up by one per verdict for the same uid.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.health.rules import evaluate
from services.health.state import AppWrapperHealth, Observation, apply, remember_published
from shared import messages
from shared.appwrapper import params
from shared.faulttolerance import FaultTolerance
from shared.messages import AppWrapperObservation, ComponentObservation, ObjectRef, PodObservation, Verdict
from tests.unit.test_health_rules import (
    AW,
    GPU,
    NS,
    T0,
    aw_body,
    aw_obs,
    component,
    failed_pod,
    node_verdict,
    pod,
    running,
)

# Short grace periods so that random clock readings land on every side of every deadline.
DEFAULTS = FaultTolerance(
    admission_grace=timedelta(seconds=60),
    warmup_grace=timedelta(seconds=120),
    failure_grace=timedelta(seconds=30),
)
NODES = ["node-1", "node-2", ""]


@dataclass(frozen=True)
class Tick:
    seconds: int


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


offsets = st.integers(min_value=-300, max_value=900)
# Mostly live objects, so that sequences reach every rule rather than ending in tombstones.
rarely = st.sampled_from([False, False, False, False, False, True])
# Timestamps from some producers may be naive; the rules must treat them as UTC, not crash.
any_time = offsets.map(at) | offsets.map(lambda s: at(s).replace(tzinfo=None))

# Mostly deployed, on whole minutes like the API server's second-resolution timestamps.
deploy_times = st.sampled_from([None, *range(-300, 900, 60)]).map(lambda x: None if x is None else at(x))
PHASES = st.sampled_from(["Running", "Running", "Running", "Resetting", "Resuming", "Succeeded", ""])
annotation_values = st.sampled_from(["0s", "10s", "1m", "-5s", "bad", "25h", "1,2", "42", "x", ""])
annotations = st.dictionaries(
    st.sampled_from(
        [
            params.ADMISSION_GRACE_PERIOD_ANNOTATION,
            params.WARMUP_GRACE_PERIOD_ANNOTATION,
            params.FAILURE_GRACE_PERIOD_ANNOTATION,
            params.TERMINAL_EXIT_CODES_ANNOTATION,
            params.RETRYABLE_EXIT_CODES_ANNOTATION,
        ]
    ),
    annotation_values,
    max_size=3,
)


@st.composite
def appwrapper_observations(draw: st.DrawFn, phase: st.SearchStrategy[str] = PHASES) -> AppWrapperObservation:
    uid = draw(st.sampled_from(["aw-uid-1", "aw-uid-2"]))
    deleted = draw(st.sampled_from([False] * 9 + [True]))
    body: dict[str, Any] = {}
    if not (deleted and draw(st.booleans())):  # tombstones sometimes carry no body at all
        body = aw_body(
            phase=draw(phase),
            deployed_at=draw(deploy_times),
            resetting_count=draw(st.integers(0, 3)),
            annotations=draw(annotations),
            replicas=draw(st.sampled_from([1, 2, 2, 3, None, 0, "two"])),
            suspend=draw(rarely),
            components=draw(
                st.sampled_from([(("Job", "job"),), (("Job", "job"), ("PyTorchJob", "ptj")), ()])
            ),
            uid=uid,
        )
    return AppWrapperObservation(
        ref=ObjectRef(namespace=NS, name=AW, uid=draw(st.sampled_from([uid, ""]))),
        deleted=deleted,
        observed_at=draw(any_time),
        body=body,
    )


containers = st.builds(
    messages.ContainerState,
    name=st.sampled_from(["main", "sidecar"]),
    init=st.booleans(),
    state=st.sampled_from(["waiting", "running", "terminated", "unknown"]),
    exit_code=st.none() | st.sampled_from([0, 1, 2, 42, 137]),
    finished_at=st.none() | any_time,
)

pod_observations = st.builds(
    PodObservation,
    ref=st.builds(
        ObjectRef,
        namespace=st.just(NS),
        name=st.sampled_from(["p0", "p1", "p2"]),
        uid=st.sampled_from(["a", "b", ""]),
    ),
    appwrapper=st.sampled_from([AW, AW, AW, "other"]),
    deleted=rarely,
    observed_at=any_time,
    created_at=st.none() | any_time,
    deletion_requested=rarely,
    phase=st.sampled_from(["Pending", "Running", "Running", "Succeeded", "Failed", "Failed", "Unknown"]),
    node_name=st.sampled_from([*NODES, "node-1"]),
    containers=st.lists(containers, max_size=2).map(tuple),
    resources=st.sampled_from([(), (GPU,), (GPU,), ("example.com/fpga",)]),
)


@st.composite
def component_observations(draw: st.DrawFn) -> ComponentObservation:
    # Mostly the AppWrapper's own recorded components, sometimes a stray one.
    kind, name = draw(
        st.sampled_from([("Job", "job"), ("Job", "job"), ("PyTorchJob", "ptj"), ("Job", "stray")])
    )
    return ComponentObservation(
        ref=ObjectRef(namespace=NS, name=name, uid=draw(st.sampled_from(["a", "b"]))),
        appwrapper=AW,
        api_version="batch/v1",
        kind=kind,
        deleted=draw(rarely),
        observed_at=draw(any_time),
        deletion_requested=draw(rarely),
        failed=draw(rarely),
        status_message=draw(st.sampled_from(["", "BackoffLimitExceeded"])),
        created_at=draw(st.none() | any_time),
    )


node_verdicts = st.builds(
    messages.NodeVerdict,
    resource=st.sampled_from([GPU, GPU, "example.com/fpga"]),
    no_execute=st.lists(st.sampled_from(NODES[:2]), max_size=2, unique=True).map(tuple),
    decided_at=any_time,
)

_KINDS: dict[str, st.SearchStrategy[Observation]] = {
    "appwrapper": appwrapper_observations(),
    "pod": pod_observations,
    "component": component_observations(),
    "node": node_verdicts,
}
# Pods are the most frequent observation in practice, and the richest in rules.
observations: st.SearchStrategy[Observation] = st.sampled_from(
    ["appwrapper", "pod", "pod", "pod", "pod", "component", "node"]
).flatmap(_KINDS.__getitem__)
step: st.SearchStrategy[Observation | Tick] = st.sampled_from(["observation", "observation", "tick"]).flatmap(
    lambda kind: observations if kind == "observation" else offsets.map(Tick)
)
# Every sequence starts with a Running AppWrapper (later observations may change that), so that
# most examples exercise the rules rather than the "not judged" early exit.
steps = st.tuples(
    appwrapper_observations(phase=st.just("Running")),
    st.lists(step, min_size=4, max_size=40),
).map(lambda first_rest: [first_rest[0], *first_rest[1]])


def fresh() -> AppWrapperHealth:
    return AppWrapperHealth(namespace=NS, name=AW, defaults=DEFAULTS)


def check_verdict(verdict: Verdict, previous: Verdict | None) -> None:
    if verdict.state == "Unhealthy":
        assert verdict.reason, verdict
        assert verdict.message, verdict
    if verdict.state == "Healthy" and verdict.reason:
        assert verdict.first_unhealthy_at is not None
        assert verdict.deadline is not None
        assert verdict.message
    expected_seq = previous.seq + 1 if previous is not None and previous.ref.uid == verdict.ref.uid else 1
    assert verdict.seq == expected_seq


# Hand-written sequences that always reach each rule, on top of the random ones.
SCENARIOS: list[list[Observation | Tick]] = [
    # Autopilot: running GPU pods on a node marked NoExecute, then the node recovers.
    [
        aw_obs(),
        *running("p0", "p1", resources=[GPU]),
        Tick(10),
        node_verdict(["node-1"], decided_at=at(20)),
        Tick(30),
        node_verdict([], decided_at=at(40)),
        Tick(50),
    ],
    # A failed pod through its grace period, then the reset's tombstones and a new attempt.
    [
        aw_obs(),
        pod("p0"),
        failed_pod("p1", finished_at=at(5)),
        Tick(10),
        Tick(60),
        component(deleted=True, observed_at=at(70)),
        Tick(70),
        aw_obs(deployed_at=at(120), resetting_count=1),
        *running("p0", "p1", created_at=at(121)),
        Tick(130),
    ],
    # Pods never all created, then a failed Job, then the AppWrapper deleted.
    [
        aw_obs(),
        pod("p0", "Pending"),
        Tick(30),
        Tick(61),
        component(failed=True),
        Tick(80),
        AppWrapperObservation(ref=ObjectRef(namespace=NS, name=AW), deleted=True, observed_at=at(110)),
        Tick(110),
    ],
    # Success.
    [aw_obs(), pod("p0", "Succeeded"), Tick(10), pod("p1", "Succeeded"), Tick(20)],
    # A wrapped resource deleted by someone else.
    [aw_obs(), *running("p0", "p1"), component(), Tick(10), component(deleted=True), Tick(20)],
    # Pods stuck Pending past warmup and failure grace.
    [aw_obs(), pod("p0", "Pending"), pod("p1", "Pending"), Tick(200)],
]


@settings(max_examples=400, deadline=None)
@given(steps=steps, later=st.integers(min_value=0, max_value=3600))
@example(steps=SCENARIOS[0], later=5)
@example(steps=SCENARIOS[1], later=5)
@example(steps=SCENARIOS[2], later=5)
@example(steps=SCENARIOS[3], later=5)
@example(steps=SCENARIOS[4], later=5)
@example(steps=SCENARIOS[5], later=5)
def test_rules_never_raise_and_only_emit_verdicts_for_changes(
    steps: list[Observation | Tick], later: int
) -> None:
    state = fresh()
    for step in steps:
        if not isinstance(step, Tick):
            state = apply(state, step)
            continue
        now = at(step.seconds)
        before = state
        decision = evaluate(state, now)
        state = decision.state
        if decision.next_deadline is not None:
            assert decision.next_deadline > now
        if decision.verdict is not None:
            check_verdict(decision.verdict, before.last_verdict)
            assert decision.msg_id
            # Seeded from the stream (encoded and decoded), an instance agrees nothing changed.
            seeded = remember_published(before, messages.decode(Verdict, decision.verdict.encode()))
            assert evaluate(seeded, now).verdict is None
        # Same instant, no new input: nothing new.
        assert evaluate(state, now).verdict is None
        # Any later instant before the announced deadline, no new input: nothing new.
        quiet_until = decision.next_deadline
        probe = now + timedelta(seconds=later)
        if quiet_until is not None and probe >= quiet_until:
            probe = quiet_until - timedelta(microseconds=1)
        assert evaluate(state, probe).verdict is None


@settings(max_examples=300, deadline=None)
@given(history=st.lists(observations, max_size=25), again=observations)
def test_redelivering_an_observation_changes_nothing(history: list[Observation], again: Observation) -> None:
    state = fresh()
    for obs in history:
        state = apply(state, obs)
    once = apply(state, again)
    assert apply(once, again) == once


def test_the_pinned_scenarios_reach_every_verdict_reason() -> None:
    seen: set[tuple[str, str]] = set()
    for scenario in SCENARIOS:
        state = fresh()
        for step in scenario:
            if isinstance(step, Tick):
                decision = evaluate(state, at(step.seconds))
                state = decision.state
                if decision.verdict is not None:
                    seen.add((decision.verdict.state, decision.verdict.reason))
            else:
                state = apply(state, step)
    assert seen == {
        ("Healthy", ""),
        ("Unhealthy", "AutopilotNoExecute"),
        ("Healthy", "FoundFailedPods"),
        ("Unhealthy", "FoundFailedPods"),
        ("Healthy", "InsufficientPodsReady"),
        ("Unhealthy", "InsufficientPodsReady"),
        ("Unhealthy", "FailedComponent"),
        ("Unhealthy", "MissingComponent"),
        ("Deleted", "AppWrapperDeleted"),
        ("Succeeded", "Succeeded"),
    }
