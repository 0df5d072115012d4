"""The announced record written later (``lifecycle.recordDelay``), with the real lifecycle service:
a process killed with a record owed leaves the next one to re-send the transition's
announcements, which their ids make no copies of, and to write the record; an AppWrapper
deleted before its record was due is never patched for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from services.lifecycle import announcements
from shared.appwrapper.constants import ANNOUNCED_ANNOTATION
from tests.integration.conftest import ServiceFactory
from tests.integration.healthfeed import metric
from tests.integration.objects import FAST_RESET, apply, events_when, get_appwrapper, wait_phase
from tests.integration.test_lifecycle_hardening import announced
from tests.waiting import until

pytestmark = pytest.mark.testbed

NAME = "late-record"


def _lifecycle_env(delay: str) -> dict[str, str]:
    # Alone, lifecycle is woken by its watches and its resync (made short), not by verdicts.
    return {"RESPAWN_LIFECYCLE_RECORD_DELAY": delay, "RESPAWN_LIFECYCLE_RESYNC_PERIOD": "2s"}


async def _running_and_announced(testbed: Endpoints, namespace: str) -> dict[str, Any]:
    await wait_phase(testbed.kubeconfig, namespace, NAME, "Running", within=60)

    async def running_announced() -> bool:
        return any(m.phase == "Running" for m in await announced(testbed.nats_url, namespace, NAME))

    await until("the Running announcement", running_announced, within=30)
    aw = get_appwrapper(testbed.kubeconfig, namespace, NAME)
    assert aw is not None
    return aw


async def test_a_kill_with_the_record_still_owed_costs_a_re_send_and_no_copy(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    first = service("lifecycle", env=_lifecycle_env("60s"))
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST_RESET))
    aw = await _running_and_announced(testbed, namespace)
    # Announced, and the record not written yet: it waits its 60 s.
    assert ANNOUNCED_ANNOTATION not in (aw["metadata"].get("annotations") or {})
    first.kill()

    second = service("lifecycle", instance="b", env=_lifecycle_env("1s"))
    transition = announcements.transition_of(aw)
    assert transition is not None
    await until(
        "the record of the Running transition",
        lambda: get_appwrapper(testbed.kubeconfig, namespace, NAME),
        done=lambda found: (
            found is not None
            and (found["metadata"].get("annotations") or {}).get(ANNOUNCED_ANNOTATION) == transition.marker
        ),
        within=60,
    )
    # The second process did re-send (the record was missing) ...
    resent = metric(second, "respawn_lifecycle_announcements_total", kind="message", outcome="duplicate")
    assert resent >= 1
    # ... and each announcement is there once.
    phases = [
        m.phase for m in await announced(testbed.nats_url, namespace, NAME) if m.event == "PhaseChanged"
    ]
    assert phases.count("Resuming") == 1 and phases.count("Running") == 1, phases
    events = await events_when(
        testbed.kubeconfig,
        namespace,
        NAME,
        "Resuming and Running",
        lambda es: {"Resuming", "Running"} <= {e["reason"] for e in es},
    )
    reasons = [e["reason"] for e in events]
    assert reasons.count("Resuming") == 1 and reasons.count("Running") == 1, reasons
    # Counted once the write is answered, a moment after the API server has it.
    await until(
        "the record counted as written",
        lambda: metric(second, "respawn_lifecycle_announced_records_total", outcome="written"),
        done=lambda written: written >= 1,
        within=10,
    )


async def test_an_appwrapper_deleted_before_its_record_was_due_is_never_patched_for_it(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    lifecycle = service("lifecycle", env=_lifecycle_env("60s"))
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper(NAME, annotations=FAST_RESET))
    await _running_and_announced(testbed, namespace)
    kubectl(testbed.kubeconfig, "delete", "appwrapper", NAME, "-n", namespace, "--wait=false")
    await until(
        "the AppWrapper to be gone",
        lambda: get_appwrapper(testbed.kubeconfig, namespace, NAME),
        done=lambda found: found is None,
        within=60,
    )
    # Its records (Running, then Terminating) were owed and dropped with it, none written. The
    # drop is counted as its last pass ends, a moment after the API server let it go.
    await until(
        "the owed record counted as dropped",
        lambda: metric(lifecycle, "respawn_lifecycle_announced_records_total", outcome="dropped"),
        done=lambda dropped: dropped >= 1,
        within=10,
    )
    assert metric(lifecycle, "respawn_lifecycle_announced_records_total", outcome="written") == 0
    await events_when(
        testbed.kubeconfig,
        namespace,
        NAME,
        "Terminating",
        lambda es: "Terminating" in {e["reason"] for e in es},
    )
