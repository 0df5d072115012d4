"""The watcher's loop on a real nats-server, with the Kubernetes side scripted: one bad object
never stops the watch (it is dead-lettered with its identity and counted, and the next object
is observed), even when the dead letter itself cannot be written; a NATS outage is waited out
and the object published once the server is back; tombstones carry the configured TTL and
states none, and after a (re)list the observations of objects that are gone are followed by
tombstones.

The watch events are scripted (``list_then_watch`` replaced) because what is under test is what
the watcher does with them; tests/integration/test_watcher.py runs it against a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import pytest
from prometheus_client import REGISTRY

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
    TTL_HEADER,
    Bus,
)
from shared.bus.headers import ttl_value
from shared.config import NatsConfig, OperatorConfig
from shared.kube import ResourceRef
from shared.kube.watch import WatchEvent
from shared.messages import AnyObservation, AppWrapperObservation, ObjectRef, PodObservation, decode
from shared.runtime import Runtime
from tests.integration.test_nats_permissions import AuthNats, auth_nats, service_bus
from tests.nats_fixtures import dead_letters
from tests.waiting import until

pytestmark = pytest.mark.nats

__all__ = ["auth_nats"]  # a fixture, used by name: the permission test's server with Respawn's users

NOW = datetime(2025, 1, 1, tzinfo=UTC)
TTL = timedelta(hours=3)
AW_REF = ResourceRef("workload.codeflare.dev", "v1beta2", "appwrappers", "AppWrapper", True)
POD_REF = ResourceRef("", "v1", "pods", "Pod", True)


def uid() -> str:
    return uuid.uuid4().hex[:8]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def appwrapper(ns: str, name: str, rv: str = "1", **extra: Any) -> dict[str, Any]:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-job"},
        "spec": {"parallelism": 2},
    }
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"components": [{"template": job}]},
    }
    obj.update(extra)
    return obj


def pod(ns: str, aw: str, name: str, **status: Any) -> dict[str, Any]:
    """A pod of the AppWrapper ``aw``: labelled, and a component it controls itself."""
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": aw, "uid": f"uid-{aw}", "controller": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "labels": {APPWRAPPER_LABEL: aw},
            "ownerReferences": [owner],
        },
        "status": {"phase": "Running", **status},
    }


class Script:
    """``list_then_watch`` replaced: each resource's events, handed out as they are added."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[WatchEvent]] = {}

    def add(self, ref: ResourceRef, *events: WatchEvent) -> None:
        queue = self.queues.setdefault(ref.kind, asyncio.Queue())
        for event in events:
            queue.put_nowait(event)

    async def list_then_watch(self, kube: Any, ref: ResourceRef, **_: Any) -> AsyncIterator[WatchEvent]:
        queue = self.queues.setdefault(ref.kind, asyncio.Queue())
        while True:
            yield await queue.get()


@contextlib.asynccontextmanager
async def running(bus: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[service.Watcher, Script]]:
    """A watcher publishing through ``bus``, its AppWrapper and pod watches fed by a script."""
    script = Script()
    monkeypatch.setattr(service, "list_then_watch", script.list_then_watch)
    config = OperatorConfig(nats=NatsConfig(tombstoneTTL=TTL))
    rt = Runtime(name="watcher", config=config, bus=bus, kube=object(), probes=None)  # type: ignore[arg-type]
    w = service.Watcher(rt)
    tasks = [
        asyncio.create_task(w.watch("appwrappers", AW_REF, translate.appwrapper_observation)),
        asyncio.create_task(w.watch("pods", POD_REF, translate.pod_observation)),
        # A pod seen before its AppWrapper is held until the AppWrapper's event.
        asyncio.create_task(w.resolve_held()),
    ]
    try:
        yield w, script
    finally:
        for task in [*tasks, *w.component_watches.values()]:
            task.cancel()
        await asyncio.gather(*tasks, *w.component_watches.values(), return_exceptions=True)


@pytest.fixture
async def watcher(
    own_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[service.Watcher, Script]]:
    # A server of its own per test (own_bus): reconciliation tombstones every stored subject the
    # scripted list lacks, which would reach into other tests' observations on a shared one.
    async with running(own_bus, monkeypatch) as started:
        yield started


async def last(bus: Bus, subject: str) -> Any:
    try:
        return await bus.js.get_last_msg(subjects.OBSERVATIONS_STREAM, subject)
    except Exception:  # not stored (yet)
        return None


def failed_total() -> float:
    """Objects the watcher gave up on so far, whatever their kind and reason."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "respawn_watcher_objects_failed"
        for sample in family.samples
        if sample.name == "respawn_watcher_objects_failed_total"
    )


async def stored_dead_letters(bus: Bus) -> int:
    return int((await bus.js.stream_info(subjects.DEAD_LETTER_STREAM)).state.messages)


async def test_bad_objects_are_dead_lettered_and_the_good_one_after_them_is_observed(
    watcher: tuple[service.Watcher, Script], own_bus: Bus
) -> None:
    _, script = watcher
    ns = f"ns-{uid()}"
    deep_before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-deep"
    )
    large_before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large"
    )
    bad_pod_before = metric(
        "respawn_watcher_objects_failed_total", kind=PodObservation.KIND, reason="untranslatable"
    )
    # The object that killed the watcher: a Job template with a field 300 levels deep. It is now
    # observed, without the template's body.
    deep_template = appwrapper(ns, "deep-template")
    deep_template["spec"]["components"][0]["template"]["spec"]["x"] = nested(300)
    large = appwrapper(ns, "large", rv="5")
    large["metadata"]["annotations"] = {"a": "z" * 2_000_000}
    script.add(
        AW_REF,
        WatchEvent("ADDED", deep_template),
        WatchEvent("ADDED", appwrapper(ns, "deep", status={"x": nested(300)})),
        WatchEvent("ADDED", large),
        WatchEvent("ADDED", appwrapper(ns, "good")),
    )
    script.add(
        POD_REF,
        WatchEvent("ADDED", pod(ns, "good", "bad-pod", containerStatuses=["not a map"])),
        WatchEvent("ADDED", pod(ns, "good", "good-pod")),
    )

    good = await until(
        "the good AppWrapper observed",
        lambda: last(own_bus, subjects.appwrapper_obs(ns, "good", "appwrapper", "good")),
    )
    assert decode(AppWrapperObservation, good.data).ref.uid == "uid-good"
    good_pod = await until(
        "the good pod observed", lambda: last(own_bus, subjects.appwrapper_obs(ns, "good", "pod", "good-pod"))
    )
    assert decode(PodObservation, good_pod.data).phase == "Running"
    deep_template = await last(
        own_bus, subjects.appwrapper_obs(ns, "deep-template", "appwrapper", "deep-template")
    )
    assert deep_template is not None
    [component] = decode(AppWrapperObservation, deep_template.data).body["spec"]["components"]
    assert "spec" not in component["template"]
    for refused in ("deep", "large"):
        assert await last(own_bus, subjects.appwrapper_obs(ns, refused, "appwrapper", refused)) is None

    letters = await dead_letters(own_bus, 3)
    by_name = {letter.headers[DL_OBJECT_NAME_HEADER]: letter for letter in letters}
    assert {name: by_name[name].headers[DL_REASON_HEADER] for name in ("deep", "large", "bad-pod")} == {
        "deep": "too-deep",
        "large": "too-large",
        "bad-pod": "untranslatable",
    }
    large = by_name["large"]
    assert (large.headers[DL_OBJECT_UID_HEADER], large.headers[DL_OBJECT_RESOURCE_VERSION_HEADER]) == (
        "uid-large",
        "5",
    )
    assert large.headers[DL_SUBJECT_HEADER] == subjects.appwrapper_obs(ns, "large", "appwrapper", "large")
    # A summary of the object, never the object: the dead letter of a 2 MB object is small.
    assert len(large.data) < 2048
    assert msgpack.unpackb(large.data)["name"] == "large"
    assert by_name["bad-pod"].headers[DL_SUBJECT_HEADER] == subjects.appwrapper_obs(
        ns, "good", "pod", "bad-pod"
    )

    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-deep")
        == deep_before + 1
    )
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large")
        == large_before + 1
    )
    assert (
        metric("respawn_watcher_objects_failed_total", kind=PodObservation.KIND, reason="untranslatable")
        == bad_pod_before + 1
    )


async def test_an_object_the_server_refuses_is_dead_lettered_with_its_identity_and_the_next_is_observed(
    watcher: tuple[service.Watcher, Script], own_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the watcher's own cap out of the way, the bus refuses the object (over NATS's
    # max_payload) with a PermanentPublishError: a failure no retry can clear.
    monkeypatch.setattr(translate, "MAX_OBSERVATION_BYTES", 10 * own_bus.max_payload)
    _, script = watcher
    ns = f"ns-{uid()}"
    before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large"
    )
    huge = appwrapper(ns, "huge", rv="3", status={"blob": "z" * (2 * own_bus.max_payload)})
    script.add(AW_REF, WatchEvent("ADDED", huge), WatchEvent("ADDED", appwrapper(ns, "after")))
    await until(
        "the next AppWrapper observed",
        lambda: last(own_bus, subjects.appwrapper_obs(ns, "after", "appwrapper", "after")),
    )
    assert await last(own_bus, subjects.appwrapper_obs(ns, "huge", "appwrapper", "huge")) is None
    [letter] = await dead_letters(own_bus, 1)
    assert_dead_letter(
        letter, subjects.appwrapper_obs(ns, "huge", "appwrapper", "huge"), "huge", "3", "too-large"
    )
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="too-large")
        == before + 1
    )


def assert_dead_letter(letter: Any, subject: str, name: str, resource_version: str, reason: str) -> None:
    """The dead letter names the object (headers and summary) and the subject it was meant for."""
    headers = letter.headers
    assert headers[DL_SUBJECT_HEADER] == subject
    assert headers[DL_REASON_HEADER] == reason
    assert (headers[DL_OBJECT_NAME_HEADER], headers[DL_OBJECT_UID_HEADER]) == (name, f"uid-{name}")
    assert headers[DL_OBJECT_RESOURCE_VERSION_HEADER] == resource_version
    summary = msgpack.unpackb(letter.data)
    assert (summary["name"], summary["uid"], summary["reason"]) == (name, f"uid-{name}", reason)


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
    own_bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = f"ns-{uid()}"
    bad = subjects.appwrapper_obs(ns, "bad", "appwrapper", "bad")
    before = metric(
        "respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="unexpected"
    )
    async with running(BugOnPublish(own_bus, bad), monkeypatch) as (_, script):
        script.add(
            AW_REF,
            WatchEvent("ADDED", appwrapper(ns, "bad", rv="3")),
            WatchEvent("ADDED", appwrapper(ns, "good")),
        )
        await until(
            "the next AppWrapper observed",
            lambda: last(own_bus, subjects.appwrapper_obs(ns, "good", "appwrapper", "good")),
        )
    assert await last(own_bus, bad) is None
    [letter] = await dead_letters(own_bus, 1)
    assert_dead_letter(letter, bad, "bad", "3", "unexpected")
    assert (
        metric("respawn_watcher_objects_failed_total", kind=AppWrapperObservation.KIND, reason="unexpected")
        == before + 1
    )


async def test_an_object_seen_while_nats_is_down_is_published_once_it_is_back(
    watcher: tuple[service.Watcher, Script],
    own_nats: NatsServer,
    own_bus: Bus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, script = watcher
    ns = f"ns-{uid()}"
    subject = subjects.appwrapper_obs(ns, "during-outage", "appwrapper", "during-outage")
    failed_before = failed_total()
    await asyncio.to_thread(own_nats.stop)
    script.add(
        AW_REF,
        WatchEvent("ADDED", appwrapper(ns, "during-outage")),
        WatchEvent("ADDED", appwrapper(ns, "after-it")),
    )
    # The bus retries a failed publish for 30 s by itself and then raises; an outage longer than
    # that reaches the watcher, which retries in turn instead of giving up on the object.
    await until(
        "the watcher to retry the publish itself",
        lambda: f"publishing {subject} failed" in caplog.text,
        within=90,
        every=0.5,
    )
    assert failed_total() == failed_before
    assert script.queues[AW_REF.kind].qsize() == 1, "the watcher went on before the object was published"
    await asyncio.to_thread(own_nats.start)
    stored = await until("the object published once NATS is back", lambda: last(own_bus, subject), within=60)
    assert decode(AppWrapperObservation, stored.data).ref.uid == "uid-during-outage"
    await until(
        "the next object published",
        lambda: last(own_bus, subjects.appwrapper_obs(ns, "after-it", "appwrapper", "after-it")),
    )
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    conf = tmp_path / "nats.conf"
    conf.write_text(NO_DEAD_LETTERS)
    server = await asyncio.to_thread(start_nats, tmp_path / "nats", config_file=conf)
    try:
        bus = await Bus.connect(
            server.url, name="respawn-watcher", user="watcher", password=RESTRICTED_PASSWORD
        )
        try:
            await bus.ensure_streams()
            ns = f"ns-{uid()}"
            before = metric(
                "respawn_watcher_objects_failed_total", kind=PodObservation.KIND, reason="untranslatable"
            )
            async with running(bus, monkeypatch) as (_, script):
                script.add(
                    POD_REF,
                    WatchEvent("ADDED", pod(ns, "aw", "bad-pod", containerStatuses=["not a map"])),
                    WatchEvent("ADDED", pod(ns, "aw", "good-pod")),
                )
                await until(
                    "the pod after the bad one observed",
                    lambda: last(bus, subjects.appwrapper_obs(ns, "aw", "pod", "good-pod")),
                )
            # The dead letter was refused by the server: nothing stored, and the watcher said so.
            assert await stored_dead_letters(bus) == 0
            assert f"cannot dead-letter {ns}/bad-pod either" in caplog.text
            assert (
                metric(
                    "respawn_watcher_objects_failed_total", kind=PodObservation.KIND, reason="untranslatable"
                )
                == before + 1
            )
        finally:
            await bus.close()
    finally:
        await asyncio.to_thread(server.stop)


async def test_tombstones_carry_the_ttl_and_deletes_missed_while_down_get_one_after_the_list(
    watcher: tuple[service.Watcher, Script], own_bus: Bus
) -> None:
    _, script = watcher
    ns = f"ns-{uid()}"

    def aw_subject(name: str) -> str:
        return subjects.appwrapper_obs(ns, name, "appwrapper", name)

    # What an earlier watcher left: two AppWrappers and a pod; "gone" and its pod were deleted
    # while no watcher ran.
    earlier = {}
    for name in ("gone", "kept"):
        message = AppWrapperObservation(
            ref=ObjectRef(namespace=ns, name=name, uid=f"uid-{name}"), observed_at=NOW
        )
        earlier[name] = await own_bus.publish(aw_subject(name), message, msg_id=None)
    gone_pod = subjects.appwrapper_obs(ns, "gone", "pod", "gone-pod")
    await own_bus.publish(
        gone_pod,
        PodObservation(ref=ObjectRef(namespace=ns, name="gone-pod"), appwrapper="gone", observed_at=NOW),
        msg_id=None,
    )
    missed_before = metric("respawn_watcher_missed_deletes_total", kind=AppWrapperObservation.KIND)

    script.add(AW_REF, WatchEvent("ADDED", appwrapper(ns, "kept")), WatchEvent("SYNCED", {}))
    script.add(POD_REF, WatchEvent("SYNCED", {}))

    async def tombstone(subject: str) -> Any:
        stored = await last(own_bus, subject)
        return stored if stored is not None and decode(AnyObservation, stored.data).deleted else None

    gone = await until("the missed delete's tombstone", lambda: tombstone(aw_subject("gone")))
    assert gone.headers[TTL_HEADER] == ttl_value(TTL.total_seconds())
    assert decode(AppWrapperObservation, gone.data).ref.name == "gone"
    pod_tomb = await until("the missed pod delete's tombstone", lambda: tombstone(gone_pod))
    assert decode(PodObservation, pod_tomb.data).appwrapper == "gone"
    # The watcher's own observation of the object it listed: a state, which never expires.
    kept = await last(own_bus, aw_subject("kept"))
    assert kept.seq > earlier["kept"].seq
    assert not decode(AppWrapperObservation, kept.data).deleted
    assert TTL_HEADER not in (kept.headers or {})
    assert (
        metric("respawn_watcher_missed_deletes_total", kind=AppWrapperObservation.KIND) >= missed_before + 1
    )

    # A delete seen by the watch: its tombstone has the TTL too. A re-list afterwards finds the
    # subject (the tombstone) without its object, and must not publish the tombstone again:
    # that would start its TTL over.
    script.add(AW_REF, WatchEvent("DELETED", appwrapper(ns, "kept", rv="2")))
    deleted = await until("the watched delete's tombstone", lambda: tombstone(aw_subject("kept")))
    assert deleted.headers[TTL_HEADER] == ttl_value(TTL.total_seconds())
    script.add(AW_REF, WatchEvent("SYNCED", {}), WatchEvent("ADDED", appwrapper(ns, "marker")))
    await until("the event after the re-list handled", lambda: last(own_bus, aw_subject("marker")))
    for subject, first in ((aw_subject("kept"), deleted), (aw_subject("gone"), gone)):
        again = await last(own_bus, subject)
        assert again.seq == first.seq, subject


async def test_the_watcher_user_may_list_stored_subjects_and_dead_letter(auth_nats: AuthNats) -> None:
    # What reconciliation and isolation do on the bus, as the watcher's NATS user
    # (respawn/natsauth.py): a permission missing here would fail only in production.
    ns = f"ns-{uid()}"
    subject = subjects.appwrapper_obs(ns, "aw", "appwrapper", "aw")
    async with service_bus(auth_nats, "watcher") as bus:
        message = AppWrapperObservation(ref=ObjectRef(namespace=ns, name="aw"), observed_at=NOW)
        await bus.publish(subject, message, msg_id=None)
        found = await bus.subjects(
            subjects.OBSERVATIONS_STREAM, translate.observed_subject_filter(message.KIND)
        )
        assert found.get(subject) == 1
        letter = await bus.dead_letter(subject, {"name": "aw"}, reason="too-deep", error="deep", name="aw")
        assert letter.stream == subjects.DEAD_LETTER_STREAM


async def test_a_pod_whose_appwrapper_never_shows_up_is_held_then_given_up_unpublished(
    watcher: tuple[service.Watcher, Script], bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "HOLD_LIMIT", 1.0)
    w, script = watcher
    ns = f"ns-{uid()}"
    before = metric("respawn_watcher_pods_unattributed_total", reason="unresolved")
    script.add(AW_REF, WatchEvent("SYNCED", {}))
    script.add(POD_REF, WatchEvent("ADDED", pod(ns, "unknown", "waiting")), WatchEvent("SYNCED", {}))
    await until("the pod held", lambda: "uid-waiting" in w.held)
    await until(
        "the pod given up",
        lambda: metric("respawn_watcher_pods_unattributed_total", reason="unresolved"),
        done=lambda now: now > before,
    )
    assert "uid-waiting" not in w.held
    assert await last(bus, subjects.appwrapper_obs(ns, "unknown", "pod", "waiting")) is None
    # Its AppWrapper showing up later, the pod's next change is published.
    script.add(AW_REF, WatchEvent("ADDED", appwrapper(ns, "unknown")))
    script.add(POD_REF, WatchEvent("MODIFIED", pod(ns, "unknown", "waiting", reason="again")))
    seen = await until(
        "the pod published", lambda: last(bus, subjects.appwrapper_obs(ns, "unknown", "pod", "waiting"))
    )
    assert decode(PodObservation, seen.data).ref.uid == "uid-waiting"
