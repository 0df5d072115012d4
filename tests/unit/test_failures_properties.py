"""Properties of failure classification over generated pod statuses and patterns.

* Every failure gets exactly one class and a well-formed code, whatever the status and tables.
* The upstream exit-code annotations always win: a terminal code makes the failure Permanent
  (``ExitCode:<n>``) and a code listed as retryable is never Permanent, whatever the patterns say.
* A workload pattern that matches wins over the default table.
* Bad patterns, in the annotation or in the configuration, never raise anything but the
  documented outcome: a refusal with a reason, or a ConfigError.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.appwrapper.params import ExitCodePolicy
from shared.config import ConfigError, load_config
from shared.failures.annotation import FAILURE_PATTERNS_ANNOTATION, workload_patterns
from shared.failures.classify import classify
from shared.failures.defaults import DEFAULT_PATTERNS
from shared.failures.facts import ContainerExit, FailureFacts, PodCondition
from shared.failures.patterns import CODE_PATTERN, FailureClass, FailurePattern

REASONS = [
    "",
    "Evicted",
    "Preempting",
    "Terminated",
    "Shutdown",
    "NodeLost",
    "OutOfcpu",
    "UnexpectedAdmissionError",
    "DeadlineExceeded",
    "OOMKilled",
    "Error",
    "Completed",
    "ContainerCannotRun",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
]
CONDITION_REASONS = [
    "PreemptionByScheduler",
    "EvictionByEvictionAPI",
    "DeletionByTaintManager",
    "DeletionByPodGC",
    "TerminationByKubelet",
    "WorkloadEvictedDueToPreempted",
    "",
]
CODES = st.one_of(
    st.sampled_from([0, 1, 2, 126, 127, 130, 134, 137, 139, 143, 255]), st.integers(-(2**31), 2**31 - 1)
)
TEXT = st.one_of(st.sampled_from(REASONS), st.text(max_size=20))

containers = st.builds(
    ContainerExit,
    name=st.sampled_from(["main", "sidecar", "init"]),
    init=st.booleans(),
    exit_code=st.one_of(st.none(), CODES),
    reason=TEXT,
    message=st.one_of(
        st.just(""), st.just("ephemeral local storage usage exceeds the total limit"), st.text(max_size=40)
    ),
)
conditions = st.builds(
    PodCondition,
    type=st.sampled_from(["DisruptionTarget", "TerminationTarget", "Ready", "PodScheduled"]),
    status=st.sampled_from(["True", "False", "Unknown"]),
    reason=st.one_of(st.sampled_from(CONDITION_REASONS), st.text(max_size=20)),
    message=st.text(max_size=20),
)
facts_strategy = st.builds(
    FailureFacts,
    pod=st.just("pod-0"),
    node=st.sampled_from(["", "node-1"]),
    phase=st.sampled_from(["Failed", "Running", "Pending", "Unknown"]),
    reason=TEXT,
    message=st.text(max_size=40),
    containers=st.lists(containers, max_size=4).map(tuple),
    conditions=st.lists(conditions, max_size=3).map(tuple),
    deleted_externally=st.booleans(),
    node_state=st.sampled_from(["", "Ready", "NotReady", "Unknown", "Deleted"]),
)
classes = st.sampled_from(list(FailureClass))
patterns_strategy = st.one_of(
    st.builds(lambda c, k: FailurePattern.model_validate({"exitCodes": [c], "class": k}), CODES, classes),
    st.builds(
        lambda r, k: FailurePattern.model_validate({"reason": re.escape(r), "class": k}), TEXT, classes
    ),
    st.builds(
        lambda d, k: FailurePattern.model_validate({"deletedExternally": d, "class": k}),
        st.booleans(),
        classes,
    ),
    st.builds(
        lambda r, k: FailurePattern.model_validate(
            {"condition": {"type": "DisruptionTarget", "reason": r}, "class": k}
        ),
        st.sampled_from(CONDITION_REASONS),
        classes,
    ),
)
policies = st.builds(
    ExitCodePolicy,
    terminal=st.frozensets(CODES, max_size=3),
    retryable=st.frozensets(CODES, max_size=3),
)


@settings(max_examples=400)
@given(facts=facts_strategy, policy=policies, workload=st.lists(patterns_strategy, max_size=3))
def test_every_status_gets_exactly_one_class_and_a_code(
    facts: FailureFacts, policy: ExitCodePolicy, workload: list[FailurePattern]
) -> None:
    got = classify(facts, exit_codes=policy, workload=workload, table=DEFAULT_PATTERNS)
    assert got.failure_class in set(FailureClass)
    assert CODE_PATTERN.fullmatch(got.code)
    # Deterministic: the same facts and tables give the same answer.
    assert classify(facts, exit_codes=policy, workload=workload, table=DEFAULT_PATTERNS) == got


@settings(max_examples=400)
@given(
    facts=facts_strategy,
    policy=policies,
    workload=st.lists(patterns_strategy, max_size=3),
    operator=st.lists(patterns_strategy, max_size=3),
)
def test_the_upstream_exit_code_annotations_always_win(
    facts: FailureFacts,
    policy: ExitCodePolicy,
    workload: list[FailurePattern],
    operator: list[FailurePattern],
) -> None:
    got = classify(facts, exit_codes=policy, workload=workload, table=[*operator, *DEFAULT_PATTERNS])
    codes = facts.exit_codes(init=False)
    terminal = [c for c in codes if policy.is_terminal(c)]
    if terminal:
        assert (got.failure_class, got.code) == (FailureClass.PERMANENT, f"ExitCode:{terminal[0]}")
        assert got.source in ("terminalExitCodes", "retryableExitCodes")
    elif any(c in policy.retryable for c in codes):
        assert got.failure_class is not FailureClass.PERMANENT


@settings(max_examples=300)
@given(facts=facts_strategy, failure_class=classes, code=st.sampled_from(["Mine", "Workload:1"]))
def test_a_matching_workload_pattern_wins_over_the_default_table(
    facts: FailureFacts, failure_class: FailureClass, code: str
) -> None:
    # A pattern built from a fact the pod has always matches it.
    mine = FailurePattern.model_validate(
        {"deletedExternally": facts.deleted_externally, "class": failure_class, "code": code}
    )
    got = classify(facts, exit_codes=ExitCodePolicy(), workload=[mine], table=DEFAULT_PATTERNS)
    assert (got.failure_class, got.code, got.source, got.index) == (failure_class, code, "workload", 0)


FIELD_NAMES = [
    "exitCodes",
    "reason",
    "message",
    "signal",
    "condition",
    "nodeState",
    "deletedExternally",
    "class",
    "code",
    "type",
    "version",
    "patterns",
    "description",
]
json_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(["Transient", "Permanent", "Unknown", "SIGKILL", "3-5", "(", "NotReady", 1]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=6)), children, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=400)
@given(value=st.one_of(json_values.map(json.dumps), st.text(max_size=200)))
def test_the_annotation_is_parsed_or_refused_with_a_reason_never_raised(value: str) -> None:
    parsed = workload_patterns({FAILURE_PATTERNS_ANNOTATION: value})
    if parsed.error:
        assert parsed.error.startswith(f"{FAILURE_PATTERNS_ANNOTATION} refused: ")
        assert parsed.patterns == ()
    else:
        assert all(isinstance(p, FailurePattern) for p in parsed.patterns)


@settings(max_examples=200)
@given(value=json_values)
def test_the_configured_patterns_are_loaded_or_a_config_error(value: Any) -> None:
    try:
        config = load_config(env={"RESPAWN_FAILURES_PATTERNS": json.dumps(value)})
    except ConfigError as exc:
        assert "failures.patterns" in str(exc) or "RESPAWN_FAILURES_PATTERNS" in str(exc)
    else:
        assert isinstance(value, list)
        assert len(config.failures.patterns) == len(value)
