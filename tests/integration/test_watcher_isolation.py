"""The watcher's loop against the testbed's API server and a nats-server of its own: one bad
object never stops the watch (it is dead-lettered with its identity and counted, and the next
object is observed), even when the dead letter itself cannot be written; a NATS outage is waited
out and the object published once the server is back; tombstones carry the configured TTL and
states none, and after a (re)list the observations of objects that are gone are followed by
tombstones; an observation the stream discarded is published again, with an id of its own.

The watcher runs in this process, its AppWrapper and pod watches scoped to the test's namespace,
so that a test can read its metrics and its bookkeeping; tests/integration/test_watcher.py runs
it as a process. Every object is created through the API server and reaches the watcher through
its watch. What the API server refuses to store cannot arrive that way (a pod whose
containerStatuses are not objects; a status nested deeper than the CRD's schema, which the API
server prunes): the translation's answer to those is in tests/unit/test_watcher_translate.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import pytest
from prometheus_client import REGISTRY

from respawn.testbed import sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.nats import NatsServer, start_nats
from services.watcher import service, translate
from shared import subjects
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.bus import (
    DL_OBJECT_NAME_HEADER,
    DL_OBJECT_RESOURCE_VERSION_HEADER,
    DL_OBJECT_UID_HEADER,
    DL_REASON_HEADER,
    DL_SUBJECT_HEADER,
    MSG_ID_HEADER,
    TTL_HEADER,
    Bus,
)
from shared.bus.headers import ttl_value
from shared.config import NatsConfig, OperatorConfig
from shared.kube import Kube
from shared.messages import AnyObservation, AppWrapperObservation, ObjectRef, PodObservation, decode
from shared.runtime import Runtime
from shared.stalls import HEARTBEAT_ANNOTATION
from tests.integration.test_nats_permissions import AuthNats, auth_nats, service_bus
from tests.nats_fixtures import dead_letters
from tests.waiting import until

pytestmark = pytest.mark.testbed

__all__ = ["auth_nats"]  # a fixture, used by name: the permission test's server with Respawn's users

NOW = datetime(2025, 1, 1, tzinfo=UTC)
TTL = timedelta(hours=3)
OBS = subjects.OBSERVATIONS_STREAM
MiB = 1024 * 1024
# Where a placeholder string stands in the JSON text of an object, for text put there verbatim.
VERBATIM = "@verbatim@"


def uid() -> str:
    return uuid.uuid4().hex[:8]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def failed_total() -> float:
    """Objects the watcher gave up on so far, whatever their kind and reason."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "respawn_watcher_objects_failed"
        for sample in family.samples
        if sample.name == "respawn_watcher_objects_failed_total"
    )


# ------------------------------------------------------------------ the objects


def nested_text(depth: int) -> str:
    """JSON text of ``depth`` objects one inside the other, written out (Python's json recurses,
    and gives up on deep enough values)."""
    return '{"a":' * depth + '"x"' + "}" * depth


def job(name: str, *, env_bytes: int = 0, **spec: Any) -> dict[str, Any]:
    """A Job of 3 pods; ``env_bytes`` of environment (in 60 kB values) make its template large."""
    env = [{"name": f"E{i}", "value": "v" * 60_000} for i in range(-(-env_bytes // 60_000))]
    container: dict[str, Any] = {"name": "c", "image": "busybox", **({"env": env} if env else {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": 3,
            "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
            **spec,
        },
    }


# A wrapped kind nothing serves: the watcher's watch of it never starts (it waits for the kind to
# be served), so its only observations are the AppWrappers'.
WIDGET = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}


def appwrapper(
    name: str, template: dict[str, Any], *, pod_set_annotation: int = 0, verbatim: str = ""
) -> str:
    """The JSON text of a suspended AppWrapper of ``template``, with ``verbatim`` in place of the
    string ``VERBATIM`` in it. Its pod set is declared (the Widget needs that), with an annotation
    of ``pod_set_annotation`` bytes: part of the observation, and not capped by the API server as
    metadata annotations are."""
    pod_set: dict[str, Any] = {"path": "template.spec.template", "replicas": 3}
    if pod_set_annotation:
        pod_set["annotations"] = {"blob": "z" * pod_set_annotation}
    obj = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"suspend": True, "components": [{"template": template, "podSets": [pod_set]}]},
    }
    return with_verbatim(obj, verbatim)


def pod_of(appwrapper: str, appwrapper_uid: str, name: str) -> dict[str, Any]:
    """A pod labelled with ``appwrapper`` and controlled by it directly (its owner chain is that
    one link)."""
    owner = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": appwrapper,
        "uid": appwrapper_uid,
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {APPWRAPPER_LABEL: appwrapper}, "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def with_verbatim(obj: Any, text: str) -> str:
    """The JSON text of ``obj`` with ``text`` in place of the string ``VERBATIM`` in it."""
    return json.dumps(obj).replace(json.dumps(VERBATIM), text)


async def create(kubeconfig: Path, namespace: str, text: str) -> tuple[str, str]:
    """Create the object of JSON ``text`` (as given: kubectl create, no annotation added); its
    uid and resourceVersion."""
    proc = await asyncio.to_thread(
        kubectl,
        kubeconfig,
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        "-o",
        "jsonpath={.metadata.uid} {.metadata.resourceVersion}",
        stdin=text,
    )
    created_uid, resource_version = proc.stdout.split()
    return created_uid, resource_version


def refused_events(kubeconfig: Path, namespace: str, name: str) -> list[dict[str, Any]]:
    """The ObservationRefused Events on the AppWrapper ``name``."""
    selector = f"involvedObject.name={name},reason={service.OBSERVATION_REFUSED_EVENT}"
    items: list[dict[str, Any]] = sim.get_json(
        kubeconfig, "events", "-n", namespace, "--field-selector", selector
    )["items"]
    return items


def aw_subject(namespace: str, name: str) -> str:
    return subjects.appwrapper_obs(namespace, name, "appwrapper", name)


# ------------------------------------------------------------------ the watcher


@pytest.fixture
async def kube(testbed: Endpoints, appwrapper_crd: Path) -> AsyncIterator[Kube]:
    client = await Kube.connect(testbed.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def running(
    bus: Any, kube: Kube, namespace: str, *, appwrapper_selector: str | None = None
) -> AsyncIterator[service.Watcher]:
    """A watcher publishing through ``bus``, watching the AppWrappers and pods of ``namespace``
    (and the wrapped kinds they name, as it does everywhere), the AppWrappers only those that
    match ``appwrapper_selector``; yielded once its watches have listed."""
    config = OperatorConfig(nats=NatsConfig(tombstoneTTL=TTL))
    w = service.Watcher(Runtime(name="watcher", config=config, bus=bus, kube=kube, probes=None))
    appwrappers = await w.resolve(API_VERSION, KIND)
    pods = await w.resolve("v1", "Pod")
    selected = {"label_selector": appwrapper_selector} if appwrapper_selector else {}
    tasks = [
        asyncio.create_task(
            w.watch(
                "appwrappers", appwrappers, translate.appwrapper_observation, namespace=namespace, **selected
            )
        ),
        # Pods whose owner chain is not known yet are held, as in the service.
        asyncio.create_task(w.resolve_held()),
        asyncio.create_task(
            w.watch(
                "pods", pods, translate.pod_observation, namespace=namespace, label_selector=APPWRAPPER_LABEL
            )
        ),
    ]
    try:
        await until("the watches to list", w.ready)
        yield w
    finally:
        for task in [*tasks, *w.component_watches.values()]:
            task.cancel()
        await asyncio.gather(*tasks, *w.component_watches.values(), return_exceptions=True)
        await w.publisher.close()


async def list_again(w: service.Watcher, name: str) -> None:
    """Have the watch ``name`` list again, as the watcher does when the stream discarded some of
    its observations, and return once the list and its reconciliation are done."""
    w.relisting.add(name)
    w.relists[name].set()
    await until(f"the watch of {name} to list again", lambda: name not in w.relisting)


async def last(bus: Bus, subject: str) -> Any:
    try:
        return await bus.js.get_last_msg(OBS, subject)
    except Exception:  # not stored (yet)
        return None


async def stored_dead_letters(bus: Bus) -> int:
    return int((await bus.js.stream_info(subjects.DEAD_LETTER_STREAM)).state.messages)


def assert_dead_letter(letter: Any, subject: str, name: str, identity: tuple[str, str], reason: str) -> None:
    """The dead letter names the object (headers and summary: ``identity`` is its uid and
    resourceVersion) and the subject it was meant for."""
    object_uid, resource_version = identity
    headers = letter.headers
    assert headers[DL_SUBJECT_HEADER] == subject
    assert headers[DL_REASON_HEADER] == reason
    assert (headers[DL_OBJECT_NAME_HEADER], headers[DL_OBJECT_UID_HEADER]) == (name, object_uid)
    assert headers[DL_OBJECT_RESOURCE_VERSION_HEADER] == resource_version
    summary = msgpack.unpackb(letter.data)
    assert (summary["name"], summary["uid"], summary["reason"]) == (name, object_uid, reason)


# ------------------------------------------------------------------ one bad object


async def test_bad_objects_are_dead_lettered_and_the_good_one_after_them_is_observed(
    testbed: Endpoints, kube: Kube, namespace: str, own_bus: Bus
) -> None:
    # A server of its own (own_bus) for every test here: reconciliation tombstones every stored
    # subject the namespace's list lacks, which would reach into other tests' observations.
    kc = testbed.kubeconfig
    large_before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large"
    )
    async with running(own_bus, kube, namespace):
        # The object that killed the watcher: a Job template with a field 300 levels deep. It is
        # now observed, without the template's body.
        await create(
            kc, namespace, appwrapper("deep-template", job("j", x=VERBATIM), verbatim=nested_text(300))
        )
        # Over NATS's max_payload, all of it in the template: observed, without the template.
        big_template = appwrapper("big-template", job("j", env_bytes=MiB))
        assert len(big_template) > own_bus.max_payload
        await create(kc, namespace, big_template)
        # Over NATS's max_payload, and what the observation keeps of it is over the watcher's
        # cap: refused, with a dead letter that names it.
        large_text = appwrapper(
            "large", job("j", env_bytes=MiB), pod_set_annotation=translate.MAX_OBSERVATION_BYTES
        )
        assert len(large_text) > own_bus.max_payload
        large = await create(kc, namespace, large_text)
        # A status nested 300 deep: the API server keeps only what the CRD's status schema
        # declares, so what the watch sees is an ordinary status.
        await create(kc, namespace, appwrapper("deep-status", job("j")))
        patched = await asyncio.to_thread(
            kubectl,
            kc,
            "patch",
            "appwrapper",
            "deep-status",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            with_verbatim({"status": {"phase": "Running", "x": VERBATIM}}, nested_text(300)),
        )
        assert "unknown field" in patched.stderr
        await create(kc, namespace, appwrapper("good", job("j")))

        good = await until(
            "the good AppWrapper observed", lambda: last(own_bus, aw_subject(namespace, "good"))
        )
    assert decode(AppWrapperObservation, good.data).ref.name == "good"
    # The watch handles its events in order: each object before "good" was handled before it.
    deep_template = await last(own_bus, aw_subject(namespace, "deep-template"))
    assert deep_template is not None
    [component] = decode(AppWrapperObservation, deep_template.data).body["spec"]["components"]
    assert component["template"] == {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}
    big = await last(own_bus, aw_subject(namespace, "big-template"))
    assert big is not None and len(big.data) < 4096  # what its readers use: a few KiB at most
    [component] = decode(AppWrapperObservation, big.data).body["spec"]["components"]
    assert "spec" not in component["template"]
    deep_status = await last(own_bus, aw_subject(namespace, "deep-status"))
    assert decode(AppWrapperObservation, deep_status.data).body["status"] == {"phase": "Running"}
    assert await last(own_bus, aw_subject(namespace, "large")) is None

    [letter] = await dead_letters(own_bus, 1)
    assert_dead_letter(letter, aw_subject(namespace, "large"), "large", large, "too-large")
    # A summary of the object, never the object: the dead letter of an object over 1 MiB is small.
    assert len(letter.data) < 2048
    assert await stored_dead_letters(own_bus) == 1
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large")
        == large_before + 1
    )


async def test_an_object_the_server_refuses_is_dead_lettered_with_its_identity_and_the_next_is_observed(
    testbed: Endpoints, kube: Kube, namespace: str, own_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the watcher's own cap out of the way, the bus refuses the object (over NATS's
    # max_payload) with a PermanentPublishError: a failure no retry can clear.
    monkeypatch.setattr(translate, "MAX_OBSERVATION_BYTES", 10 * own_bus.max_payload)
    kc = testbed.kubeconfig
    before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large"
    )
    async with running(own_bus, kube, namespace):
        huge = await create(
            kc, namespace, appwrapper("huge", WIDGET, pod_set_annotation=own_bus.max_payload + 64 * 1024)
        )
        await create(kc, namespace, appwrapper("after", WIDGET))
        await until("the next AppWrapper observed", lambda: last(own_bus, aw_subject(namespace, "after")))
    assert await last(own_bus, aw_subject(namespace, "huge")) is None
    [letter] = await dead_letters(own_bus, 1)
    assert_dead_letter(letter, aw_subject(namespace, "huge"), "huge", huge, "too-large")
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large")
        == before + 1
    )
    # Its owner is told, on the object itself, once: a re-list refuses the same version again.
    told = await until("the owner told", lambda: refused_events(kc, namespace, "huge"))
    assert "too-large" in told[0]["message"] and told[0]["involvedObject"]["uid"] == huge[0]
    async with running(own_bus, kube, namespace) as w:
        await list_again(w, "appwrappers")
    assert len(refused_events(kc, namespace, "huge")) == 1


class BugOnPublish:
    """The real bus, except that publishing on ``subject`` raises as a bug in the publish path
    would. No server answer produces such an error, so it is the one failure put in by hand;
    everything else, the dead letter included, goes to the server."""

    def __init__(self, bus: Bus, subject: str) -> None:
        self._bus = bus
        self._subject = subject

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, subject: str, message: Any, **options: Any) -> Any:
        if subject == self._subject:
            raise ValueError("a bug")
        return await self._bus.publish(subject, message, **options)


async def test_an_unexpected_publish_error_is_dead_lettered_and_the_next_object_is_observed(
    testbed: Endpoints, kube: Kube, namespace: str, own_bus: Bus
) -> None:
    kc = testbed.kubeconfig
    bad = aw_subject(namespace, "bad")
    before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="unexpected"
    )
    async with running(BugOnPublish(own_bus, bad), kube, namespace):
        identity = await create(kc, namespace, appwrapper("bad", WIDGET))
        await create(kc, namespace, appwrapper("good", WIDGET))
        await until("the next AppWrapper observed", lambda: last(own_bus, aw_subject(namespace, "good")))
    assert await last(own_bus, bad) is None
    [letter] = await dead_letters(own_bus, 1)
    assert_dead_letter(letter, bad, "bad", identity, "unexpected")
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="unexpected")
        == before + 1
    )


# ------------------------------------------------------------------ NATS down, or refusing


async def test_an_object_seen_while_nats_is_down_is_published_once_it_is_back(
    testbed: Endpoints,
    kube: Kube,
    namespace: str,
    own_nats: NatsServer,
    own_bus: Bus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kc = testbed.kubeconfig
    subject, after = aw_subject(namespace, "during-outage"), aw_subject(namespace, "after-it")
    failed_before = failed_total()
    async with running(own_bus, kube, namespace) as w:
        # The bus gives up on a publish after this long, and the watcher's own retries begin.
        w.publisher.retry_for = 2.0
        await asyncio.to_thread(own_nats.stop)
        identity = await create(kc, namespace, appwrapper("during-outage", WIDGET))
        await create(kc, namespace, appwrapper("after-it", WIDGET))
        # The bus retries a failed publish for a while by itself and then raises; an outage
        # longer than that reaches the watcher, which retries in turn instead of giving up on
        # the objects (each publish of its own, both in flight).
        for waiting in (subject, after):
            await until(
                f"the watcher to retry the publish of {waiting} itself",
                lambda waiting=waiting: f"publishing {waiting} failed" in caplog.text,
                within=90,
                every=0.5,
            )
        assert failed_total() == failed_before
        await asyncio.to_thread(own_nats.start)
        stored = await until(
            "the object published once NATS is back", lambda: last(own_bus, subject), within=60
        )
        assert decode(AppWrapperObservation, stored.data).ref.uid == identity[0]
        next_one = await until("the next object published", lambda: last(own_bus, after))
        assert decode(AppWrapperObservation, next_one.data).ref.name == "after-it"
    assert await stored_dead_letters(own_bus) == 0
    assert failed_total() == failed_before


RESTRICTED_PASSWORD = "watcher-without-dead-letters-0123456789"

# A watcher user that may publish observations and use JetStream, but not dead-letter: what a
# server whose permissions lag behind Respawn's would do.
NO_DEAD_LETTERS = f"""
authorization {{
  users = [
    {{
      user: watcher
      password: "{RESTRICTED_PASSWORD}"
      permissions: {{
        publish: {{ allow: ["respawn.obs.v1.>", "$JS.API.>"] }}
        subscribe: {{ allow: ["_INBOX.>"] }}
      }}
    }}
  ]
}}
"""


async def test_a_dead_letter_that_cannot_be_written_does_not_stop_the_watch(
    testbed: Endpoints, kube: Kube, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kc = testbed.kubeconfig
    conf = tmp_path / "nats.conf"
    conf.write_text(NO_DEAD_LETTERS)
    server = await asyncio.to_thread(start_nats, tmp_path / "nats", config_file=conf)
    try:
        bus = await Bus.connect(
            server.url, name="respawn-watcher", user="watcher", password=RESTRICTED_PASSWORD
        )
        try:
            await bus.ensure_streams()
            before = metric(
                "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large"
            )
            async with running(bus, kube, namespace):
                await create(
                    kc,
                    namespace,
                    appwrapper("large", WIDGET, pod_set_annotation=translate.MAX_OBSERVATION_BYTES),
                )
                await create(kc, namespace, appwrapper("good", WIDGET))
                await until(
                    "the AppWrapper after the refused one observed",
                    lambda: last(bus, aw_subject(namespace, "good")),
                )
            # The dead letter was refused by the server: nothing stored, and the watcher said so.
            assert await stored_dead_letters(bus) == 0
            assert f"cannot dead-letter {namespace}/large either" in caplog.text
            assert (
                metric(
                    "respawn_watcher_objects_failed_total",
                    kind=AppWrapperObservation.KIND,
                    reason="too-large",
                )
                == before + 1
            )
        finally:
            await bus.close()
    finally:
        await asyncio.to_thread(server.stop)


# ------------------------------------------------------------------ tombstones


async def test_tombstones_carry_the_ttl_and_deletes_missed_while_down_get_one_after_the_list(
    testbed: Endpoints, kube: Kube, namespace: str, own_bus: Bus
) -> None:
    kc = testbed.kubeconfig
    # What an earlier watcher left: two AppWrappers and a pod; "gone" and its pod were deleted
    # while no watcher ran, "kept" is still there.
    await create(kc, namespace, appwrapper("kept", WIDGET))
    earlier = {}
    for name in ("gone", "kept"):
        message = AppWrapperObservation(
            ref=ObjectRef(namespace=namespace, name=name, uid=f"uid-{name}"), observed_at=NOW
        )
        earlier[name] = await own_bus.publish(aw_subject(namespace, name), message, msg_id=None)
    gone_pod = subjects.appwrapper_obs(namespace, "gone", "pod", "gone-pod")
    await own_bus.publish(
        gone_pod,
        PodObservation(
            ref=ObjectRef(namespace=namespace, name="gone-pod"), appwrapper="gone", observed_at=NOW
        ),
        msg_id=None,
    )
    missed_before = metric("respawn_watcher_missed_deletes_total", kind=AppWrapperObservation.KIND)

    async def tombstone(subject: str) -> Any:
        stored = await last(own_bus, subject)
        return stored if stored is not None and decode(AnyObservation, stored.data).deleted else None

    async with running(own_bus, kube, namespace) as w:
        gone = await until("the missed delete's tombstone", lambda: tombstone(aw_subject(namespace, "gone")))
        assert gone.headers[TTL_HEADER] == ttl_value(TTL.total_seconds())
        assert decode(AppWrapperObservation, gone.data).ref.name == "gone"
        pod_tomb = await until("the missed pod delete's tombstone", lambda: tombstone(gone_pod))
        assert decode(PodObservation, pod_tomb.data).appwrapper == "gone"
        # The watcher's own observation of the object it listed: a state, which never expires.
        kept = await until(
            "the listed AppWrapper observed",
            lambda: last(own_bus, aw_subject(namespace, "kept")),
            done=lambda stored: stored is not None and stored.seq > earlier["kept"].seq,
        )
        assert not decode(AppWrapperObservation, kept.data).deleted
        assert TTL_HEADER not in (kept.headers or {})
        assert (
            metric("respawn_watcher_missed_deletes_total", kind=AppWrapperObservation.KIND)
            >= missed_before + 1
        )

        # A delete seen by the watch: its tombstone has the TTL too. A re-list afterwards finds
        # the subject (the tombstone) without its object, and must not publish the tombstone
        # again: that would start its TTL over.
        await asyncio.to_thread(kubectl, kc, "delete", "appwrapper", "kept", "-n", namespace, "--wait=true")
        deleted = await until(
            "the watched delete's tombstone", lambda: tombstone(aw_subject(namespace, "kept"))
        )
        assert deleted.headers[TTL_HEADER] == ttl_value(TTL.total_seconds())
        await list_again(w, "appwrappers")
        await list_again(w, "pods")
    for subject, first in ((aw_subject(namespace, "kept"), deleted), (aw_subject(namespace, "gone"), gone)):
        again = await last(own_bus, subject)
        assert again.seq == first.seq, subject
    again = await last(own_bus, gone_pod)
    assert again.seq == pod_tomb.seq


# ------------------------------------------------------------------ the stream at its limit


async def test_a_discarded_observation_is_published_again_unchanged_with_an_id_of_its_own(
    testbed: Endpoints, kube: Kube, namespace: str, own_bus: Bus
) -> None:
    kc = testbed.kubeconfig
    a, b = aw_subject(namespace, "a"), aw_subject(namespace, "b")
    before = metric("respawn_watcher_observations_restored_total", kind=AppWrapperObservation.KIND)
    async with running(own_bus, kube, namespace) as w:
        await create(kc, namespace, appwrapper("a", WIDGET))
        first_a = await until("a observed", lambda: last(own_bus, a))
        await create(kc, namespace, appwrapper("b", WIDGET))
        first_b = await until("b observed", lambda: last(own_bus, b))
        assert first_b.seq > first_a.seq

        # The stream drops its oldest messages, as at its limit: a's observation is gone, b's
        # is stored. The watcher's check finds it, and has the watch list again.
        await own_bus.js.purge_stream(OBS, seq=first_a.seq + 1)
        first, last_seq = await own_bus.sequences(OBS)
        assert first == first_a.seq + 1
        assert w.restore_discarded(first, last_seq) == 1
        assert w.publisher.restore == {a: first_a.seq}

        # Unchanged, but discarded: published again, with an id of its own (the same version
        # again within the duplicate window would be dropped as a repeat of the discarded one).
        restored = await until("a published again", lambda: last(own_bus, a))
        assert restored.headers[MSG_ID_HEADER] == f"{first_a.headers[MSG_ID_HEADER]}:restored:{first_a.seq}"
        assert translate.fingerprint(decode(AppWrapperObservation, restored.data)) == translate.fingerprint(
            decode(AppWrapperObservation, first_a.data)
        )
        await until("the list to be done", lambda: "appwrappers" not in w.relisting)
        assert w.publisher.restore == {} and w.publisher.seqs[a] == restored.seq
        # b, unchanged and stored, was skipped as always: a's is the only message since.
        assert (await last(own_bus, b)).seq == first_b.seq
        assert await own_bus.sequences(OBS) == (first, restored.seq)
        assert (
            metric("respawn_watcher_observations_restored_total", kind=AppWrapperObservation.KIND)
            == before + 1
        )
        # And from then on skipped again while unchanged.
        await list_again(w, "appwrappers")
        assert await own_bus.sequences(OBS) == (first, restored.seq)


# ------------------------------------------------------------------ the watcher's NATS user


async def test_the_watcher_user_may_list_stored_subjects_and_dead_letter(auth_nats: AuthNats) -> None:
    # What reconciliation and isolation do on the bus, as the watcher's NATS user
    # (respawn/natsauth.py): a permission missing here would fail only in production.
    ns = f"ns-{uid()}"
    subject = aw_subject(ns, "aw")
    async with service_bus(auth_nats, "watcher") as bus:
        message = AppWrapperObservation(ref=ObjectRef(namespace=ns, name="aw"), observed_at=NOW)
        await bus.publish(subject, message, msg_id=None)
        found = await bus.subjects(OBS, translate.observed_subject_filter(message.KIND))
        assert found.get(subject) == 1
        letter = await bus.dead_letter(subject, {"name": "aw"}, reason="too-deep", error="deep", name="aw")
        assert letter.stream == subjects.DEAD_LETTER_STREAM


# ------------------------------------------------------------------ pods held for their owners

HIDDEN = "test.respawn.dev/hidden"


async def test_a_pod_whose_appwrapper_is_not_seen_is_held_then_given_up_unpublished(
    testbed: Endpoints, kube: Kube, own_bus: Bus, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod owned by an AppWrapper the watcher has not seen (here: one its watch does not
    select yet) is held, then given up without being published; once the AppWrapper is seen,
    the pod's next change is published."""
    monkeypatch.setattr(service, "HOLD_LIMIT", 1.0)
    kc = testbed.kubeconfig
    before = metric("respawn_watcher_pods_unattributed_total", reason="unresolved")
    aw_uid, _ = await create(
        kc,
        namespace,
        appwrapper("late", WIDGET).replace(
            '"metadata": {', f'"metadata": {{"labels": {{"{HIDDEN}": "1"}}, ', 1
        ),
    )
    pod = pod_of("late", aw_uid, "waiting")
    subject = subjects.appwrapper_obs(namespace, "late", "pod", "waiting")
    async with running(own_bus, kube, namespace, appwrapper_selector=f"!{HIDDEN}") as w:
        pod_uid, _ = await create(kc, namespace, json.dumps(pod))
        await until("the pod held", lambda: pod_uid in w.held)
        await until(
            "the pod given up",
            lambda: metric("respawn_watcher_pods_unattributed_total", reason="unresolved"),
            done=lambda now: now > before,
        )
        assert pod_uid not in w.held
        assert await last(own_bus, subject) is None
        # The AppWrapper seen (its label gone, the watch selects it), the pod's next change is
        # published.
        await asyncio.to_thread(kubectl, kc, "label", "appwrapper", "late", "-n", namespace, f"{HIDDEN}-")
        await until("the AppWrapper observed", lambda: last(own_bus, aw_subject(namespace, "late")))
        await asyncio.to_thread(kubectl, kc, "annotate", "pod", "waiting", "-n", namespace, "again=1")
        seen = await until("the pod published", lambda: last(own_bus, subject))
        assert decode(PodObservation, seen.data).ref.uid == pod_uid


# ------------------------------------------------------------------ an AppWrapper being deleted

HOLD = "test.respawn.dev/hold"


async def test_while_an_appwrapper_is_deleted_its_pods_changes_are_not_published_only_their_tombstones(
    testbed: Endpoints, kube: Kube, own_bus: Bus, namespace: str
) -> None:
    kc = testbed.kubeconfig
    # A finalizer of the test's own keeps the AppWrapper in its deletion for as long as needed.
    aw_uid, _ = await create(
        kc,
        namespace,
        appwrapper("going", WIDGET).replace('"metadata": {', f'"metadata": {{"finalizers": ["{HOLD}"], ', 1),
    )
    pod = pod_of("going", aw_uid, "going-0")
    subject = subjects.appwrapper_obs(namespace, "going", "pod", "going-0")

    def skipped() -> float:
        return metric("respawn_watcher_teardown_changes_skipped_total", kind=PodObservation.KIND)

    async def changed_pod(value: str) -> None:
        # The progress heartbeat is part of the pod's observation: a change that is published.
        await asyncio.to_thread(
            kubectl,
            kc,
            "annotate",
            "--overwrite",
            "pod",
            "going-0",
            "-n",
            namespace,
            f"{HEARTBEAT_ANNOTATION}={value}",
        )

    try:
        async with running(own_bus, kube, namespace) as w:
            pod_uid, _ = await create(kc, namespace, json.dumps(pod))
            await changed_pod("2026-01-01T00:00:00Z")
            first = await until(
                "the pod's change published",
                lambda: last(own_bus, subject),
                done=lambda stored: (
                    stored is not None and decode(PodObservation, stored.data).heartbeat != ""
                ),
            )
            before = skipped()

            await asyncio.to_thread(
                kubectl, kc, "delete", "appwrapper", "going", "-n", namespace, "--wait=false"
            )
            await until("the AppWrapper seen deleting", lambda: w.torn_down.holds((namespace, "going"), 0.0))
            await changed_pod("2026-01-01T00:01:00Z")
            await until("the pod's change skipped", skipped, done=lambda n: n > before)
            stored = await last(own_bus, subject)
            assert stored is not None and stored.seq == first.seq, (
                "a change of a torn-down AppWrapper's pod was published"
            )

            # Its deletion is published: the tombstone removes its observation from the stream.
            await asyncio.to_thread(
                kubectl, kc, "delete", "pod", "going-0", "-n", namespace, "--grace-period=0", "--force"
            )
            tomb = await until(
                "the pod's tombstone",
                lambda: last(own_bus, subject),
                done=lambda stored: stored is not None and decode(PodObservation, stored.data).deleted,
            )
            assert decode(PodObservation, tomb.data).ref.uid == pod_uid
            assert tomb.headers[TTL_HEADER] == ttl_value(TTL.total_seconds())
    finally:
        await asyncio.to_thread(
            kubectl,
            kc,
            "patch",
            "appwrapper",
            "going",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            check=False,
        )
