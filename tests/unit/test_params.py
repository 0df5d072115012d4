"""Per-AppWrapper annotation overrides: upstream's resolution rules, and a warning per ignored value."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.appwrapper.params import (
    ADMISSION_GRACE_PERIOD_ANNOTATION,
    DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION,
    FAILURE_GRACE_PERIOD_ANNOTATION,
    FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION,
    RETRY_LIMIT_ANNOTATION,
    RETRY_PAUSE_PERIOD_ANNOTATION,
    RETRYABLE_EXIT_CODES_ANNOTATION,
    SUCCESS_TTL_ANNOTATION,
    TERMINAL_EXIT_CODES_ANNOTATION,
    WARMUP_GRACE_PERIOD_ANNOTATION,
    ExitCodePolicy,
    effective_fault_tolerance,
    exit_code_policy,
)
from shared.faulttolerance import FaultTolerance

DEFAULTS = FaultTolerance()
P = "workload.codeflare.dev.appwrapper/"


def test_annotation_keys_match_upstream_byte_for_byte() -> None:
    assert [
        ADMISSION_GRACE_PERIOD_ANNOTATION,
        WARMUP_GRACE_PERIOD_ANNOTATION,
        FAILURE_GRACE_PERIOD_ANNOTATION,
        RETRY_PAUSE_PERIOD_ANNOTATION,
        RETRY_LIMIT_ANNOTATION,
        DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION,
        FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION,
        SUCCESS_TTL_ANNOTATION,
        TERMINAL_EXIT_CODES_ANNOTATION,
        RETRYABLE_EXIT_CODES_ANNOTATION,
    ] == [
        P + "admissionGracePeriodDuration",
        P + "warmupGracePeriodDuration",
        P + "failureGracePeriodDuration",
        P + "retryPausePeriodDuration",
        P + "retryLimit",
        P + "deletionOnFailureGracePeriodDuration",
        P + "forcefulDeletionGracePeriodDuration",
        P + "successTTLDuration",
        P + "terminalExitCodes",
        P + "retryableExitCodes",
    ]


def test_unannotated_appwrappers_use_the_defaults() -> None:
    result = effective_fault_tolerance({"unrelated": "x"}, DEFAULTS)
    assert result.ft == DEFAULTS
    assert result.warnings == ()


PERIODS = [
    (ADMISSION_GRACE_PERIOD_ANNOTATION, "admission_grace"),
    (WARMUP_GRACE_PERIOD_ANNOTATION, "warmup_grace"),
    (FAILURE_GRACE_PERIOD_ANNOTATION, "failure_grace"),
    (RETRY_PAUSE_PERIOD_ANNOTATION, "retry_pause"),
    (DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION, "deletion_on_failure_grace"),
    (FORCEFUL_DELETION_GRACE_PERIOD_ANNOTATION, "forceful_deletion_grace"),
]


@pytest.mark.parametrize(("key", "field"), PERIODS)
@pytest.mark.parametrize(
    ("value", "expected", "warning_fragment"),
    [
        ("10s", timedelta(seconds=10), None),
        ("1h30m", timedelta(hours=1, minutes=30), None),
        ("0", timedelta(0), None),
        ("24h", timedelta(hours=24), None),
        ("-5m", timedelta(0), "is negative; using 0s"),
        ("25h", timedelta(hours=24), "exceeds the grace period maximum 24h0m0s; using 24h0m0s"),
        ("7d", None, "unknown unit 'd'"),
        ("", None, "invalid Go duration ''"),
        ("ten seconds", None, "invalid Go duration 'ten seconds'"),
    ],
)
def test_grace_period_annotations(
    key: str, field: str, value: str, expected: timedelta | None, warning_fragment: str | None
) -> None:
    result = effective_fault_tolerance({key: value}, DEFAULTS)
    default: timedelta = getattr(DEFAULTS, field)
    assert getattr(result.ft, field) == (default if expected is None else expected)
    # No other parameter moves.
    assert replace(result.ft, **{field: default}) == DEFAULTS
    if warning_fragment is None:
        assert result.warnings == ()
    else:
        assert len(result.warnings) == 1
        assert key in result.warnings[0]
        assert warning_fragment in result.warnings[0]
        if expected is None:
            assert repr(value) in result.warnings[0], "a malformed value is named in the warning"
            assert "using the default" in result.warnings[0]


def test_defaults_above_the_maximum_are_clamped_like_annotations() -> None:
    defaults = FaultTolerance(warmup_grace=timedelta(hours=30), grace_period_maximum=timedelta(hours=2))
    assert effective_fault_tolerance({}, defaults).ft.warmup_grace == timedelta(hours=2)


def test_a_lower_maximum_caps_annotations() -> None:
    defaults = FaultTolerance(grace_period_maximum=timedelta(minutes=10))
    result = effective_fault_tolerance({FAILURE_GRACE_PERIOD_ANNOTATION: "11m"}, defaults)
    assert result.ft.failure_grace == timedelta(minutes=10)
    assert "exceeds the grace period maximum 10m0s" in result.warnings[0]


def test_malformed_deletion_on_failure_falls_back_to_zero_by_default() -> None:
    result = effective_fault_tolerance({DELETION_ON_FAILURE_GRACE_PERIOD_ANNOTATION: "soon"}, DEFAULTS)
    assert result.ft.deletion_on_failure_grace == timedelta(0)
    assert "using the default 0s" in result.warnings[0]


@pytest.mark.parametrize(
    ("value", "expected", "warning_fragment"),
    [
        ("2", 2, None),
        ("0", 0, None),
        ("+4", 4, None),
        ("100", 100, None),
        ("-1", 0, "is negative; using 0"),
        ("3.0", 3, "is not an integer; using the default 3"),
        (" 2", 3, "is not an integer"),
        ("1_000", 3, "is not an integer"),
        ("two", 3, "is not an integer"),
        ("", 3, "is not an integer"),
        ("99999999999", (1 << 31) - 1, "is too large"),
        ("99999999999999999999", 3, "is not an integer"),
    ],
)
def test_retry_limit(value: str, expected: int, warning_fragment: str | None) -> None:
    result = effective_fault_tolerance({RETRY_LIMIT_ANNOTATION: value}, DEFAULTS)
    assert result.ft.retry_limit == expected
    if warning_fragment is None:
        assert result.warnings == ()
    else:
        assert len(result.warnings) == 1
        assert RETRY_LIMIT_ANNOTATION in result.warnings[0]
        assert repr(value) in result.warnings[0]
        assert warning_fragment in result.warnings[0]


@pytest.mark.parametrize(
    ("value", "expected", "warning_fragment"),
    [
        ("1h", timedelta(hours=1), None),
        ("167h", timedelta(hours=167), None),
        # Equal to the default: no change, nothing to warn about.
        ("168h", timedelta(days=7), None),
        # Success TTL is not subject to the grace period maximum.
        ("48h", timedelta(hours=48), None),
        ("169h", timedelta(days=7), "may only shorten"),
        ("0s", timedelta(days=7), "is not positive"),
        ("-1h", timedelta(days=7), "is not positive"),
        ("7d", timedelta(days=7), "unknown unit 'd'"),
    ],
)
def test_success_ttl_may_only_shorten(value: str, expected: timedelta, warning_fragment: str | None) -> None:
    result = effective_fault_tolerance({SUCCESS_TTL_ANNOTATION: value}, DEFAULTS)
    assert result.ft.success_ttl == expected
    if warning_fragment is None:
        assert result.warnings == ()
    else:
        assert len(result.warnings) == 1
        assert SUCCESS_TTL_ANNOTATION in result.warnings[0]
        assert warning_fragment in result.warnings[0]


def test_several_annotations_apply_together_and_warnings_keep_annotation_order() -> None:
    result = effective_fault_tolerance(
        {
            SUCCESS_TTL_ANNOTATION: "nope",
            FAILURE_GRACE_PERIOD_ANNOTATION: "10s",
            RETRY_LIMIT_ANNOTATION: "x",
            ADMISSION_GRACE_PERIOD_ANNOTATION: "bad",
            RETRY_PAUSE_PERIOD_ANNOTATION: "5s",
        },
        DEFAULTS,
    )
    assert result.ft == replace(
        DEFAULTS, failure_grace=timedelta(seconds=10), retry_pause=timedelta(seconds=5)
    )
    assert [w.split(":")[0].split("=")[0] for w in result.warnings] == [
        ADMISSION_GRACE_PERIOD_ANNOTATION,
        RETRY_LIMIT_ANNOTATION,
        SUCCESS_TTL_ANNOTATION,
    ]


def test_non_string_annotation_values_are_reported_not_raised() -> None:
    annotations: dict[str, object] = {FAILURE_GRACE_PERIOD_ANNOTATION: 10, RETRY_LIMIT_ANNOTATION: 2}
    result = effective_fault_tolerance(annotations, DEFAULTS)  # type: ignore[arg-type]
    assert result.ft == DEFAULTS
    assert len(result.warnings) == 2


# ------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("annotations", "terminal", "retryable", "n_warnings"),
    [
        ({}, set(), set(), 0),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "3,10,42"}, {3, 10, 42}, set(), 0),
        # Upstream's own unit-test vector: unparseable entries are dropped.
        ({TERMINAL_EXIT_CODES_ANNOTATION: "3,10,abc,42"}, {3, 10, 42}, set(), 1),
        # Atoi does not trim: " 10" is dropped upstream, so it is here (with a warning).
        ({TERMINAL_EXIT_CODES_ANNOTATION: "3, 10"}, {3}, set(), 1),
        ({RETRYABLE_EXIT_CODES_ANNOTATION: "1,+2,-3"}, set(), {1, 2, -3}, 0),
        ({RETRYABLE_EXIT_CODES_ANNOTATION: ""}, set(), set(), 1),
        ({TERMINAL_EXIT_CODES_ANNOTATION: "x", RETRYABLE_EXIT_CODES_ANNOTATION: "y,z"}, set(), set(), 3),
    ],
)
def test_exit_code_parsing(
    annotations: dict[str, str], terminal: set[int], retryable: set[int], n_warnings: int
) -> None:
    policy = exit_code_policy(annotations)
    assert policy.terminal == frozenset(terminal)
    assert policy.retryable == frozenset(retryable)
    assert len(policy.warnings) == n_warnings
    for warning in policy.warnings:
        assert "ignored" in warning


def test_exit_code_warning_names_annotation_and_entry() -> None:
    (warning,) = exit_code_policy({TERMINAL_EXIT_CODES_ANNOTATION: "3,abc"}).warnings
    assert TERMINAL_EXIT_CODES_ANNOTATION in warning
    assert "'abc'" in warning


@pytest.mark.parametrize(
    ("policy", "exit_code", "terminal"),
    [
        (ExitCodePolicy(), 1, False),
        (ExitCodePolicy(), 0, False),
        (ExitCodePolicy(terminal=frozenset({42})), 42, True),
        (ExitCodePolicy(terminal=frozenset({42})), 1, False),
        # Exit code 0 is never a failure, even if listed.
        (ExitCodePolicy(terminal=frozenset({0})), 0, False),
        (ExitCodePolicy(retryable=frozenset({1, 2})), 1, False),
        (ExitCodePolicy(retryable=frozenset({1, 2})), 3, True),
        (ExitCodePolicy(retryable=frozenset({1, 2})), 0, False),
        # Listed in both: the terminal list wins.
        (ExitCodePolicy(terminal=frozenset({2}), retryable=frozenset({1, 2})), 2, True),
        (ExitCodePolicy(terminal=frozenset({2}), retryable=frozenset({1, 2})), 1, False),
    ],
)
def test_exit_code_classification(policy: ExitCodePolicy, exit_code: int, terminal: bool) -> None:
    assert policy.is_terminal(exit_code) is terminal
