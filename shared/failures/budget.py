"""The retry budget: what to do with a failed attempt, given its class and the counts so far.

* ``Permanent``: fail at once; no retry can help.
* ``Unknown``: a counted retry, exactly as upstream retries every failure: while
  ``resettingCount < retryLimit``, reset and count it; then fail.
* ``Transient``: a retry that does not count toward ``retryLimit``, while the transient retries
  so far are below the transient retry limit. Past it, the failure is retried as an ``Unknown``
  one (counted), so a workload evicted again and again still ends: after at most
  ``transientRetryLimit + retryLimit`` retries in all.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.failures.patterns import FailureClass

__all__ = ["RetryAction", "RetryDecision", "decide_retry"]


class RetryAction(StrEnum):
    RETRY = "Retry"
    FAIL = "Fail"


@dataclass(frozen=True, slots=True)
class RetryDecision:
    action: RetryAction
    # Whether the retry counts toward retryLimit (resettingCount + 1) or toward the transient
    # limit (transient count + 1); meaningless for FAIL.
    counted: bool
    message: str


def decide_retry(
    failure_class: FailureClass,
    *,
    resetting_count: int,
    retry_limit: int,
    transient_count: int,
    transient_limit: int,
) -> RetryDecision:
    """Retry (counted or not) or fail, for an attempt that failed with ``failure_class``."""
    if failure_class is FailureClass.PERMANENT:
        return RetryDecision(RetryAction.FAIL, counted=False, message="permanent failure: not retried")
    if failure_class is FailureClass.TRANSIENT:
        if transient_count < transient_limit:
            return RetryDecision(
                RetryAction.RETRY,
                counted=False,
                message=f"transient failure: retry {transient_count + 1} of {transient_limit} transient "
                "retries, not counted toward the retry limit",
            )
        prefix = f"transient retry limit ({transient_limit}) reached; counted as any failure: "
    else:
        prefix = ""
    if resetting_count < retry_limit:
        return RetryDecision(
            RetryAction.RETRY, counted=True, message=f"{prefix}retry {resetting_count + 1} of {retry_limit}"
        )
    return RetryDecision(
        RetryAction.FAIL, counted=False, message=f"{prefix}retry limit ({retry_limit}) reached"
    )
