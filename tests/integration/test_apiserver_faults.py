"""Respawn end to end while the Kubernetes API server answers 429 and 5xx and drops watches.

watcher, health, lifecycle and autopilot run as their own processes and reach the API server
only through the fault proxy (:mod:`tests.integration.faultproxy`), which turns away a quarter
of their requests (429 with ``Retry-After``, 500, 503, with the API server's ``Status`` bodies)
and cuts a share of their watches mid-stream. Workloads submitted meanwhile must still come out
exactly as on a healthy server: each injected pod failure reset once (none lost, none doubled),
a workload without a fault never reset, and nothing left behind once they are deleted. The
test itself talks to the API server directly.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess
from services.lifecycle.failures import RECONCILE_ERROR_EVENT
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.kube import Kube, KubeApiError
from shared.kube.client import retry_delay
from shared.messages import LifecycleEvent
from tests.integration.conftest import ServiceFactory
from tests.integration.faultproxy import CUT, DROP, Fault, FaultPolicy, FaultProxy, Tally, for_testbed
from tests.integration.objects import (
    FAST_RESET,
    apply,
    events_of,
    get_appwrapper,
    jobs,
    running_pods,
    wait_phase,
)
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

SERVICES = ("watcher", "health", "lifecycle", "autopilot")
# The services that talk to the API server (health and autopilot work from the bus alone).
KUBE_CLIENTS = ("watcher", "lifecycle")
FAULTY = ("f1", "f2", "f3", "f4")
CLEAN = "clean"
# A workload's pods succeed this long after they start running: long enough to fail the first
# attempt's pod before it finishes (the test reads through kubectl, slowly on a loaded machine),
# short enough for the second attempt to end soon.
RUN_FOR = "30s"
# More requests than this per second from one service would be retrying without a pause.
MAX_REQUEST_RATE = 40.0


@pytest.fixture
def proxy(testbed: Endpoints) -> Iterator[FaultProxy]:
    """A quarter of the requests fail (429, 500, 503 and, half as often, dropped unanswered), and
    three watches in ten are cut 0.5-3 s in."""
    policy = FaultPolicy(seed=20240611, rate=0.25, cut_rate=0.3, cut_after=(0.5, 3.0))
    running = for_testbed(testbed, policy)
    yield running
    running.stop()


# ------------------------------------------------------------------ the Kubernetes layer


async def test_the_kube_layer_tries_again_what_the_server_turned_away_and_only_that(
    namespace: str, scripted: FaultProxy, tmp_path: Path
) -> None:
    kube = await Kube.connect(scripted.kubeconfig(tmp_path, client="test"))
    queue, tally = scripted.policy.queue, scripted.tally
    configmaps = await kube.resource("v1", "ConfigMap")

    def sent(verb: str) -> collections.Counter[str]:
        """What the proxy did with this test's requests of ``verb`` on ConfigMaps."""
        counts = tally.counts().items()
        return collections.Counter({o: n for (_, r, v, o), n in counts if (r, v) == ("configmaps", verb)})

    try:
        # Turned away (429 with Retry-After, 503, no answer): a read is tried again until it is answered.
        queue(Fault("429"), Fault("503"), Fault(DROP))
        listed = (await kube.list(configmaps, namespace))["items"]
        assert [c["metadata"]["name"] for c in listed] == ["kube-root-ca.crt"]
        assert sent("list") == {"429": 1, "503": 1, DROP: 1, "forwarded": 1}

        # A write turned away with 429 was not acted on: tried again, and made once.
        queue(Fault("429"))
        await kube.create(configmaps, {"metadata": {"name": "once"}, "data": {}}, namespace)
        assert sent("create") == {"429": 1, "forwarded": 1}

        # A write that failed with a 500 or lost its connection may have been acted on: the
        # caller decides (an error it can tell as transient, not a client library's exception).
        for fault in (Fault("500"), Fault(DROP)):
            queue(fault)
            with pytest.raises(KubeApiError) as failed:
                await kube.create(configmaps, {"metadata": {"name": "maybe"}, "data": {}}, namespace)
            assert failed.value.transient
        assert sent("create") == {"429": 1, "500": 1, DROP: 1, "forwarded": 1}

        # Only a few tries: a server that keeps refusing is the caller's to wait out.
        queue(*[Fault("503")] * 4)
        with pytest.raises(KubeApiError) as refused:
            await kube.get(configmaps, "once", namespace)
        assert refused.value.status == 503
        assert sent("get") == {"503": 4}
    finally:
        await kube.close()


# ------------------------------------------------------------------ the services


def metric(process: ServiceProcess, name: str) -> float:
    """The sum of a counter's samples over all labels, from the process's /metrics."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in process.metrics().splitlines()
        if line.startswith((name + "{", name + " "))
    )


# What the proxy's faults look like to the Kubernetes layer, and the method of each verb.
_AS_ERRORS = {
    "429": KubeApiError(429, "TooManyRequests", "", retry_after=1.0),
    "500": KubeApiError(500, "InternalError", ""),
    "503": KubeApiError(503, "ServiceUnavailable", ""),
    DROP: KubeApiError(0, "Unavailable", ""),
}
_METHODS = {
    "get": "GET",
    "list": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
    "deletecollection": "DELETE",
}


def layer_retryable(tally: Tally) -> collections.Counter[str]:
    """Per client, the requests the proxy turned away that the Kubernetes layer's own policy
    (:func:`retry_delay`) tries again. A watch is not among them: starting it again is the
    service's."""
    out: collections.Counter[str] = collections.Counter()
    for (client, _, verb, outcome), n in tally.counts().items():
        error, method = _AS_ERRORS.get(outcome), _METHODS.get(verb)
        if error is not None and method is not None and retry_delay(method, error, 0) is not None:
            out[client] += n
    return out


async def reset_events(nats_url: str, namespace: str, name: str) -> list[LifecycleEvent]:
    async with Observer(nats_url) as obs:
        events = await obs.all(
            subjects.LIFECYCLE_STREAM, subjects.lifecycle_event(namespace, name), LifecycleEvent
        )
    return [e for e in events if e.event == "ResetStarted"]


async def test_workloads_come_out_right_while_the_api_server_fails_a_quarter_of_requests(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    proxy: FaultProxy,
    service: ServiceFactory,
    tmp_path: Path,
) -> None:
    kc = testbed.kubeconfig
    started = time.monotonic()
    processes = {
        name: service(name, env={"KUBECONFIG": str(proxy.kubeconfig(tmp_path, client=name))})
        for name in SERVICES
    }

    for name in (*FAULTY, CLEAN):
        aw = manifests.job_appwrapper(
            name, pods=2, pod_annotations={sim.SUCCEED_AFTER: RUN_FOR}, annotations=FAST_RESET
        )
        apply(kc, namespace, aw)

    # One pod of each faulty workload fails while its first attempt runs: each as soon as it
    # runs, not one after another (the last would otherwise wait for the others' handling).
    first_jobs: dict[str, str] = {}

    async def fail_first_attempt(name: str) -> None:
        await wait_phase(kc, namespace, name, "Running", within=60)
        pods = await until(f"{name}'s pods running", lambda: running_pods(kc, namespace, name))
        first_jobs[name] = pods[0]["metadata"]["ownerReferences"][0]["uid"]
        sim.fail_pod(kc, namespace, pods[0]["metadata"]["name"], exit_code=1)

    await asyncio.gather(*(fail_first_attempt(name) for name in FAULTY))

    for name in FAULTY:
        done = await wait_phase(kc, namespace, name, "Succeeded", within=90)
        assert read_appwrapper(done).resetting_count == 1, f"{name} was reset more or less than once"
        assert [len(await reset_events(testbed.nats_url, namespace, name))] == [1], name
    clean = await wait_phase(kc, namespace, CLEAN, "Succeeded", within=60)
    assert read_appwrapper(clean).resetting_count == 0
    assert await reset_events(testbed.nats_url, namespace, CLEAN) == []
    # Every faulty workload ran a second Job, and only one.
    owners = collections.Counter(j["metadata"]["ownerReferences"][0]["name"] for j in jobs(kc, namespace))
    assert owners == {name: 1 for name in (*FAULTY, CLEAN)}
    for job in jobs(kc, namespace):
        assert job["metadata"]["uid"] not in first_jobs.values()

    # The API server's failures are no fault of the workloads: nothing told their owners otherwise.
    for name in (*FAULTY, CLEAN):
        assert RECONCILE_ERROR_EVENT not in {e["reason"] for e in events_of(kc, namespace, name)}, name

    # Deleted, everything goes: the finalizer's staged deletion works through the faults too.
    for name in (*FAULTY, CLEAN):
        kubectl(kc, "delete", "appwrapper", name, "-n", namespace, "--wait=false")
    await until(
        "the AppWrappers, Jobs and pods to be gone",
        lambda: (
            not any(
                [
                    *(get_appwrapper(kc, namespace, n) for n in (*FAULTY, CLEAN)),
                    jobs(kc, namespace),
                    sim.get_json(kc, "pods", "-n", namespace)["items"],
                ]
            )
        ),
        within=60,
    )
    elapsed = time.monotonic() - started

    for name, process in processes.items():
        assert process.alive(), f"{name} died"
    # The Kubernetes layer tried again what the server turned away, on the services' behalf:
    # each service that had a request turned away that the layer tries again (which requests
    # fail is the luck of the order they arrive in).
    tally = proxy.tally
    retryable = layer_retryable(tally)
    assert retryable["lifecycle"] > 0, dict(retryable)
    for name in KUBE_CLIENTS:
        if retryable[name]:
            assert metric(processes[name], "respawn_kube_request_retries_total") > 0, name
    # The faults really happened, on the services' own requests, of every kind.
    injected = tally.injected()
    requests = {client: tally.requests(client=client) for client in KUBE_CLIENTS}
    print(f"\nfault proxy, {elapsed:.0f}s:\n{tally.summary()}")
    print(f"requests: {requests}, injected: {dict(injected)}")
    for outcome in ("429", "500", "503", DROP, CUT):
        assert injected[outcome] > 0, f"no {outcome} injected: {dict(injected)}"
    for client, sent in requests.items():
        faults = tally.injected(client=client)
        failed = sum(faults[c] for c in ("429", "500", "503", DROP))
        assert failed >= 0.1 * sent, (client, sent, faults)
        # Retries pause: a service that retried at once would have sent far more.
        assert sent / elapsed < MAX_REQUEST_RATE, f"{client}: {sent} requests in {elapsed:.0f}s"
