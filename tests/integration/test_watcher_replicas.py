"""Two watcher replicas, as separate processes on the testbed with a nats-server of their own:
they split the publishing by partition (each publishes the AppWrappers of its own partitions, with
their components and pods, and the nodes of its partitions), together publish exactly what one
watcher alone would, and when one is SIGKILLed nothing is lost: what changed while it was dead
(a pod that failed, an AppWrapper deleted, a pod taken out of its owner tree, a node labelled) is
published by the other once it has taken the dead one's partitions over, within the member TTL
and a few seconds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from nats.js.errors import NotFoundError
from prometheus_client.parser import text_string_to_metric_families

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer
from respawn.testbed.services import ServiceProcess
from services.watcher import translate
from shared import subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.messages import (
    AnyObservation,
    AppWrapperObservation,
    ComponentObservation,
    NodeObservation,
    PodObservation,
    decode,
)
from shared.ownership import controller_link
from shared.partitions import assign
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.objects import apply
from tests.integration.observe import Observer
from tests.waiting import until

pytestmark = pytest.mark.testbed

OBS = subjects.OBSERVATIONS_STREAM
# Long enough that what the test changes right after the kill is certainly changed before the
# survivor takes over (so that it is the takeover that publishes it), short enough to wait for.
HEARTBEAT, MEMBER_TTL = 0.2, 4.0
MEMBERS = ("watcher-a", "watcher-b")
APPWRAPPERS = 20
APPWRAPPER_KIND = AppWrapperObservation.KIND
NODE = "kwok-node-0"
LABEL = "test.respawn.dev/takeover"


@pytest.fixture
def service(testbed: Endpoints, own_nats: NatsServer, tmp_path: Path) -> Iterator[ServiceFactory]:
    """Services on a nats-server of their own: no other test's watcher is in their group, and
    the stream holds only what they publish."""
    with services_on(testbed.kubeconfig, own_nats.url, tmp_path / "logs") as start:
        yield start


def replica(service: ServiceFactory, member: str) -> ServiceProcess:
    env = {
        "RESPAWN_INSTANCE": member,
        "RESPAWN_SCALING_HEARTBEAT": f"{int(HEARTBEAT * 1000)}ms",
        "RESPAWN_SCALING_MEMBER_TTL": f"{MEMBER_TTL}s",
    }
    return service("watcher", instance=member, env=env)


def sample(sp: ServiceProcess, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(sp.metrics()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def owned(sp: ServiceProcess) -> int:
    return int(sample(sp, "respawn_partitions_owned", group="watcher"))


def names_split(namespace: str, share: dict[str, frozenset[int]]) -> dict[str, list[str]]:
    """``APPWRAPPERS`` AppWrapper names of ``namespace``, half of them in each member's partitions."""
    split: dict[str, list[str]] = {m: [] for m in MEMBERS}
    for i in range(10_000):
        name = f"aw-{i}"
        member = next(m for m in MEMBERS if subjects.partition(namespace, name) in share[m])
        if len(split[member]) < APPWRAPPERS // len(MEMBERS):
            split[member].append(name)
        if all(len(names) == APPWRAPPERS // len(MEMBERS) for names in split.values()):
            return split
    raise AssertionError("no even split found")


def items(kubeconfig: Path, kind: str, namespace: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = sim.get_json(kubeconfig, kind, "-n", namespace)["items"]
    return found


def expected(kubeconfig: Path, namespace: str) -> dict[str, translate.Prepared]:
    """What one watcher alone publishes of what exists in ``namespace`` now, by subject."""
    out: dict[str, translate.Prepared] = {}
    for kind, to_message, observation_kind in (
        ("appwrappers", translate.appwrapper_observation, APPWRAPPER_KIND),
        ("jobs", translate.component_observation, ComponentObservation.KIND),
        ("pods", translate.pod_observation, PodObservation.KIND),
    ):
        for obj in items(kubeconfig, kind, namespace):
            if kind == "pods" and controller_link(obj) is None:
                continue  # not in its AppWrapper's owner tree: not observed
            prepared = translate.prepare(
                to_message, obj, observation_kind=observation_kind, deleted=False, now=datetime.now(UTC)
            )
            assert isinstance(prepared, translate.Prepared), prepared
            out[prepared.subject] = prepared
    return out


Observation = AppWrapperObservation | ComponentObservation | PodObservation | NodeObservation


async def stored(js: Any, namespace: str) -> dict[str, Observation]:
    """The latest observation on every subject of ``namespace`` the stream holds."""
    info = await js.stream_info(OBS, subjects_filter=subjects.appwrapper_obs_filter(namespace))
    out: dict[str, Observation] = {}
    for subject in info.state.subjects or {}:
        try:
            raw = await js.get_last_msg(OBS, subject)
        except NotFoundError:  # a tombstone expired meanwhile
            continue
        out[subject] = cast(Observation, decode(AnyObservation, raw.data, raw.headers))
    return out


async def differences(js: Any, kubeconfig: Path, namespace: str) -> list[str]:
    """How the stream differs from what one watcher alone would have published: every object
    that exists has its latest state stored (the same content), and every other subject stored
    holds a tombstone."""
    want = await asyncio.to_thread(expected, kubeconfig, namespace)
    have = await stored(js, namespace)
    out = []
    for subject, prepared in want.items():
        found = have.get(subject)
        if found is None or found.deleted:
            out.append(f"{subject}: {'missing' if found is None else 'a tombstone'}")
        elif translate.fingerprint(found) != prepared.fingerprint:
            out.append(f"{subject}: an older state")
    out += [
        f"{s}: not a tombstone"
        for s, m in have.items()
        if s not in want and not m.deleted and not _watched_for_others(m)
    ]
    return out


def _watched_for_others(observation: Observation) -> bool:
    """A component observation of a kind other than Job: the watcher watches every kind that
    some AppWrapper on the testbed wraps (other tests' too, Pods among them), and then publishes
    the objects of that kind an AppWrapper here controls as well (the pod made a component of
    its AppWrapper below). What this test checks is the Jobs and pods."""
    return isinstance(observation, ComponentObservation) and observation.kind != "Job"


def owner(aw: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": API_VERSION, "kind": KIND, "name": aw, "uid": uid, "controller": True}]


def controlled_pod(name: str, aw: str, uid: str) -> dict[str, Any]:
    """A pod that is a component of ``aw`` itself: in its owner tree with no object between."""
    pod = manifests.pod(name, labels={APPWRAPPER_LABEL: aw})
    pod["metadata"]["ownerReferences"] = owner(aw, uid)
    return pod


def controlled_job(name: str, aw: str, uid: str) -> dict[str, Any]:
    """The Job lifecycle would create for ``aw``: labelled (its pod too) and controlled by it, so
    that its pod's owner chain leads there."""
    labels = {APPWRAPPER_LABEL: aw}
    template = manifests.pod_template(labels=labels, container="c")
    job = manifests.job(name, labels=labels, backoffLimit=0, template=template)
    job["metadata"]["ownerReferences"] = owner(aw, uid)
    return job


async def test_two_watchers_split_the_publishing_and_one_takes_over_what_the_other_left_when_killed(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, own_nats: NatsServer, service: ServiceFactory
) -> None:
    kc = testbed.kubeconfig
    # The services use the default partition count, as this process does.
    share = assign(subjects.partitions(), MEMBERS)
    # The replica to kill is the one that publishes the node labelled while it is dead.
    victim = next(m for m in MEMBERS if subjects.partition("", NODE) in share[m])
    survivor = next(m for m in MEMBERS if m != victim)
    procs = {m: replica(service, m) for m in MEMBERS}
    await until(
        "each replica to own its share",
        lambda: [owned(procs[m]) for m in MEMBERS],
        done=lambda counts: counts == [len(share[m]) for m in MEMBERS],
    )
    published = {
        m: sample(procs[m], "respawn_watcher_observations_published_total", kind=APPWRAPPER_KIND)
        for m in MEMBERS
    }

    names = names_split(namespace, share)
    everything = [n for m in MEMBERS for n in names[m]]
    apply(
        kc,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [manifests.job_appwrapper(n, suspend=True) for n in everything],
        },
    )
    uids = {aw["metadata"]["name"]: aw["metadata"]["uid"] for aw in items(kc, "appwrappers", namespace)}
    jobs = [controlled_job(f"{n}-job", n, uids[n]) for n in everything]
    # And a pod of one of the victim's AppWrappers, which leaves its owner tree while it is dead.
    disowned = names[victim][2]
    extra = controlled_pod("extra", disowned, uids[disowned])
    apply(kc, namespace, {"apiVersion": "v1", "kind": "List", "items": [*jobs, extra]})
    extra_subject = subjects.appwrapper_obs(namespace, disowned, "pod", "extra")

    async with Observer(own_nats.url) as obs:
        js = obs.nc.jetstream()
        await until(
            "every pod running",
            lambda: items(kc, "pods", namespace),
            done=lambda pods: (
                len(pods) == APPWRAPPERS + 1 and all(p["status"].get("phase") == "Running" for p in pods)
            ),
            within=60,
        )
        # Together, exactly what one watcher alone would have published.
        assert (
            await until(
                "the stream to hold the latest state of every object",
                lambda: differences(js, kc, namespace),
                done=lambda found: not found,
                within=30,
            )
            == []
        )
        # Each published the AppWrappers of its own partitions (the other tests' AppWrappers,
        # if some change meanwhile, are the only others).
        for m in MEMBERS:
            mine = (
                sample(procs[m], "respawn_watcher_observations_published_total", kind=APPWRAPPER_KIND)
                - published[m]
            )
            assert len(names[m]) <= mine < APPWRAPPERS, (m, mine)

        # Kill one; while it is dead, delete one of its AppWrappers, fail a pod of another, take
        # a third one's pod out of its owner tree and label one of its nodes. Nobody publishes
        # them until the survivor takes over.
        failing, deleted = names[victim][0], names[victim][1]
        [pod] = [
            p for p in items(kc, "pods", namespace) if p["metadata"]["labels"][APPWRAPPER_LABEL] == failing
        ]
        pod_subject = subjects.appwrapper_obs(namespace, failing, "pod", pod["metadata"]["name"])
        missed_before = sample(procs[survivor], "respawn_watcher_missed_deletes_total", kind=APPWRAPPER_KIND)
        taken_before = sample(
            procs[survivor], "respawn_watcher_takeover_objects_total", kind=PodObservation.KIND
        )
        killed = time.monotonic()
        procs[victim].kill()
        kubectl(kc, "delete", "appwrapper", deleted, "-n", namespace, "--wait=false")
        sim.fail_pod(kc, namespace, pod["metadata"]["name"], exit_code=7)
        remove = '[{"op": "remove", "path": "/metadata/ownerReferences"}]'
        kubectl(kc, "patch", "pod", "extra", "-n", namespace, "--type=json", "-p", remove)
        mark = uuid.uuid4().hex[:8]
        kubectl(kc, "label", "node", NODE, f"{LABEL}={mark}", "--overwrite")
        try:
            changed_by = time.monotonic() - killed
            failed = await obs.wait_last(
                OBS, pod_subject, PodObservation, lambda m: m.phase == "Failed", within=30
            )
            seen_after = time.monotonic() - killed
            assert changed_by < MEMBER_TTL - 1, "the changes were made too late to be the takeover's"
            assert seen_after < MEMBER_TTL + 3, f"the failure was published {seen_after:.1f}s after the kill"
            assert [c.exit_code for c in failed.containers] == [7]
            node = await obs.wait_last(
                OBS, subjects.node_obs(NODE), NodeObservation, lambda m: m.labels.get(LABEL) == mark
            )
            assert not node.deleted
            # The deleted AppWrapper's tombstone: its delete was seen by the survivor's watch
            # while it was not the survivor's to publish, and found missing when it took over.
            gone = await obs.wait_last(
                OBS,
                subjects.appwrapper_obs(namespace, deleted, "appwrapper", deleted),
                AppWrapperObservation,
                lambda m: m.deleted,
            )
            assert gone.ref.name == deleted
            # The pod no longer in its AppWrapper's owner tree: its stored state replaced by a
            # tombstone, though the survivor never published that state itself.
            out = await obs.wait_last(OBS, extra_subject, PodObservation, lambda m: m.deleted)
            assert out.ref.name == "extra"
            missed = sample(procs[survivor], "respawn_watcher_missed_deletes_total", kind=APPWRAPPER_KIND)
            assert missed > missed_before
            # The victim's pods were published again by the takeover (a deleted one, perhaps, not).
            taken = sample(
                procs[survivor], "respawn_watcher_takeover_objects_total", kind=PodObservation.KIND
            )
            assert taken - taken_before >= len(names[victim]) - 1
            assert owned(procs[survivor]) == subjects.partitions()
            # And the stream is again what one watcher alone would have published (the deleted
            # AppWrapper's Job and pod, deleted by the garbage collector, included).
            assert (
                await until(
                    "the stream to hold the latest state of every object, and tombstones for the rest",
                    lambda: differences(js, kc, namespace),
                    done=lambda found: not found,
                    within=30,
                )
                == []
            )
        finally:
            kubectl(kc, "label", "node", NODE, f"{LABEL}-")
