"""Which failed requests the Kubernetes layer tries again in place, and after how long
(shared.kube.client.retry_delay); against the real API server through the fault proxy:
tests/integration/test_apiserver_faults.py."""

from __future__ import annotations

import pytest

from shared.kube.client import KubeApiError, RetryPolicy, retry_after_of, retry_delay

POLICY = RetryPolicy(retries=3, base=0.1, max_wait=2.0)


def error(status: int, reason: str = "", *, retry_after: float | None = None) -> KubeApiError:
    return KubeApiError(status, reason, "", retry_after=retry_after)


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_a_request_turned_away_is_tried_again_whatever_the_verb_after_the_wait_asked(method: str) -> None:
    assert retry_delay(method, error(429, retry_after=1.0), 0, POLICY) == 1.0
    assert retry_delay(method, error(503, retry_after=2.0), 0, POLICY) == 2.0
    # A 429 without Retry-After was not acted on either: a short backoff.
    delay = retry_delay(method, error(429), 0, POLICY)
    assert delay is not None and 0.05 <= delay <= 0.1


@pytest.mark.parametrize("status", [500, 502, 503, 504, 0])
def test_a_failure_the_server_may_have_acted_on_is_repeated_only_for_a_read(status: int) -> None:
    failure = error(status, "Unavailable" if status == 0 else "")
    for attempt in range(3):
        delay = retry_delay("GET", failure, attempt, POLICY)
        assert delay is not None and 0.1 * 2**attempt / 2 <= delay <= 0.1 * 2**attempt
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert retry_delay(method, failure, 0, POLICY) is None


def test_no_retry_past_the_budget_or_for_a_longer_wait_than_allowed() -> None:
    assert retry_delay("GET", error(429, retry_after=1.0), 3, POLICY) is None
    assert retry_delay("GET", error(429, retry_after=5.0), 0, POLICY) is None  # the caller's to wait


@pytest.mark.parametrize(
    "failure",
    [
        error(404),
        error(409),
        error(422),
        error(403),
        error(0, "Undecodable"),
        error(0, "Timeout"),  # it has had its time
    ],
)
def test_what_a_retry_cannot_change_is_raised_at_once(failure: KubeApiError) -> None:
    assert retry_delay("GET", failure, 0, POLICY) is None


def test_the_wait_comes_from_the_header_else_from_the_status_details() -> None:
    assert retry_after_of({"Retry-After": "3"}, {}) == 3.0
    assert retry_after_of({"Retry-After": "3"}, {"details": {"retryAfterSeconds": 9}}) == 3.0
    assert retry_after_of({}, {"details": {"retryAfterSeconds": 9}}) == 9.0
    # An HTTP date, junk, or nothing: no wait named.
    assert retry_after_of({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, {}) is None
    assert retry_after_of(None, {"details": {"retryAfterSeconds": "soon"}}) is None
    assert retry_after_of(None, {"details": []}) is None
