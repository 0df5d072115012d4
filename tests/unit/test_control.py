"""respawn.dev/stop and respawn.dev/completion-policy: parsing, and refusal at admission."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from services.webhook.admission import validation_response
from shared.appwrapper.control import (
    CompletionPolicy,
    completion_policy,
    parse_completion_policy,
    parse_stop,
    stop_requested,
)
from tests.unit.test_admission import allow_all, appwrapper, job, mutated, request_for, validating


def test_stop_values() -> None:
    assert parse_stop("true") is True
    assert parse_stop("false") is False
    for bad in ("True", "yes", "1", "", None):
        with pytest.raises(ValueError, match='must be "true" or "false"'):
            parse_stop(bad)
    assert stop_requested({"annotations": {"respawn.dev/stop": "true"}})
    assert not stop_requested({"annotations": {"respawn.dev/stop": "yes"}})
    assert not stop_requested({})


def test_completion_policy_in_json_and_yaml() -> None:
    expected = CompletionPolicy(min_succeeded={0: 1}, min_failed={1: 2})
    assert parse_completion_policy('{"0": {"minSucceeded": 1}, "1": {"minFailed": 2}}') == expected
    assert parse_completion_policy("0: {minSucceeded: 1}\n1:\n  minFailed: 2\n") == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1]", "must be an object keyed by pod set index"),
        ('{"x": {"minSucceeded": 1}}', "'x' is not a pod set index"),
        ('{"0": {"minSucceeded": 0}}', "pod set 0 minSucceeded must be a whole number of at least 1"),
        ('{"0": {"minFailed": true}}', "pod set 0 minFailed must be a whole number"),
        ('{"0": {"minSucceded": 1}}', "unknown key(s) minSucceded"),
        ('{"0": {}}', "must be an object with minSucceeded and/or minFailed"),
        ('{"0": ', "is not valid JSON or YAML"),
        ('{"8": {"minFailed": 2}}', "pod set 8 does not exist"),
    ],
)
def test_a_bad_completion_policy_names_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_completion_policy(text)
    assert problem in str(caught.value)


def test_a_completion_policy_for_a_pod_set_the_appwrapper_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"pod set 2 does not exist \(the AppWrapper has 2 pod sets\)"):
        parse_completion_policy('{"2": {"minFailed": 2}}', 2)


def test_thresholds() -> None:
    policy = CompletionPolicy(min_succeeded={0: 1}, min_failed={1: 2})
    assert policy.succeeded_by({0: 1}) == 0
    assert policy.succeeded_by({1: 5}) is None
    assert not policy.failed_enough(1, 1) and policy.failed_enough(1, 2)
    assert policy.failed_enough(0, 1) and policy.failed_enough(None, 1)
    assert completion_policy({}) == (None, "")
    none, warning = completion_policy({"respawn.dev/completion-policy": "[]"})
    assert none is None and "using the default completion policy" in warning


def annotated(**annotations: str) -> dict[str, Any]:
    obj = appwrapper(job(), job())
    obj["metadata"]["annotations"] = dict(annotations)
    return obj


def test_admission_refuses_a_bad_stop_value_and_a_bad_policy_with_the_reason() -> None:
    request = validating(annotated(**{"respawn.dev/stop": "yes"}))
    response = validation_response(request, allow_all(request))
    assert not response.allowed
    assert 'metadata.annotations[respawn.dev/stop]: Invalid: respawn.dev/stop must be "true" or "false"' in (
        response.message
    )
    request = validating(annotated(**{"respawn.dev/completion-policy": '{"2": {"minSucceeded": 1}}'}))
    response = validation_response(request, allow_all(request))
    assert not response.allowed
    assert "pod set 2 does not exist (the AppWrapper has 2 pod sets)" in response.message


def test_admission_accepts_good_values_and_checks_them_on_update_too() -> None:
    good = annotated(
        **{"respawn.dev/stop": "false", "respawn.dev/completion-policy": '{"1": {"minSucceeded": 1}}'}
    )
    request = validating(good)
    assert validation_response(request, allow_all(request)).allowed
    old = mutated(good)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["respawn.dev/stop"] = "please"
    response = validation_response(request_for(new, operation="UPDATE", old=old), {})
    assert not response.allowed and "respawn.dev/stop" in response.message
    new["metadata"]["annotations"]["respawn.dev/stop"] = "true"
    assert validation_response(request_for(new, operation="UPDATE", old=old), {}).allowed
