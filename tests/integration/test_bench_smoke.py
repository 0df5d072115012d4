"""The benchmark harness at small scale, against Respawn's services on the session testbed.

Asserts correctness only (exactly one reset per fault, resettingCount equal to the counted
faults, nothing left behind), never speed: the figures depend on the machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.config import BenchConfig, PlannedFault
from bench.correctness import VIOLATIONS
from bench.run import run_bench
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import SERVICES
from tests.integration.conftest import ServiceFactory

pytestmark = pytest.mark.testbed

# One fault of each kind, and a second pod failure while the first may still be in flight.
PLAN = (
    PlannedFault(0.0, "pod-failure"),
    PlannedFault(0.5, "evict"),
    PlannedFault(1.0, "stuck-init"),
    PlannedFault(1.5, "pod-failure"),
)


async def test_every_fault_is_reset_exactly_once_and_nothing_is_left_behind(
    testbed: Endpoints, appwrapper_crd: Path, service: ServiceFactory, namespace: str
) -> None:
    processes = {name: service(name).pid for name in SERVICES}
    cfg = BenchConfig(
        controller="respawn",
        # The smoke scale, N=100; 2 pods each (not 8) so that the workload fits the
        # session testbed's 4 nodes beside the other tests and the suite stays short.
        appwrappers=100,
        pods_per_aw=2,
        seed=7,
        gpu_fraction=0.1,
        warmup_grace="3s",
        idle_seconds=0,
        quiesce_seconds=1,
        setup_timeout=180,
        settle_timeout=90,
        cleanup_timeout=120,
        fault_plan=PLAN,
    )

    result = await run_bench(
        cfg,
        kubeconfig=testbed.kubeconfig,
        nats_url=testbed.nats_url,
        processes=processes,
        namespace=namespace,
    )

    faults = result["faults"]
    assert faults["settled"], result["correctness"]
    assert not faults["skipped"] and not faults["fell_back_to_pod_failure"], faults
    injected = faults["injected"]
    assert injected.get("pod-failure") == 2 and injected.get("stuck-init") == 1, injected
    assert injected.get("evict", 0) >= 1, injected  # one fault per AppWrapper on the labelled node
    assert faults["evictions"] == 1

    correctness = result["correctness"]
    for violation in VIOLATIONS:
        assert correctness[violation] == [], (violation, correctness[violation])
    assert correctness["ok"]

    # Exactly one reset per fault on every faulted AppWrapper; Autopilot resets are not counted.
    per_aw = correctness["per_appwrapper"]
    assert sum(aw["faults"] for aw in per_aw.values()) == len(result["records"])
    for name, aw in per_aw.items():
        assert aw["resets"] == aw["faults"], (name, aw)
        assert aw["resettingCount"] == aw["counted_faults"], (name, aw)
    stuck = [aw for name, aw in per_aw.items() if name.startswith("init-")]
    assert stuck == [{"faults": 1, "counted_faults": 1, "resets": 1, "resettingCount": 1, "phase": "Failed"}]

    # Every fault was detected and acted on, and each recoverable one ran again.
    for record in result["records"]:
        assert record["unhealthy_after_s"] is not None, record
        assert record["delete_after_s"] is not None, record
        if record["kind"] != "stuck-init":
            assert record["recovered_after_s"] is not None, record
        assert record["verdict_after_s"] is not None, record

    # The clean-up is counted on the bus too: at least every AppWrapper's tombstone was stored.
    assert result["cleanup_nats_messages"]["RESPAWN_OBSERVATIONS"] >= cfg.appwrappers, result[
        "cleanup_nats_messages"
    ]
