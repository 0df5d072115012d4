"""Resets under way, by AppWrapper: their trace context, and which keys the work queue puts first.

A reset spans several reconcile passes (the Resetting status, each deletion stage, the
recreation), most of them triggered by observations and timers rather than by the verdict that
started it. Each pass rejoins the trace of the verdict, so one incident is one trace from the
failure to the workload running again.
"""

from __future__ import annotations

from opentelemetry import context as otel_context

from services.lifecycle.machine import Plan
from services.lifecycle.workqueue import Key
from shared.appwrapper.constants import Phase

__all__ = ["Incidents"]

# Phases that end an incident's trace (besides Running again after a reset).
_ENDS = (Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED)


class Incidents:
    def __init__(self) -> None:
        self._traces: dict[Key, otel_context.Context] = {}

    def __contains__(self, key: Key) -> bool:
        """Whether ``key`` is in the middle of a reset."""
        return key in self._traces

    def context(self, key: Key) -> otel_context.Context | None:
        """The trace context of the reset under way, if any."""
        return self._traces.get(key)

    def track(self, key: Key, plan: Plan, *, was: str) -> None:
        """After ``plan`` was carried out (in the current trace context) on an AppWrapper in
        phase ``was``: remember the trace of a reset it started, forget the one it ended."""
        if plan.phase == was:
            return
        if plan.phase == Phase.RESETTING:
            self._traces[key] = otel_context.get_current()
        elif plan.phase in _ENDS:
            self._traces.pop(key, None)
