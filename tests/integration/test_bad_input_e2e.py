"""Bad input end to end: AppWrappers a careless or hostile user can create — nested deeper than
JSON decoders like, over NATS's payload limit, annotated with garbage — reach watcher, health
and lifecycle running as processes (no admission webhook here: with it they are refused at
admission, see test_webhook.py). Each one runs, or is reported to its owner; none stops the
services, and a normal AppWrapper beside them still gets its failure detected and reset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess
from shared.appwrapper import params
from shared.appwrapper.model import read_appwrapper
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import FAST_RESET, apply, events_when, running_pods, wait_phase
from tests.waiting import until

pytestmark = pytest.mark.testbed


def nested(levels: int) -> str:
    return '{"a": ' * levels + "{}" + "}" * levels


def deep(name: str, levels: int) -> str:
    """A Job AppWrapper whose Job template carries a field ``levels`` deep (the API server keeps
    it: the template is an opaque object to the CRD), as JSON text, since the test's own
    decoder could not write it."""
    aw = manifests.job_appwrapper(name, annotations=FAST_RESET, pod_annotations={sim.SUCCEED_AFTER: "600s"})
    return json.dumps(aw).replace(
        '"spec": {"parallelism"', f'"x-nested": {nested(levels)}, "spec": {{"parallelism"', 1
    )


def oversized(name: str) -> dict[str, Any]:
    """Over NATS's 1 MiB payload limit with its template alone (about 1.2 MB of environment)."""
    aw = manifests.job_appwrapper(name, annotations=FAST_RESET, pod_annotations={sim.SUCCEED_AFTER: "600s"})
    container = aw["spec"]["components"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": f"V{i}", "value": "x" * 1_000} for i in range(1_200)]
    return aw


GARBAGE = {
    params.RETRY_LIMIT_ANNOTATION: "three",
    params.FAILURE_GRACE_PERIOD_ANNOTATION: "-5x",
    params.WARMUP_GRACE_PERIOD_ANNOTATION: "9" * 400 + "h",
    params.TERMINAL_EXIT_CODES_ANNOTATION: "1,two,,\u0000",
    "respawn.dev/whatever": "\u202e" + "z" * 100_000,
}


@pytest.fixture
def services(appwrapper_crd: Path, service: ServiceFactory) -> Iterator[list[ServiceProcess]]:
    yield [service(name) for name in ("watcher", "health", "lifecycle")]


async def test_bad_appwrappers_run_or_are_reported_and_a_normal_one_beside_them_is_still_reset(
    testbed: Endpoints, namespace: str, services: list[ServiceProcess], tmp_path: Path
) -> None:
    kc = testbed.kubeconfig
    for name, levels in (("deep", 300), ("deeper", 990)):
        manifest = tmp_path / f"{name}.json"
        manifest.write_text(deep(name, levels))
        kubectl(kc, "create", "-n", namespace, "-f", str(manifest))
    big = tmp_path / "oversized.json"
    big.write_text(json.dumps(oversized("oversized")))
    assert big.stat().st_size > 1024 * 1024
    kubectl(kc, "create", "-n", namespace, "-f", str(big), timeout=120)
    garbage = manifests.job_appwrapper(
        "garbage", annotations={**FAST_RESET, **GARBAGE}, pod_annotations={sim.SUCCEED_AFTER: "600s"}
    )
    apply(kc, namespace, garbage)
    normal = manifests.job_appwrapper(
        "normal", pods=2, annotations=FAST_RESET, pod_annotations={sim.SUCCEED_AFTER: "15s"}
    )
    apply(kc, namespace, normal)

    # Each bad one runs (Running, its pods with it), or fails saying why: never silence, never a
    # service down.
    outcomes = {
        name: await settled(kc, namespace, name) for name in ("deep", "deeper", "oversized", "garbage")
    }
    print(outcomes)  # what each bad input came to, in the test's output
    assert {name: o.split(":")[0] for name, o in outcomes.items()} == {
        "deep": "Running",
        "oversized": "Running",
        "garbage": "Running",
        "deeper": "Failed",  # 990 levels: more than lifecycle copies (templating.MAX_TEMPLATE_DEPTH)
    }, outcomes
    assert "levels deep" in outcomes["deeper"], outcomes
    for name in ("deep", "oversized", "garbage"):
        await until(f"{name}'s pod running", partial(running_pods, kc, namespace, name), within=60)
    keys = (params.RETRY_LIMIT_ANNOTATION, params.FAILURE_GRACE_PERIOD_ANNOTATION)

    def told(events: list[dict[str, Any]]) -> str:
        return " ".join(e["message"] for e in events if e["reason"] == "InvalidValue")

    await events_when(
        kc, namespace, "garbage", f"InvalidValue naming {keys}", lambda es: all(k in told(es) for k in keys)
    )

    # The normal one beside them: a pod failure is detected and reset, and it succeeds.
    await wait_phase(kc, namespace, "normal", "Running", within=60)
    pods = await until(
        "normal's two pods running",
        partial(running_pods, kc, namespace, "normal"),
        done=lambda p: len(p) == 2,
    )
    sim.fail_pod(kc, namespace, pods[0]["metadata"]["name"])
    done = await wait_phase(kc, namespace, "normal", "Succeeded", within=90)
    assert read_appwrapper(done).resetting_count == 1
    # And nothing the bad ones did stopped a service.
    assert [sp.name for sp in services if not sp.alive()] == []
    # They all go, too: deletion handles them as any other (and leaves no finalizer behind).
    kubectl(kc, "delete", "appwrappers", "--all", "-n", namespace, "--wait=false")
    await until(
        "every AppWrapper deleted",
        lambda: kubectl(kc, "get", "appwrappers", "-n", namespace, "-o", "name").stdout.strip(),
        done=lambda left: left == "",
        within=90,
    )


def _outcome(kc: Path, namespace: str, name: str) -> str:
    """ "Running", "Failed: <why>", or "" while neither."""
    # jsonpath: the test's own JSON decoder has the default recursion limit.
    path = '{.status.phase}{"|"}{.status.conditions[?(@.type=="Unhealthy")].message}'
    out = kubectl(kc, "get", "appwrapper", name, "-n", namespace, "-o", f"jsonpath={path}", check=False)
    phase, _, why = out.stdout.partition("|")
    if phase == "Failed":
        return f"Failed: {why}"
    return phase if phase == "Running" else ""


async def settled(kc: Path, namespace: str, name: str) -> str:
    found: str = await until(f"{name} Running or Failed", partial(_outcome, kc, namespace, name), within=90)
    return found
