"""Failure classes: the default table row by row, the order of precedence, the pattern syntax,
the workload annotation, the retry budget and application vs infrastructure faults."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.appwrapper.params import exit_code_policy
from shared.config import ConfigError, load_config
from shared.failures import failure_table
from shared.failures.annotation import (
    FAILURE_PATTERNS_ANNOTATION,
    MAX_WORKLOAD_PATTERNS,
    TRANSIENT_RETRY_LIMIT_ANNOTATION,
    transient_retry_limit,
    workload_patterns,
)
from shared.failures.blame import FaultKind, PodFailure, attribute
from shared.failures.budget import RetryAction, decide_retry
from shared.failures.classify import Classification, classify
from shared.failures.defaults import DEFAULT_PATTERNS
from shared.failures.facts import ContainerExit, FailureFacts, PodCondition, signal_name
from shared.failures.patterns import FailureClass, FailurePattern

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TRANSIENT, PERMANENT, UNKNOWN = FailureClass.TRANSIENT, FailureClass.PERMANENT, FailureClass.UNKNOWN
TW = "workload.codeflare.dev.appwrapper/terminalExitCodes"
RW = "workload.codeflare.dev.appwrapper/retryableExitCodes"


def exited(code: int, reason: str = "Error", message: str = "", *, init: bool = False) -> ContainerExit:
    return ContainerExit(
        name="init" if init else "main", init=init, exit_code=code, reason=reason, message=message
    )


def waiting(reason: str) -> ContainerExit:
    return ContainerExit(name="main", reason=reason)


def disrupted(reason: str, kind: str = "DisruptionTarget") -> PodCondition:
    return PodCondition(type=kind, status="True", reason=reason)


def judge(facts: FailureFacts, annotations: dict[str, str] | None = None) -> Classification:
    annotations = annotations or {}
    return classify(
        facts,
        exit_codes=exit_code_policy(annotations),
        workload=workload_patterns(annotations).patterns,
        table=DEFAULT_PATTERNS,
    )


# --- the default table --------------------------------------------------------------------------

DEFAULT_CASES = [
    # (facts, class, code)
    (FailureFacts("p", node_state="NotReady", containers=(exited(1),)), TRANSIENT, "NodeLost"),
    (FailureFacts("p", node_state="Unknown"), TRANSIENT, "NodeLost"),
    (FailureFacts("p", node_state="Deleted"), TRANSIENT, "NodeLost"),
    (FailureFacts("p", reason="NodeLost"), TRANSIENT, "NodeLost"),
    (FailureFacts("p", conditions=(disrupted("DeletionByPodGC"),)), TRANSIENT, "NodeLost"),
    (
        FailureFacts("p", conditions=(disrupted("PreemptionByScheduler"),), containers=(exited(143),)),
        TRANSIENT,
        "Preempted",
    ),
    (FailureFacts("p", conditions=(disrupted("PreemptionByKubeScheduler"),)), TRANSIENT, "Preempted"),
    (FailureFacts("p", reason="Preempting"), TRANSIENT, "Preempted"),
    (
        FailureFacts("p", conditions=(disrupted("WorkloadEvictedDueToPreempted", "TerminationTarget"),)),
        TRANSIENT,
        "QueueEvicted",
    ),
    (
        FailureFacts("p", conditions=(disrupted("WorkloadEvicted", "TerminationTarget"),)),
        TRANSIENT,
        "QueueEvicted",
    ),
    (
        FailureFacts(
            "p",
            reason="Evicted",
            message="Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.",
        ),
        UNKNOWN,
        "EphemeralStorageLimit",
    ),
    (
        FailureFacts(
            "p", reason="Evicted", message='Usage of EmptyDir volume "scratch" exceeds the limit "1Gi".'
        ),
        UNKNOWN,
        "EphemeralStorageLimit",
    ),
    (
        FailureFacts("p", conditions=(disrupted("EvictionByEvictionAPI"),), deleted_externally=True),
        TRANSIENT,
        "Evicted",
    ),
    (
        FailureFacts("p", reason="Evicted", message="The node was low on resource: memory."),
        TRANSIENT,
        "Evicted",
    ),
    (FailureFacts("p", conditions=(disrupted("DeletionByTaintManager"),)), TRANSIENT, "NoExecuteTaint"),
    (
        FailureFacts(
            "p",
            reason="Terminated",
            message="Pod was terminated in response to imminent node shutdown.",
            conditions=(disrupted("TerminationByKubelet"),),
        ),
        TRANSIENT,
        "NodeShutdown",
    ),
    (FailureFacts("p", reason="Shutdown"), TRANSIENT, "NodeShutdown"),
    (FailureFacts("p", conditions=(disrupted("TerminationByKubelet"),)), TRANSIENT, "KubeletTermination"),
    (FailureFacts("p", conditions=(disrupted("SomethingNew"),)), TRANSIENT, "Disrupted"),
    (FailureFacts("p", reason="OutOfnvidia.com/gpu"), TRANSIENT, "NodeAdmission"),
    (FailureFacts("p", reason="UnexpectedAdmissionError"), TRANSIENT, "NodeAdmission"),
    (FailureFacts("p", deleted_externally=True, containers=(exited(137),)), TRANSIENT, "DeletedExternally"),
    (FailureFacts("p", containers=(exited(137, "OOMKilled"),)), UNKNOWN, "OOMKilled"),
    (FailureFacts("p", containers=(waiting("InvalidImageName"),)), PERMANENT, "InvalidImageName"),
    (FailureFacts("p", containers=(waiting("ErrImagePull"),)), UNKNOWN, "ImagePull"),
    (FailureFacts("p", containers=(waiting("ImagePullBackOff"),)), UNKNOWN, "ImagePull"),
    (FailureFacts("p", containers=(exited(127),)), PERMANENT, "ExitCode:127"),
    (FailureFacts("p", containers=(exited(126),)), PERMANENT, "ExitCode:126"),
    (FailureFacts("p", containers=(exited(137),)), TRANSIENT, "Signal:SIGKILL"),
    (FailureFacts("p", containers=(exited(143),)), TRANSIENT, "Signal:SIGTERM"),
    (FailureFacts("p", containers=(exited(130),)), TRANSIENT, "Signal:SIGINT"),
    (FailureFacts("p", containers=(exited(139),)), UNKNOWN, "Signal:SIGSEGV"),
    (FailureFacts("p", containers=(exited(134),)), UNKNOWN, "Signal:SIGABRT"),
    (FailureFacts("p", containers=(exited(1),)), UNKNOWN, "ExitCode:1"),
    (FailureFacts("p", containers=(exited(2, init=True), ContainerExit("main"))), UNKNOWN, "ExitCode:2"),
    (FailureFacts("p", containers=(exited(255),)), UNKNOWN, "ExitCode:255"),
    (FailureFacts("p", reason="DeadlineExceeded"), UNKNOWN, "DeadlineExceeded"),
    (FailureFacts("p"), UNKNOWN, "Unknown"),
]


@pytest.mark.parametrize(("facts", "failure_class", "code"), DEFAULT_CASES)
def test_default_table_classifies_each_kind_of_failure(
    facts: FailureFacts, failure_class: FailureClass, code: str
) -> None:
    got = judge(facts)
    assert (got.failure_class, got.code) == (failure_class, code)


def test_every_default_row_is_reached_by_a_case() -> None:
    reached = {judge(facts).index for facts, _, _ in DEFAULT_CASES if judge(facts).source == "operator"}
    assert reached == set(range(len(DEFAULT_PATTERNS)))


def test_a_false_condition_does_not_match() -> None:
    facts = FailureFacts(
        "p", conditions=(PodCondition("DisruptionTarget", "False", "PreemptionByScheduler"),)
    )
    assert judge(facts).code == "Unknown"


def test_the_first_matching_row_wins_a_lost_node_over_a_preemption() -> None:
    facts = FailureFacts("p", node_state="NotReady", conditions=(disrupted("PreemptionByScheduler"),))
    assert judge(facts).code == "NodeLost"


def test_signal_names_are_linux_numbers_above_128() -> None:
    assert (signal_name(137), signal_name(143), signal_name(139)) == ("SIGKILL", "SIGTERM", "SIGSEGV")
    assert (signal_name(128), signal_name(1), signal_name(160), signal_name(255)) == ("", "", "", "")


def test_docs_describe_every_default_row() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "failures.md").read_text()
    table = doc.split("## The default table", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(DEFAULT_PATTERNS)
    for number, (row, pattern) in enumerate(zip(rows, DEFAULT_PATTERNS, strict=True)):
        assert row.startswith(f"| {number} |")
        assert f"`{pattern.failure_class}`" in row
        if pattern.code is not None:
            assert f"`{pattern.code}`" in row


# --- the upstream exit-code annotations win -----------------------------------------------------


def test_terminal_exit_code_is_permanent_even_when_the_table_says_transient() -> None:
    facts = FailureFacts("p", conditions=(disrupted("PreemptionByScheduler"),), containers=(exited(143),))
    got = judge(facts, {TW: "143"})
    assert (got.failure_class, got.code, got.source) == (PERMANENT, "ExitCode:143", "terminalExitCodes")


def test_an_exit_code_not_listed_as_retryable_is_permanent_as_upstream() -> None:
    got = judge(FailureFacts("p", containers=(exited(3),)), {RW: "1,2"})
    assert (got.failure_class, got.code, got.source) == (PERMANENT, "ExitCode:3", "retryableExitCodes")


def test_a_retryable_exit_code_is_never_permanent() -> None:
    got = judge(FailureFacts("p", containers=(exited(127),)), {RW: "127"})
    assert (got.failure_class, got.code, got.source) == (UNKNOWN, "ExitCode:127", "retryableExitCodes")
    # ... but the table still tells a transient one apart: it is retried either way.
    assert judge(FailureFacts("p", containers=(exited(137),)), {RW: "137"}).failure_class is TRANSIENT


def test_init_container_exit_codes_are_not_judged_by_the_upstream_annotations() -> None:
    facts = FailureFacts("p", containers=(exited(5, init=True), ContainerExit("main")))
    assert judge(facts, {TW: "5"}).source != "terminalExitCodes"


# --- workload patterns --------------------------------------------------------------------------


def test_a_workload_pattern_goes_ahead_of_the_default_table() -> None:
    facts = FailureFacts("p", containers=(exited(137),))
    annotations = {
        FAILURE_PATTERNS_ANNOTATION: '[{"signal": ["SIGKILL"], "class": "Permanent", "code": "Killed"}]'
    }
    got = judge(facts, annotations)
    assert (got.failure_class, got.code, got.source, got.index) == (PERMANENT, "Killed", "workload", 0)
    assert "workload failure pattern 0" in got.describe("p")


def test_a_workload_pattern_comes_after_the_terminal_exit_codes() -> None:
    facts = FailureFacts("p", containers=(exited(3),))
    annotations = {TW: "3", FAILURE_PATTERNS_ANNOTATION: "- {exitCodes: [3], class: Transient}"}
    assert judge(facts, annotations).failure_class is PERMANENT


def test_the_annotation_takes_yaml_and_the_versioned_form() -> None:
    value = """
version: 1
patterns:
  - exitCodes: [1, "10-19"]
    message: "NCCL (error|timeout)"
    class: Transient
    code: NcclError
  - condition: {type: DisruptionTarget, reason: "Preemption.*"}
    class: Permanent
"""
    parsed = workload_patterns({FAILURE_PATTERNS_ANNOTATION: value})
    assert parsed.error == ""
    assert parsed.patterns[0].exit_codes == ((1, 1), (10, 19))
    facts = FailureFacts("p", containers=(exited(12, message="NCCL timeout on rank 3"),))
    assert judge(facts, {FAILURE_PATTERNS_ANNOTATION: value}).code == "NcclError"
    assert judge(FailureFacts("p", containers=(exited(12, message="bad input"),))).code == "ExitCode:12"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "[{exitCodes: [1], class: Fatal}]",
            "[0].class: Input should be 'Transient', 'Permanent' or 'Unknown'",
        ),
        ("[{class: Transient}]", "[0]: a pattern must match on at least one of"),
        ('[{reason: "(", class: Unknown}]', "[0].reason: not a valid regular expression"),
        ("[{exitCodes: ['9-1'], class: Unknown}]", "[0].exitCodes: '9-1': a range must run from low to high"),
        ("[{exitCodes: [true], class: Unknown}]", "[0].exitCodes: True is not an exit code"),
        ("[{signal: [SIGFOO], class: Unknown}]", "[0].signal: 'SIGFOO' is not a Linux signal name"),
        (
            "[{reason: x, class: Unknown, code: 'has space'}]",
            "[0]: code 'has space' must start with a letter",
        ),
        ("[{reason: x, class: Unknown, colour: red}]", "[0].colour: Extra inputs are not permitted"),
        ("[{nodeState: [Gone], class: Unknown}]", "[0].nodeState[0]: Input should be"),
        ("[{message: '(a+)+$', class: Unknown}]", "[0].message: a repeat inside a repeat"),
        ("[{reason: '(x|y*)*', class: Unknown}]", "[0].reason: a repeat inside a repeat"),
        ("[42]", "[0]: a pattern is a mapping of fields, not int"),
        ("{version: 2, patterns: []}", "version 2 is not supported (only 1)"),
        ("{version: 1, rules: []}", "unknown key 'rules'"),
        (
            "{version: 1, patterns: [{class: Unknown}]}",
            "patterns[0]: a pattern must match on at least one of",
        ),
        ("just words", "expected a list of patterns"),
        ("[unclosed", "not valid JSON or YAML"),
        (json.dumps([{"reason": "x", "class": "Unknown"}] * (MAX_WORKLOAD_PATTERNS + 1)), "at most 32"),
        ("[" * 20000, "longer than 16384 bytes"),
    ],
)
def test_a_bad_annotation_is_refused_with_a_reason(value: str, expected: str) -> None:
    parsed = workload_patterns({FAILURE_PATTERNS_ANNOTATION: value})
    assert parsed.patterns == ()
    assert parsed.error.startswith(f"{FAILURE_PATTERNS_ANNOTATION} refused: ")
    assert expected in parsed.error


def test_deeply_nested_yaml_is_refused_not_raised() -> None:
    parsed = workload_patterns({FAILURE_PATTERNS_ANNOTATION: "[" * 10000})
    assert "not valid JSON or YAML" in parsed.error


def test_regular_expressions_without_nested_repeats_are_accepted() -> None:
    for expression in ["a+b+", "(ab)+", "NCCL (error|timeout)", "[a-z]+(x+)?", "(a|b)?c*", "(a{1})+"]:
        pattern = FailurePattern.model_validate({"message": expression, "class": "Unknown"})
        assert pattern.message == expression


def test_a_refused_annotation_leaves_the_default_table_in_force() -> None:
    facts = FailureFacts("p", containers=(exited(137),))
    assert judge(facts, {FAILURE_PATTERNS_ANNOTATION: "[{class: Permanent}]"}).code == "Signal:SIGKILL"


def test_no_annotation_means_no_workload_patterns() -> None:
    assert workload_patterns({}) == workload_patterns({"other": "x"})
    assert workload_patterns({}).patterns == () and workload_patterns({}).error == ""


# --- the operator's table ------------------------------------------------------------------------


def test_operator_patterns_go_ahead_of_the_defaults_or_replace_them(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("failures:\n  patterns:\n    - {reason: OOMKilled, class: Permanent}\n")
    config = load_config(path, env={})
    table = config.failures.table()
    assert table[1:] == DEFAULT_PATTERNS
    facts = FailureFacts("p", containers=(exited(137, "OOMKilled"),))
    assert classify(facts, exit_codes=exit_code_policy({}), table=table).failure_class is PERMANENT
    replaced = load_config(path, env={"RESPAWN_FAILURES_REPLACE_DEFAULT_PATTERNS": "true"}).failures.table()
    assert len(replaced) == 1
    evicted = FailureFacts("p", reason="Evicted")
    assert classify(evicted, exit_codes=exit_code_policy({}), table=replaced).code == "Evicted"
    assert classify(evicted, exit_codes=exit_code_policy({}), table=replaced).failure_class is UNKNOWN


def test_failures_config_defaults() -> None:
    failures = load_config(env={}).failures
    assert failures.table() == DEFAULT_PATTERNS == failure_table()
    assert failures.transient_retry_limit == 10
    assert failures.application_fault_window == timedelta(seconds=5)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RESPAWN_FAILURES_PATTERNS": "[{exitCodes: [1]}]"}, "failures.patterns[0].class: Field required"),
        (
            {"RESPAWN_FAILURES_PATTERNS": "[{message: '[', class: Unknown}]"},
            "failures.patterns[0].message: not a valid regular expression",
        ),
        ({"RESPAWN_FAILURES_TRANSIENT_RETRY_LIMIT": "-1"}, "failures.transientRetryLimit"),
        ({"RESPAWN_FAILURES_APPLICATION_FAULT_WINDOW": "-1s"}, "failures.applicationFaultWindow"),
        ({"RESPAWN_FAILURES_PATERNS": "[]"}, "unknown environment variable RESPAWN_FAILURES_PATERNS"),
    ],
)
def test_bad_failures_config_is_a_config_error_naming_the_key(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env=env)
    assert expected in str(caught.value)


def test_patterns_built_in_code_round_trip_through_their_serialized_form() -> None:
    for pattern in DEFAULT_PATTERNS:
        dumped = pattern.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert FailurePattern.model_validate(dumped) == pattern


# --- the retry budget ----------------------------------------------------------------------------


def test_permanent_fails_at_once() -> None:
    got = decide_retry(PERMANENT, resetting_count=0, retry_limit=3, transient_count=0, transient_limit=10)
    assert got.action is RetryAction.FAIL


def test_unknown_is_a_counted_retry_up_to_the_retry_limit() -> None:
    retries = [
        decide_retry(UNKNOWN, resetting_count=n, retry_limit=3, transient_count=0, transient_limit=10)
        for n in range(5)
    ]
    assert [(r.action, r.counted) for r in retries] == [(RetryAction.RETRY, True)] * 3 + [
        (RetryAction.FAIL, False)
    ] * 2
    assert decide_retry(
        UNKNOWN, resetting_count=0, retry_limit=0, transient_count=0, transient_limit=9
    ).action is (RetryAction.FAIL)


def test_transient_is_not_counted_until_its_own_limit_then_counts() -> None:
    free = decide_retry(TRANSIENT, resetting_count=3, retry_limit=3, transient_count=9, transient_limit=10)
    assert (free.action, free.counted) == (RetryAction.RETRY, False)
    counted = decide_retry(
        TRANSIENT, resetting_count=1, retry_limit=3, transient_count=10, transient_limit=10
    )
    assert (counted.action, counted.counted) == (RetryAction.RETRY, True)
    assert "transient retry limit (10) reached" in counted.message
    over = decide_retry(TRANSIENT, resetting_count=3, retry_limit=3, transient_count=10, transient_limit=10)
    assert over.action is RetryAction.FAIL


def test_an_endlessly_evicted_workload_ends() -> None:
    resetting = transient = retries = 0
    while True:
        got = decide_retry(
            TRANSIENT, resetting_count=resetting, retry_limit=3, transient_count=transient, transient_limit=10
        )
        if got.action is RetryAction.FAIL:
            break
        retries += 1
        if got.counted:
            resetting += 1
        else:
            transient += 1
    assert (retries, transient, resetting) == (13, 10, 3)


@pytest.mark.parametrize(
    ("value", "limit", "warned"),
    [
        ("4", 4, False),
        ("0", 0, False),
        ("-1", 10, True),
        ("x", 10, True),
        (" 4", 10, True),
        ("99999999999", 2**31 - 1, True),
    ],
)
def test_transient_retry_limit_annotation(value: str, limit: int, warned: bool) -> None:
    got = transient_retry_limit({TRANSIENT_RETRY_LIMIT_ANNOTATION: value}, 10)
    assert got.limit == limit
    assert bool(got.warning) == warned
    if warned:
        assert TRANSIENT_RETRY_LIMIT_ANNOTATION in got.warning
    assert transient_retry_limit({}, 7).limit == 7


# --- application vs infrastructure ---------------------------------------------------------------


def failure(
    pod: str, node: str, seconds: float | None, code: str = "ExitCode:1", cls: FailureClass = UNKNOWN
) -> PodFailure:
    at = None if seconds is None else T0 + timedelta(seconds=seconds)
    return PodFailure(pod=pod, node=node, code=code, failure_class=cls, failed_at=at)


def test_every_pod_failing_together_the_same_way_is_an_application_fault() -> None:
    got = attribute([failure("a", "n1", 0), failure("b", "n2", 4.5), failure("c", "n3", 2)], pods=3)
    assert (got.kind, got.nodes) == (FaultKind.APPLICATION, ())


def test_one_pod_failing_first_blames_its_node_only() -> None:
    failures = [failure("a", "n1", 0, "Signal:SIGSEGV"), failure("b", "n2", 30), failure("c", "n3", 31)]
    got = attribute(failures, pods=3)
    assert (got.kind, got.nodes) == (FaultKind.INFRASTRUCTURE, ("n1",))


def test_some_pods_failing_is_an_infrastructure_fault() -> None:
    got = attribute([failure("a", "n1", 0), failure("b", "n2", 1)], pods=4)
    assert (got.kind, got.nodes) == (FaultKind.INFRASTRUCTURE, ("n1", "n2"))
    assert "not every pod failed" in got.message


def test_different_codes_or_a_transient_failure_blame_nodes() -> None:
    mixed = attribute([failure("a", "n1", 0, "ExitCode:1"), failure("b", "n2", 1, "OOMKilled")], pods=2)
    assert (mixed.kind, mixed.nodes) == (FaultKind.INFRASTRUCTURE, ("n1", "n2"))
    lost = attribute(
        [failure("a", "n1", 0, "NodeLost", TRANSIENT), failure("b", "n1", 0, "NodeLost", TRANSIENT)], pods=2
    )
    assert (lost.kind, lost.nodes) == (FaultKind.INFRASTRUCTURE, ("n1",))


def test_the_window_decides_what_together_means() -> None:
    failures = [failure("a", "n1", 0), failure("b", "n2", 8)]
    assert attribute(failures, pods=2).kind is FaultKind.INFRASTRUCTURE
    assert attribute(failures, pods=2, window=timedelta(seconds=10)).kind is FaultKind.APPLICATION


def test_a_failure_without_a_time_is_blamed_and_prevents_an_application_verdict() -> None:
    got = attribute([failure("a", "n1", 0), failure("b", "n2", None), failure("c", "", 0)], pods=3)
    assert (got.kind, got.nodes) == (FaultKind.INFRASTRUCTURE, ("n1", "n2"))
    assert attribute([], pods=1).nodes == ()


def test_a_bad_pattern_in_the_config_file_stops_the_load_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "respawn.yaml"
    config.write_text(
        "failures:\n"
        "  patterns:\n"
        "    - reason: OOMKilled\n"
        "      class: Permanent\n"
        "    - exitCodes: ['9-1']\n"
        "      class: Transient\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config, env={})
    message = str(caught.value)
    assert message.startswith("invalid configuration")
    assert "failures.patterns[1].exitCodes: '9-1': a range must run from low to high" in message
