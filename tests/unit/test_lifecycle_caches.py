"""Lifecycle's watch caches without servers: what they hold, what they answer, what they trigger,
what a keep predicate and a reshard leave in them, and what the reader and the write-through
client make of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.lifecycle.actions import CreateOutcome, CreateResult
from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.cache import WatchedCache
from services.lifecycle.componentcache import ComponentCache, ComponentCaches
from services.lifecycle.observed import ObservedPod, Presence
from services.lifecycle.podcache import PodCache
from services.lifecycle.reader import Reader
from services.lifecycle.workqueue import Key
from services.lifecycle.writethrough import WriteThrough
from shared.appwrapper.constants import (
    API_VERSION,
    APPWRAPPER_LABEL,
    COMPONENT_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ComponentReason,
)
from shared.kube import KubeApiError, ResourceRef
from shared.kube.watch import WatchEvent

AWS = ResourceRef(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True)
PODS = ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
JOBS = ResourceRef(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)
NODES = ResourceRef(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
AW_UID = "uid-aw-a"


def appwrapper(
    name: str = "a", rv: str = "10", *, ns: str = "team", uid: str = AW_UID, **status: Any
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid,
            "resourceVersion": rv,
            "managedFields": [
                {
                    "manager": "respawn",
                    "subresource": "status",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsV1": {"f:status": {}},
                }
            ],
        },
        "spec": {
            "components": [
                {"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-job"}}}
            ]
        },
        "status": status,
    }


def job(
    name: str,
    aw: str | None = "a",
    rv: str = "20",
    *,
    ns: str = "team",
    uid: str = "",
    owner: str = AW_UID,
    **meta: Any,
) -> dict[str, Any]:
    labels = {APPWRAPPER_LABEL: aw} if aw is not None else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            "labels": labels,
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": KIND, "name": aw or "", "uid": owner, "controller": True}
            ],
            **meta,
        },
        "status": {"active": 1},
    }


def pod(name: str, aw: str, rv: str = "30", *, ns: str = "team", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {APPWRAPPER_LABEL: aw},
            **meta,
        },
        "status": {"phase": "Running"},
    }


def feed(cache: WatchedCache[Any], *objects: dict[str, Any], synced: bool = True) -> None:
    """The initial list of ``objects``, then SYNCED."""
    for obj in objects:
        cache.apply(WatchEvent("ADDED", obj))
    if synced:
        cache.apply(WatchEvent("SYNCED", {"metadata": {"resourceVersion": "100"}}))


class Owned:
    """A keep predicate whose answer the test changes (as partition ownership changes)."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def __call__(self, key: Key) -> bool:
        return key[1] in self.names


# ------------------------------------------------------------------------ the AppWrapper cache


def test_an_appwrapper_is_answered_from_the_cache_less_its_field_sets() -> None:
    cache = AppWrapperCache()
    feed(cache, appwrapper("a"), synced=False)
    found = cache.lookup(("team", "a"))
    assert found.known and found.obj is not None
    assert found.obj["metadata"]["resourceVersion"] == "10"
    assert found.obj["metadata"]["managedFields"] == [
        {"manager": "respawn", "subresource": "status", "time": "2026-01-01T00:00:00Z"}
    ]
    assert found.obj["spec"]["components"][0]["template"]["kind"] == "Job"
    # What is handed out is a copy: a caller that sets a field does not change the cache.
    found.obj["status"] = {"phase": "Scribbled"}  # type: ignore[index]
    assert cache.lookup(("team", "a")).obj["status"] == {}  # type: ignore[index]


def test_an_appwrapper_is_handed_out_by_what_it_holds_only_if_it_holds_it() -> None:
    cache = AppWrapperCache()
    marked = appwrapper("marked")
    marked["metadata"]["annotations"] = {"respawn.dev/incident-trace": "00-ab-cd-01"}
    feed(cache, appwrapper("plain"), marked)
    assert cache.holding(("team", "plain"), "respawn.dev/incident-trace") is None
    assert cache.holding(("team", "absent"), "respawn.dev/incident-trace") is None
    found = cache.holding(("team", "marked"), "respawn.dev/incident-trace")
    assert found is not None
    assert found["metadata"]["annotations"] == {"respawn.dev/incident-trace": "00-ab-cd-01"}


def test_absence_is_unknown_before_the_list_has_synced_and_for_one_never_seen() -> None:
    cache = AppWrapperCache()
    assert not cache.lookup(("team", "a")).known
    feed(cache, appwrapper("a"))
    assert not cache.lookup(("team", "new")).known, "perhaps created after the watch's last event: a GET says"


def test_an_appwrapper_seen_deleted_is_gone_but_only_for_its_own_incarnation() -> None:
    cache = AppWrapperCache()
    feed(cache, appwrapper("a"))
    cache.apply(WatchEvent("DELETED", appwrapper("a", "11")))
    assert cache.lookup(("team", "a")) == cache.lookup(("team", "a"), AW_UID)
    gone = cache.lookup(("team", "a"), AW_UID)
    assert gone.known and gone.obj is None
    # A verdict about a newer incarnation of the same name: not answered by the old tombstone.
    assert not cache.lookup(("team", "a"), "uid-newer").known
    cache.apply(WatchEvent("ADDED", appwrapper("a", "12", uid="uid-newer")))
    assert cache.lookup(("team", "a"), "uid-newer").obj is not None


def test_tombstones_are_bounded() -> None:
    cache = AppWrapperCache(tombstones=2)
    feed(cache, *(appwrapper(n) for n in ("a", "b", "c")))
    for n in ("a", "b", "c"):
        cache.apply(WatchEvent("DELETED", appwrapper(n, "11")))
    assert not cache.lookup(("team", "a")).known, "the oldest tombstone was forgotten"
    assert cache.lookup(("team", "c")).known


def test_changes_trigger_a_reconcile_but_the_initial_list_and_repeats_do_not() -> None:
    triggers: list[Key] = []
    cache = AppWrapperCache(on_change=triggers.append)
    feed(cache, appwrapper("a"))
    assert triggers == []
    cache.apply(WatchEvent("MODIFIED", appwrapper("a", "10")))
    assert triggers == [], "the same version again (a re-list) is no change"
    cache.apply(WatchEvent("MODIFIED", appwrapper("a", "11", phase="Running")))
    cache.apply(WatchEvent("DELETED", appwrapper("a", "12")))
    assert triggers == [("team", "a")] * 2


def test_our_write_wins_over_the_older_events_still_on_their_way() -> None:
    triggers: list[Key] = []
    cache = AppWrapperCache(on_change=triggers.append)
    feed(cache, appwrapper("a", "10"))
    written = appwrapper("a", "15", phase="Resetting")
    cache.wrote(written)
    assert triggers == [("team", "a")], "our write triggers the next pass, as its event would have"
    assert cache.ours(cache.lookup(("team", "a")).obj or {})
    # The events of versions before ours arrive afterwards: ignored; ours arrives: no change.
    cache.apply(WatchEvent("MODIFIED", appwrapper("a", "12", phase="Running")))
    cache.apply(WatchEvent("MODIFIED", written))
    assert (cache.lookup(("team", "a")).obj or {})["status"] == {"phase": "Resetting"}
    assert triggers == [("team", "a")]
    # Someone else writes after us: theirs is newer, and the AppWrapper is no longer as we wrote it.
    cache.apply(WatchEvent("MODIFIED", appwrapper("a", "16", phase="Resetting")))
    assert not cache.ours(cache.lookup(("team", "a")).obj or {})
    assert triggers == [("team", "a")] * 2


def test_an_appwrapper_read_by_a_get_is_taken_if_newer_without_a_trigger() -> None:
    triggers: list[Key] = []
    cache = AppWrapperCache(on_change=triggers.append)
    feed(cache, appwrapper("a", "10"))
    cache.offer(appwrapper("a", "14", phase="Running"))
    cache.offer(appwrapper("a", "12"))
    assert (cache.lookup(("team", "a")).obj or {})["metadata"]["resourceVersion"] == "14"
    assert triggers == []


def test_versions_that_are_not_integers_are_never_taken_for_older() -> None:
    cache = AppWrapperCache()
    feed(cache, appwrapper("a", "b7"))
    cache.apply(WatchEvent("MODIFIED", appwrapper("a", "a1", phase="Running")))
    assert (cache.lookup(("team", "a")).obj or {})["status"] == {"phase": "Running"}


# ---------------------------------------------------------------- keep and reshard, every cache


def test_a_cache_keeps_only_the_appwrappers_its_predicate_passes() -> None:
    owned = Owned("a")
    triggers: list[Key] = []
    aws = AppWrapperCache(on_change=triggers.append, keep=owned)
    jobs = ComponentCache(JOBS, on_change=triggers.append, keep=owned)
    pods = PodCache(on_change=triggers.append, keep=owned)
    feed(aws, appwrapper("a"), appwrapper("b"))
    feed(jobs, job("a-job", "a"), job("b-job", "b"))
    feed(pods, pod("a-0", "a"), pod("b-0", "b"))
    assert [len(c) for c in (aws, jobs, pods)] == [1, 1, 1]
    assert aws.lookup(("team", "a")).known
    # Another replica's AppWrapper: nothing is answered for it (a read of it asks the server).
    assert not aws.lookup(("team", "b")).known
    assert jobs.get("team", "b-job") is None and not jobs.answers(("team", "b"))
    assert pods.pods("team", "b") is None
    # Its changes trigger nothing here.
    for cache, obj in (
        (aws, appwrapper("b", "50")),
        (jobs, job("b-job", "b", "51")),
        (pods, pod("b-0", "b", "52")),
    ):
        cache.apply(WatchEvent("MODIFIED", obj))
    assert triggers == []


async def test_reshard_drops_what_is_no_longer_kept() -> None:
    owned = Owned("a", "b")
    aws = AppWrapperCache(keep=owned)
    jobs = ComponentCache(JOBS, keep=owned)
    pods = PodCache(keep=owned)
    feed(aws, appwrapper("a"), appwrapper("b"))
    feed(jobs, job("a-job", "a"), job("b-job", "b"))
    feed(pods, pod("a-0", "a"), pod("b-0", "b"))
    aws.apply(WatchEvent("DELETED", appwrapper("b", "60")))
    owned.names = {"a"}
    for cache in (aws, jobs, pods):
        await cache.reshard()  # not watching: nothing to list again
    assert aws.lookup(("team", "a")).known and not aws.lookup(("team", "b")).known
    assert [e.value["metadata"]["name"] for e in jobs.entries()] == ["a-job"]
    assert pods.pods("team", "b") is None and [p.name for p in pods.pods("team", "a") or ()] == ["a-0"]
    # Taking it back: its objects come with the next list; until then nothing is answered for it.
    owned.names = {"a", "b"}
    assert not aws.lookup(("team", "b")).known, "the tombstone went with the AppWrapper"
    assert not jobs.answers(("team", "b")) and not pods.answers(("team", "b"))
    assert jobs.answers(("team", "a"))


def test_an_appwrapper_turned_away_is_not_answered_for_when_it_becomes_kept() -> None:
    """Between a change of the predicate and the reshard that lists its objects, the cache must
    not take the absence of a newly kept AppWrapper's objects for their deletion."""
    owned = Owned("a")
    jobs = ComponentCache(JOBS, keep=owned)
    feed(jobs, job("a-job", "a"), job("b-job", "b"))
    assert not jobs.answers(("team", "b")) and not jobs.answers(("team", "c")), "not kept"
    owned.names = {"a", "b", "c"}
    assert not jobs.answers(("team", "b")), "its Job was turned away: the cache lacks it"
    assert jobs.answers(("team", "c")), "nothing of it was ever seen: nothing of it is missing"


async def test_caches_of_every_component_kind_reshard_together() -> None:
    owned = Owned("a", "b")
    caches = ComponentCaches(keep=owned)
    jobs = caches.cache(JOBS)
    assert jobs is not None
    feed(jobs, job("a-job", "a"), job("b-job", "b"))
    owned.names = {"b"}
    await caches.reshard()
    assert [e.value["metadata"]["name"] for e in jobs.entries()] == ["b-job"]


# ------------------------------------------------------------------------- component caches


def test_a_component_is_kept_as_what_a_read_of_it_is_used_for() -> None:
    cache = ComponentCache(JOBS)
    feed(cache, job("a-job", "a", annotations={COMPONENT_ANNOTATION: "x/y/0", "other": "v"}))
    held = cache.get("team", "a-job")
    assert held is not None and held.uid == "uid-a-job" and held.version == "20"
    assert held.value == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "a-job",
            "namespace": "team",
            "uid": "uid-a-job",
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": KIND, "name": "a", "uid": AW_UID, "controller": True}
            ],
            "annotations": {COMPONENT_ANNOTATION: "x/y/0"},
            "labels": {APPWRAPPER_LABEL: "a"},
        },
    }
    assert cache.objects(("team", "a")) == [held.value]


def test_a_component_s_status_is_no_change_its_deletion_is() -> None:
    triggers: list[Key] = []
    cache = ComponentCache(JOBS, on_change=triggers.append)
    feed(cache, job("a-job", "a"))
    status_only = job("a-job", "a", "21")
    status_only["status"] = {"failed": 1}
    cache.apply(WatchEvent("MODIFIED", status_only))
    assert triggers == [], "health judges a component's status; lifecycle needs its presence"
    cache.apply(WatchEvent("MODIFIED", job("a-job", "a", "22", deletionTimestamp="2026-01-01T00:00:00Z")))
    cache.apply(WatchEvent("DELETED", job("a-job", "a", "23")))
    assert triggers == [("team", "a")] * 2
    assert cache.get("team", "a-job") is None and cache.answers(("team", "a"))


def test_the_late_deletion_of_an_earlier_namesake_leaves_the_new_component() -> None:
    cache = ComponentCache(JOBS)
    feed(cache, job("a-job", "a", "20", uid="old"))
    cache.put(job("a-job", "a", "40", uid="new"))  # our create of the next attempt's Job
    cache.apply(WatchEvent("MODIFIED", job("a-job", "a", "25", uid="old", deletionTimestamp="t")))
    cache.apply(WatchEvent("DELETED", job("a-job", "a", "26", uid="old")))
    held = cache.get("team", "a-job")
    assert held is not None and held.uid == "new"


def test_a_deleted_component_or_pod_counts_as_on_its_way_out_until_the_watch_says_more() -> None:
    jobs = ComponentCache(JOBS)
    pods = PodCache()
    feed(jobs, job("a-job", "a"))
    feed(pods, pod("a-0", "a"))
    # The delete answered with a Status (no object): marked by us.
    jobs.mark_deleting("team", "a-job", "uid-a-job", {"kind": "Status", "status": "Success"})
    assert (jobs.get("team", "a-job") or jobs.get("x", "x")).value["metadata"]["deletionTimestamp"]  # type: ignore[union-attr]
    # The delete answered with the pod as it now is: taken as it is.
    pods.mark_deleting(
        "team", "a-0", "uid-a-0", pod("a-0", "a", "31", deletionTimestamp="2026-01-01T00:00:00Z")
    )
    assert pods.pods("team", "a") == (
        ObservedPod(name="a-0", phase="Running", terminating=True, uid="uid-a-0"),
    )
    # Another object of that name (another uid) is not marked.
    jobs.put(job("b-job", "b", uid="b1"))
    jobs.mark_deleting("team", "b-job", "b0", None)
    assert "deletionTimestamp" not in (jobs.get("team", "b-job") or jobs.get("x", "x")).value["metadata"]  # type: ignore[union-attr]


def test_component_caches_are_one_per_namespaced_kind_and_watch_only_when_they_can() -> None:
    started: list[str] = []
    caches = ComponentCaches(spawn=lambda name, loop: started.append(name))
    assert caches.cache(NODES) is None, "a cluster-scoped kind is read from the API server"
    first = caches.cache(JOBS)
    assert caches.cache(ResourceRef("batch", "v2", "jobs", "Job", True)) is first, (
        "one per group and resource"
    )
    assert caches.get(JOBS) is first and len(caches) == 1
    assert started == [], "no client: nothing is watched, and every read goes to the server"
    spawned: list[str] = []
    live = ComponentCaches(object(), spawn=lambda name, loop: spawned.append(name))  # type: ignore[arg-type]
    live.cache(JOBS)
    live.cache(JOBS)
    assert spawned == ["lifecycle-jobs-cache"]


# ----------------------------------------------------------------------- the reader, on caches


class CountingKube:
    """Stands in for the Kube client: answers GETs of ``objects`` (404 otherwise) and LISTs of
    ``listed``, recording each."""

    def __init__(self, *objects: dict[str, Any], listed: list[dict[str, Any]] | None = None) -> None:
        self.objects = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
        self.listed = listed or []
        self.calls: list[str] = []

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        return {"Job": JOBS, KIND: AWS, "Pod": PODS}[kind]

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append(f"get {ref.plural}/{name}")
        try:
            return dict(self.objects[(namespace or "", name)])
        except KeyError:
            raise KubeApiError(404, "NotFound", f"{name} not found") from None

    async def list(self, ref: ResourceRef, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        self.calls.append(f"list {ref.plural}")
        return {"items": self.listed}


def reader(kube: CountingKube, aws: AppWrapperCache, caches: ComponentCaches) -> Reader:
    return Reader(
        kube, appwrappers=AWS, pods=PODS, pod_cache=PodCache(), appwrapper_cache=aws, components=caches
    )


def deployed(
    name: str, reason: str = ComponentReason.CREATED_SUCCESSFULLY, status: str = "True"
) -> dict[str, Any]:
    return {
        "componentStatus": [
            {
                "name": name,
                "kind": "Job",
                "apiVersion": "batch/v1",
                "conditions": [{"type": "ResourcesDeployed", "status": status, "reason": reason}],
            }
        ]
    }


async def observe(r: Reader, aw: Mapping[str, Any], created: dict[int, CreateOutcome] | None = None) -> Any:
    return (await r.observe(aw, created or {}, pods=False, nodes=False)).component(0)


async def test_the_appwrapper_and_its_component_are_read_from_the_caches() -> None:
    aws, caches = AppWrapperCache(), ComponentCaches()
    feed(aws, appwrapper("a", status=None))
    jobs = caches.cache(JOBS)
    assert jobs is not None
    feed(jobs, job("a-job", "a"))
    kube = CountingKube()
    r = reader(kube, aws, caches)
    aw = await r.appwrapper(("team", "a"))
    assert aw is not None
    seen = await observe(r, {**aw, "status": deployed("a-job")})
    assert (seen.presence, seen.controlled_by_us, seen.uid) == (Presence.PRESENT, True, "uid-a-job")
    assert kube.calls == []


async def test_an_appwrapper_the_cache_cannot_answer_for_is_read_by_a_get_and_cached() -> None:
    aws = AppWrapperCache()
    feed(aws)
    kube = CountingKube(appwrapper("b", "70"))
    r = reader(kube, aws, ComponentCaches())
    assert (await r.appwrapper(("team", "b")) or {})["metadata"]["resourceVersion"] == "70"
    assert await r.appwrapper(("team", "b")) is not None
    assert kube.calls == ["get appwrappers/b"], "the GET's answer is in the cache now"
    assert await r.appwrapper(("team", "gone")) is None
    assert kube.calls[-1] == "get appwrappers/gone"


async def test_after_a_conflict_the_appwrapper_is_read_by_a_get_once() -> None:
    aws = AppWrapperCache()
    feed(aws, appwrapper("a", "10"))
    kube = CountingKube(appwrapper("a", "13", phase="Running"))
    r = reader(kube, aws, ComponentCaches())
    r.refresh(("team", "a"))
    assert (await r.appwrapper(("team", "a")) or {})["metadata"]["resourceVersion"] == "13"
    assert (await r.appwrapper(("team", "a")) or {})["metadata"]["resourceVersion"] == "13"
    assert kube.calls == ["get appwrappers/a"]


async def test_an_absent_component_is_believed_only_where_absence_cannot_mislead() -> None:
    aws, caches = AppWrapperCache(), ComponentCaches()
    jobs = caches.cache(JOBS)
    assert jobs is not None
    feed(jobs)
    kube = CountingKube(job("a-job", "a"))
    r = reader(kube, aws, caches)
    # Never created (no status): absent, no call; its create would meet AlreadyExists anyway.
    assert (await observe(r, appwrapper("a"))).presence is Presence.ABSENT
    # Its deletion recorded: absent, no call.
    assert (
        await observe(r, appwrapper("a", **deployed("a-job", ComponentReason.DELETED, "False")))
    ).presence is Presence.ABSENT
    assert kube.calls == []
    # Recorded as deployed, by someone else's write (or one from before a restart): the cache
    # may lag behind that writer's create, so a GET says; here it exists.
    theirs = appwrapper("a", "50", **deployed("a-job"))
    assert (await observe(r, theirs)).presence is Presence.PRESENT
    assert kube.calls == ["get jobs/a-job"]
    # Recorded as deployed by our own last write: our creates are in the cache, so it is gone.
    feed(aws, theirs)
    ours = appwrapper("a", "51", **deployed("a-job"))
    aws.wrote(ours)
    assert (await observe(r, ours)).presence is Presence.ABSENT
    assert kube.calls == ["get jobs/a-job"]
    # A create that failed (someone else's object of that name, or a timeout after which it may
    # exist): even under our own last write, a GET says.
    errored = appwrapper("a", "52", **deployed("a-job", ComponentReason.CREATION_ERRORED, "False"))
    aws.wrote(errored)
    assert (await observe(r, errored)).presence is Presence.PRESENT
    assert kube.calls == ["get jobs/a-job"] * 2


async def test_a_component_whose_kind_has_not_synced_is_read_by_a_get() -> None:
    aws, caches = AppWrapperCache(), ComponentCaches()
    kube = CountingKube(job("a-job", "a"))
    r = reader(kube, aws, caches)
    assert (await observe(r, appwrapper("a"))).presence is Presence.PRESENT
    assert kube.calls == ["get jobs/a-job"]


def generated(index: int = 0, **status: Any) -> dict[str, Any]:
    aw = appwrapper("g", **status)
    aw["spec"]["components"][0]["template"]["metadata"] = {"generateName": "g-"}
    return aw


async def test_a_generated_name_is_found_by_its_annotation_and_listed_only_when_a_create_is_unanswered() -> (
    None
):
    aws, caches = AppWrapperCache(), ComponentCaches()
    jobs = caches.cache(JOBS)
    assert jobs is not None
    identity = f"{AW_UID}/-/0"
    listed = job("g-xyz", "g", annotations={COMPONENT_ANNOTATION: identity})
    kube = CountingKube(listed=[listed])
    feed(jobs)
    r = reader(kube, aws, caches)
    # No create recorded: the cache's "none" holds.
    assert (await observe(r, generated())).presence is Presence.ABSENT
    assert kube.calls == []
    # A create initiated whose answer was never recorded (a crash, a timeout): a LIST says.
    initiated = generated(**deployed("", ComponentReason.CREATION_INITIATED, "Unknown"))
    found = await observe(r, initiated)
    assert (found.presence, found.name) == (Presence.PRESENT, "g-xyz")
    assert kube.calls == ["list jobs"]
    # Once the watch has it, the cache finds it.
    jobs.apply(WatchEvent("ADDED", listed))
    assert (await observe(r, initiated)).name == "g-xyz"
    assert kube.calls == ["list jobs"]


async def test_our_create_is_seen_on_the_next_pass_before_its_watch_event() -> None:
    aws, caches = AppWrapperCache(), ComponentCaches()
    jobs = caches.cache(JOBS)
    assert jobs is not None
    feed(jobs)
    kube = CountingKube()
    writes = WriteThrough(
        WritingKube(kube),
        appwrappers=AWS,
        appwrapper_cache=aws,
        pods=PODS,
        pod_cache=PodCache(),
        components=caches,
    )
    created = await writes.create(JOBS, job("a-job", "a", "80"), "team")
    outcome = CreateOutcome(CreateResult.CREATED, name="a-job", uid=created["metadata"]["uid"])
    r = reader(kube, aws, caches)
    seen = await observe(
        r, appwrapper("a", **deployed("a-job", ComponentReason.CREATION_INITIATED, "Unknown")), {0: outcome}
    )
    assert (seen.presence, seen.uid) == (Presence.PRESENT, "uid-a-job")
    assert kube.calls == []


class WritingKube:
    """Stands in for the Kube client's writes: each answers the object written, with a new version."""

    def __init__(self, reads: CountingKube) -> None:
        self.reads = reads
        self.version = 100

    def _answer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        return await self.reads.resource(api_version, kind)

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.reads.get(ref, name, namespace)

    async def create(
        self,
        ref: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        return self._answer(body)

    async def replace(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._answer(body)

    async def replace_status(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._answer(body)

    async def patch(
        self, ref: ResourceRef, name: str, patch: Any, namespace: str | None = None, *, patch_type: str = ""
    ) -> dict[str, Any]:
        return self._answer(appwrapper(name))

    async def delete(
        self,
        ref: ResourceRef,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> dict[str, Any] | None:
        return {"kind": "Status", "status": "Success"}

    async def create_event(self, involved: Mapping[str, Any], **kw: Any) -> None:
        return None


async def test_writes_go_into_the_caches_they_concern() -> None:
    aws, caches, pods = AppWrapperCache(), ComponentCaches(), PodCache()
    jobs = caches.cache(JOBS)
    assert jobs is not None
    feed(aws, appwrapper("a", "10"))
    feed(jobs, job("a-job", "a"))
    feed(pods, pod("a-0", "a"))
    writes = WriteThrough(
        WritingKube(CountingKube()),
        appwrappers=AWS,
        appwrapper_cache=aws,
        pods=PODS,
        pod_cache=pods,
        components=caches,
    )
    written = await writes.replace_status(AWS, appwrapper("a", "10", phase="Resetting"))
    assert aws.ours(written) and (aws.lookup(("team", "a")).obj or {})["status"] == {"phase": "Resetting"}
    await writes.delete(JOBS, "a-job", "team", uid="uid-a-job")
    await writes.delete(PODS, "a-0", "team", uid="uid-a-0")
    assert (jobs.get("team", "a-job") or jobs.get("x", "x")).value["metadata"]["deletionTimestamp"]  # type: ignore[union-attr]
    assert [p.terminating for p in pods.pods("team", "a") or ()] == [True]
    # An Event is no component: nothing is cached of it.
    events = ResourceRef("", "v1", "events", "Event", True)
    await writes.create(events, {"metadata": {"name": "e", "namespace": "team"}}, "team")
    assert caches.get(events) is None


def test_an_answer_that_arrives_after_the_watch_delivered_the_deletion_does_not_bring_it_back() -> None:
    """A pod deleted with grace 0, an AppWrapper whose last finalizer we removed: the watch can
    deliver the deletion before the write's own answer arrives."""
    aws, pods = AppWrapperCache(), PodCache()
    feed(aws, appwrapper("a", "10"))
    feed(pods, pod("a-0", "a"), pod("a-1", "a"))
    pods.apply(WatchEvent("DELETED", pod("a-0", "a", "40")))
    pods.mark_deleting("team", "a-0", "uid-a-0", pod("a-0", "a", "40", deletionTimestamp="t"))
    assert [p.name for p in pods.pods("team", "a") or ()] == ["a-1"]
    aws.apply(WatchEvent("DELETED", appwrapper("a", "12")))
    aws.wrote(appwrapper("a", "11"))
    aws.offer(appwrapper("a", "11"))
    assert aws.lookup(("team", "a")) == aws.lookup(("team", "a"), AW_UID)
    assert aws.lookup(("team", "a")).obj is None and aws.lookup(("team", "a")).known
    # Its label taken away (the watch says DELETED) and put back (ADDED): the same pod is back.
    pods.apply(WatchEvent("DELETED", pod("a-1", "a", "41")))
    pods.apply(WatchEvent("ADDED", pod("a-1", "a", "42")))
    assert [p.name for p in pods.pods("team", "a") or ()] == ["a-1"]
