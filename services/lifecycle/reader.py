"""Reading what a decision is made from: the AppWrapper, and its components, pods and the nodes
as an :class:`~services.lifecycle.observed.Observed`.

Everything is read from lifecycle's watch caches, as a controller reads its informers: the
AppWrapper from the AppWrapper cache, each component from its kind's cache, the pods from the pod
cache and the nodes from the node cache. The API server is asked only where a cache cannot
answer (see each cache's module): a GET of the AppWrapper before its cache has synced, for one it
never saw, and on the pass after a status write lost to a newer version (:meth:`Reader.refresh`);
a GET of a component whose absence the cache cannot vouch for; a LIST of the pods when the cache
holds none. What is not read is left unknown, which the machine treats conservatively.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, Protocol

from services.lifecycle.actions import CreateOutcome
from services.lifecycle.awcache import AppWrapperCache
from services.lifecycle.componentcache import ComponentCaches
from services.lifecycle.conditions import condition_status, find_condition
from services.lifecycle.nodecache import NodeCache
from services.lifecycle.observed import (
    Observed,
    ObservedComponent,
    ObservedNode,
    ObservedPod,
    Presence,
    controller_uid,
)
from services.lifecycle.podcache import PodCache
from services.lifecycle.templating import component_identity
from services.lifecycle.verdicts import attempt_start
from services.lifecycle.workqueue import Key
from shared import metrics
from shared.appwrapper.constants import (
    API_VERSION,
    APPWRAPPER_LABEL,
    COMPONENT_ANNOTATION,
    KIND,
    ComponentReason,
    ConditionStatus,
    ConditionType,
)
from shared.appwrapper.model import as_mapping
from shared.kube import KubeApiError, ResourceRef
from shared.kube.owners import OwnerCache
from shared.ownership import Outcome, Reason

__all__ = ["NOT_COUNTED", "READ_FAILURES", "ComponentIdentity", "KubeReads", "Reader"]

log = logging.getLogger(__name__)

READ_FAILURES = metrics.counter(
    "respawn_lifecycle_unreadable_answers",
    "API answers lifecycle could not read (not an API error: e.g. nested too deeply), by what was read",
    ["what"],
)

NOT_COUNTED = metrics.counter(
    "respawn_lifecycle_pods_not_counted",
    "Labelled pods lifecycle neither counted nor deleted for an AppWrapper, because their "
    "controller owner chain does not lead to it, by reason",
    ["reason"],
)

# (API group, kind, name) of one of an AppWrapper's components.
ComponentIdentity = tuple[str, str, str]


class KubeReads(Protocol):
    """The reads the reader makes (a subset of :class:`shared.kube.Kube`)."""

    # A deliberate mirror: these signatures repeat those of shared.kube.Kube, so that the reader
    # names only what it uses and its tests may put a pass-through wrapper (fault injection, call
    # records) in front of the real client; keep the two in step.

    async def resource(self, api_version: str, kind: str) -> ResourceRef: ...

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def list(
        self, ref: ResourceRef, namespace: str | None = None, **query: str | int | bool
    ) -> dict[str, Any]: ...


class Reader:
    def __init__(
        self,
        kube: KubeReads,
        *,
        appwrappers: ResourceRef,
        pods: ResourceRef,
        pod_cache: PodCache,
        nodes: ResourceRef | None = None,
        node_cache: NodeCache | None = None,
        appwrapper_cache: AppWrapperCache | None = None,
        components: ComponentCaches | None = None,
    ) -> None:
        """``nodes``: where to read the nodes (None: never read, node exclusion is off).
        ``appwrapper_cache``, ``components``: the caches the AppWrappers and the components are
        read from (None: each is read by a GET on every pass)."""
        self.kube = kube
        self.appwrappers = appwrappers
        self.pods = pods
        self.pod_cache = pod_cache
        self.nodes = nodes
        self.node_cache = node_cache
        self.appwrapper_cache = appwrapper_cache
        self.components = components
        # AppWrappers whose next read must be a GET: a write computed from the cached one lost to
        # a newer version, which the cache may not have yet.
        self._refresh: set[Key] = set()
        # What is known of the owners on pods' controller chains, by uid: the components as they
        # are read, the objects in between as they are looked up (shared/kube/owners.py).
        self.owners = OwnerCache(kube)
        # Per AppWrapper (and incarnation uid): component index -> (name, uid) of the object last
        # confirmed to be its own, by a read or our create. It lets a pass that skips reading the
        # components (the first of an urgent reset) still delete them, by that uid only.
        self._confirmed: dict[Key, tuple[str, dict[int, tuple[str, str]]]] = {}

    async def appwrapper(self, key: Key, uid: str = "") -> dict[str, Any] | None:
        """The AppWrapper, or None when it is gone: from the cache, or by a GET where the cache
        cannot say (see :mod:`~services.lifecycle.awcache`) or :meth:`refresh` asked for one.
        ``uid``: the incarnation the caller is about (a verdict's), if it knows it: a tombstone
        of another incarnation does not answer for it."""
        cache = self.appwrapper_cache
        if cache is not None and key not in self._refresh:
            found = cache.lookup(key, uid)
            if found.known:
                return dict(found.obj) if found.obj is not None else None
        self._refresh.discard(key)
        namespace, name = key
        try:
            aw = await self.kube.get(self.appwrappers, name, namespace)
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise
        # GET answers carry them, but the Event recorder needs them whatever the source.
        aw.setdefault("apiVersion", API_VERSION)
        aw.setdefault("kind", KIND)
        if cache is not None:
            cache.offer(aw)
        return aw

    def cached(self, key: Key, holding: str) -> Mapping[str, Any] | None:
        """The AppWrapper as the cache holds it, if it does and its stored form contains
        ``holding`` (no request, and nothing decoded for one that does not)."""
        if self.appwrapper_cache is None:
            return None
        return self.appwrapper_cache.holding(key, holding)

    def refresh(self, key: Key) -> None:
        """The next read of the AppWrapper is a GET: a write lost to a newer version (409), and
        the cache may not have that version yet. (The GET's answer goes into the cache, so the
        passes after it read the cache again.)"""
        self._refresh.add(key)

    def forget(self, key: Key) -> None:
        """The AppWrapper is gone: drop what was confirmed about its components."""
        self._confirmed.pop(key, None)
        self._refresh.discard(key)

    def _confirm(self, key: Key, aw_uid: str, index: int, name: str, uid: str) -> None:
        owner, known = self._confirmed.get(key, (aw_uid, {}))
        if owner != aw_uid:
            known = {}
        known[index] = (name, uid)
        self._confirmed[key] = (aw_uid, known)

    def _unconfirm(self, key: Key, aw_uid: str, index: int) -> None:
        owner, known = self._confirmed.get(key, (aw_uid, {}))
        if owner == aw_uid:
            known.pop(index, None)

    def confirmed(self, key: Key, aw_uid: str, index: int) -> tuple[str, str] | None:
        """(name, uid) of component ``index`` as last confirmed to be this incarnation's."""
        owner, known = self._confirmed.get(key, ("", {}))
        return known.get(index) if owner == aw_uid else None

    async def observe(
        self,
        aw: Mapping[str, Any],
        created: Mapping[int, CreateOutcome],
        *,
        pods: bool = True,
        components: bool = True,
        nodes: bool = True,
        none_from_cache: bool = False,
    ) -> Observed:
        """Authoritative reads of every component (unless ``components`` is False), the labelled
        pods (unless ``pods`` is False) and the nodes (unless ``nodes`` is False), issued
        concurrently; what is not read is unknown.

        A component that is not read is still reported with the name and uid last confirmed to
        be this AppWrapper's (by a read or our create), so that a delete of it can carry that
        uid as its precondition; one never confirmed is read even so, because without a uid it
        could not be deleted at all.

        ``none_from_cache``: when the pod cache holds none of the AppWrapper's pods, take that
        without a LIST (for a workload starting or running, whose passes conclude nothing from
        "none"); the answer is then marked unconfirmed (``Observed.pods_confirmed``).
        """
        meta = as_mapping(aw.get("metadata"))
        namespace, name, uid = (
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
        )
        key = (namespace, name)
        spec_components = _list(as_mapping(aw.get("spec")).get("components"))
        status = as_mapping(aw.get("status"))
        statuses = _list(status.get("componentStatus"))
        started = attempt_start(status)
        # An AppWrapper exactly as our own last write left it: no other writer has created a
        # component since, so the component caches' "absent" holds for the components whose
        # create we saw succeed (componentcache.py).
        as_written = self.appwrapper_cache is not None and self.appwrapper_cache.ours(aw)
        for index, outcome in created.items():
            if outcome.succeeded and outcome.name and outcome.uid:
                self._confirm(key, uid, index, outcome.name, outcome.uid)
        reads: list[Awaitable[ObservedComponent]] = []
        kinds: list[tuple[str, str]] = []
        for index, comp in enumerate(spec_components):
            template = comp.get("template") if isinstance(comp, Mapping) else None
            if not isinstance(template, Mapping):
                reads.append(_known(ObservedComponent(controlled_by_us=False)))
                kinds.append(("", ""))
                continue
            group = str(template.get("apiVersion", "")).rpartition("/")[0]
            kinds.append((group, str(template.get("kind", ""))))
            comp_name = ""
            entry = statuses[index] if index < len(statuses) and isinstance(statuses[index], Mapping) else {}
            if entry:
                comp_name = str(entry.get("name") or "")
            template_meta = as_mapping(template.get("metadata"))
            comp_name = comp_name or str(template_meta.get("name") or "")
            if index in created and created[index].name:
                comp_name = created[index].name
            if not components:
                known = self.confirmed(key, uid, index)
                if known is not None and known[0] == comp_name:
                    reads.append(
                        _known(
                            ObservedComponent(
                                Presence.UNKNOWN, controlled_by_us=True, name=known[0], uid=known[1]
                            )
                        )
                    )
                    continue
            # A component created under a generated name whose name never made it into the
            # status is looked for by the annotation our create put on it.
            identity = (
                component_identity(uid, started, index)
                if not comp_name and template_meta.get("generateName")
                else ""
            )
            reads.append(
                self.observe_component(
                    template,
                    namespace,
                    comp_name,
                    uid,
                    key=key,
                    index=index,
                    identity=identity,
                    appwrapper=name,
                    # The status records a create, or the previous pass made one: it may exist.
                    recorded=_recorded(entry) or index in created,
                    # Created for certain (our create's answer went into the cache) and nobody
                    # else has written since: not held means deleted.
                    as_written=as_written and _deployed(entry),
                )
            )
        seen, node_list = await asyncio.gather(
            asyncio.gather(*reads),
            self.observe_nodes() if nodes else _none(),
        )
        listed: tuple[ObservedPod, ...] | None = None
        confirmed = True
        if pods and none_from_cache and self.pod_cache.holds_none(namespace, name):
            listed, confirmed = (), False
        elif pods:
            # After the components: what they were read to be is what the pods' chains end at.
            identities = {
                (group, kind, component.name)
                for (group, kind), component in zip(kinds, seen, strict=True)
                if component.name
            }
            listed = await self.observe_pods(namespace, name, uid, identities)
        return Observed(
            components=tuple(seen),
            pods=listed,
            created=dict(created),
            nodes=node_list,
            pods_confirmed=confirmed,
        )

    async def observe_pods(
        self,
        namespace: str,
        name: str,
        appwrapper_uid: str,
        components: Collection[ComponentIdentity] = (),
    ) -> tuple[ObservedPod, ...] | None:
        """The AppWrapper's pods: the labelled ones (from the pod cache, or a LIST where the cache
        cannot answer: before it has synced, and whenever the answer would be "none", see
        PodCache) whose controller owner chain leads to it (:meth:`ours`). None when unknown."""
        cached = self.pod_cache.pods(namespace, name)
        if cached is not None:
            ours = await self.ours(namespace, cached, appwrapper_uid, components)
            if ours is None or ours:
                return ours
            # The cache holds only pods that are not the AppWrapper's: "none left" is for a LIST to say.
        listed = await self.list_pods(namespace, name)
        if listed is None:
            return None
        return await self.ours(namespace, listed, appwrapper_uid, components)

    async def ours(
        self,
        namespace: str,
        pods: Sequence[ObservedPod],
        appwrapper_uid: str,
        components: Collection[ComponentIdentity],
    ) -> tuple[ObservedPod, ...] | None:
        """The pods that are the AppWrapper's (docs/lifecycle.md, "Observed"): those whose chain
        leads to it, and those left behind by one of its components that is gone (what the
        garbage collector deletes next; the staged deletion must wait for them and may delete
        them). None when an owner on some pod's chain could not be read now: the pods are then
        unknown on this pass, and nothing that needs them is decided."""
        out: list[ObservedPod] = []
        for pod in pods:
            found = await self.owners.resolve(namespace, pod.controller, appwrapper_uid=appwrapper_uid)
            if found.outcome is Outcome.PENDING:
                return None
            broken = found.broken
            if found.owned or (
                found.outcome is Outcome.ORPHANED
                and broken is not None
                and (broken.group, broken.kind, broken.name) in components
            ):
                out.append(pod)
                continue
            reason = found.reason or Reason.FOREIGN_OWNER
            NOT_COUNTED.labels(reason=reason.value).inc()
            log.debug("pod %s/%s is not counted for its AppWrapper: %s", namespace, pod.name, reason.value)
        return tuple(out)

    async def list_pods(self, namespace: str, name: str) -> tuple[ObservedPod, ...] | None:
        """The pods labelled with the AppWrapper, by a LIST; None when they cannot be listed."""
        try:
            listing = await self.kube.list(self.pods, namespace, labelSelector=f"{APPWRAPPER_LABEL}={name}")
            return tuple(ObservedPod.of(p) for p in _list(listing.get("items")) if isinstance(p, Mapping))
        except KubeApiError as exc:
            log.warning("listing pods of %s/%s failed: %s", namespace, name, exc)
        except Exception as exc:  # an answer the client cannot read (e.g. nested too deep)
            READ_FAILURES.labels(what="pods").inc()
            log.warning("listing pods of %s/%s failed: %s: %s", namespace, name, type(exc).__name__, exc)
        # Unknown: no decision that needs the pods (e.g. "all gone") is taken on it.
        return None

    async def observe_component(
        self,
        template: Mapping[str, Any],
        namespace: str,
        name: str,
        aw_uid: str,
        *,
        key: Key | None = None,
        index: int = -1,
        identity: str = "",
        appwrapper: str = "",
        recorded: bool = True,
        as_written: bool = False,
    ) -> ObservedComponent:
        """What is under ``name``: whether it exists, and whether it is confirmed ours (its
        controller owner reference names this AppWrapper's uid). A read that fails is
        ``Unknown`` and not confirmed ours, so nothing deletes it on that read. Without a name,
        the object whose ``respawn.dev/component`` annotation is ``identity`` (if any).

        From the kind's cache when it can answer: an object it holds, or absent when its
        absence cannot mislead (``recorded`` False: the status does not record it as created, or
        ``as_written``: the status records it as created, and the AppWrapper is as our last write
        left it); otherwise by a GET."""
        if not name:
            if identity:
                return await self._find(
                    template, namespace, appwrapper, aw_uid, identity, key, index, recorded=recorded
                )
            return ObservedComponent(presence=Presence.ABSENT)
        try:
            ref = await self.kube.resource(str(template.get("apiVersion", "")), str(template.get("kind", "")))
            cache = self.components.cache(ref) if self.components is not None else None
            if cache is not None:
                held = cache.get(namespace, name)
                if held is not None:
                    return self._seen(held.value, name, aw_uid, key, index)
                if cache.answers((namespace, appwrapper)) and (as_written or not recorded):
                    return ObservedComponent(presence=Presence.ABSENT, name=name)
            obj = await self.kube.get(ref, name, namespace if ref.namespaced else None)
        except KubeApiError as exc:
            if exc.not_found:
                return ObservedComponent(presence=Presence.ABSENT, name=name)
            return ObservedComponent(presence=Presence.UNKNOWN, controlled_by_us=False, name=name)
        except Exception as exc:  # an answer the client cannot read (e.g. nested too deep)
            READ_FAILURES.labels(what="component").inc()
            log.warning(
                "reading %s %s/%s failed: %s: %s",
                template.get("kind"),
                namespace,
                name,
                type(exc).__name__,
                exc,
            )
            return ObservedComponent(presence=Presence.UNKNOWN, controlled_by_us=False, name=name)
        return self._seen(obj, name, aw_uid, key, index)

    def _seen(
        self, obj: Mapping[str, Any], name: str, aw_uid: str, key: Key | None, index: int
    ) -> ObservedComponent:
        meta = as_mapping(obj.get("metadata"))
        # Its controller is what the chains of its pods end at.
        self.owners.learn(obj)
        presence = Presence.DELETING if meta.get("deletionTimestamp") else Presence.PRESENT
        ours = bool(aw_uid) and controller_uid(obj) == aw_uid
        uid = str(meta.get("uid") or "")
        if key is not None:
            if ours and uid:
                self._confirm(key, aw_uid, index, name, uid)
            else:
                self._unconfirm(key, aw_uid, index)
        return ObservedComponent(presence=presence, controlled_by_us=ours, name=name, uid=uid)

    async def _find(
        self,
        template: Mapping[str, Any],
        namespace: str,
        appwrapper: str,
        aw_uid: str,
        identity: str,
        key: Key | None,
        index: int,
        *,
        recorded: bool = True,
    ) -> ObservedComponent:
        """The object our create of this component (this attempt) made, found by its annotation
        among the objects of its kind labelled with the AppWrapper; Absent when there is none,
        Unknown when they cannot be listed. From the kind's cache, unless it finds none while a
        create of it may have taken effect unanswered (``recorded``): that is for a LIST to say."""
        try:
            ref = await self.kube.resource(str(template.get("apiVersion", "")), str(template.get("kind", "")))
            cache = self.components.cache(ref) if self.components is not None else None
            answers = cache is not None and cache.answers((namespace, appwrapper))
            items: list[Any] = cache.objects((namespace, appwrapper)) if cache is not None and answers else []
            if not _annotated(items, identity, aw_uid) and (recorded or not answers):
                listing = await self.kube.list(
                    ref,
                    namespace if ref.namespaced else None,
                    labelSelector=f"{APPWRAPPER_LABEL}={appwrapper}",
                )
                items = _list(listing.get("items"))
        except KubeApiError as exc:
            if exc.not_found:
                return ObservedComponent(presence=Presence.ABSENT)
            log.warning("listing %s of %s/%s failed: %s", template.get("kind"), namespace, appwrapper, exc)
            return ObservedComponent(presence=Presence.UNKNOWN, controlled_by_us=False)
        except Exception as exc:  # an answer the client cannot read
            READ_FAILURES.labels(what="component").inc()
            log.warning(
                "listing %s of %s/%s failed: %s: %s",
                template.get("kind"),
                namespace,
                appwrapper,
                type(exc).__name__,
                exc,
            )
            return ObservedComponent(presence=Presence.UNKNOWN, controlled_by_us=False)
        found = _annotated(items, identity, aw_uid)
        if not found:
            return ObservedComponent(presence=Presence.ABSENT)
        # More than one would be duplicates made before this guard existed: the oldest is the
        # component, the others are reported (and left to the garbage collector with the
        # AppWrapper, as they carry its owner reference).
        found.sort(
            key=lambda o: (
                str(as_mapping(o.get("metadata")).get("creationTimestamp", "")),
                str(as_mapping(o.get("metadata")).get("name", "")),
            )
        )
        if len(found) > 1:
            log.warning(
                "%s/%s: %d objects claim to be component %d of this attempt; adopting the oldest",
                namespace,
                appwrapper,
                len(found),
                index,
            )
        first = found[0]
        return self._seen(first, str(as_mapping(first.get("metadata")).get("name", "")), aw_uid, key, index)

    async def observe_nodes(self) -> tuple[ObservedNode, ...] | None:
        """The cluster's nodes: from the node cache, or a LIST before it has synced (a reset in
        the first moments after a start, when held verdicts arrive in a burst, still excludes).
        None when nodes are not read at all, or cannot be."""
        if self.nodes is None:
            return None
        cached = self.node_cache.nodes() if self.node_cache is not None else None
        if cached is not None:
            return cached
        try:
            listing = await self.kube.list(self.nodes)
            return tuple(ObservedNode.of(n) for n in _list(listing.get("items")) if isinstance(n, Mapping))
        except KubeApiError as exc:
            log.warning("listing nodes failed (no node exclusion on this pass): %s", exc)
        except Exception as exc:  # an answer the client cannot read
            READ_FAILURES.labels(what="nodes").inc()
            log.warning(
                "listing nodes failed (no node exclusion on this pass): %s: %s", type(exc).__name__, exc
            )
        return None


def _annotated(items: Sequence[Any], identity: str, aw_uid: str) -> list[Mapping[str, Any]]:
    """The objects among ``items`` whose ``respawn.dev/component`` annotation is ``identity`` and
    whose controller is the AppWrapper ``aw_uid``."""
    return [
        obj
        for obj in items
        if isinstance(obj, Mapping)
        and as_mapping(as_mapping(obj.get("metadata")).get("annotations")).get(COMPONENT_ANNOTATION)
        == identity
        and bool(aw_uid)
        and controller_uid(obj) == aw_uid
    ]


def _deployed(entry: Mapping[str, Any]) -> bool:
    """Whether a componentStatus entry records its component as created (its create answered
    with success, not an error or a timeout after which it may or may not exist, perhaps as
    someone else's object of that name)."""
    conditions = entry.get("conditions")
    conditions = conditions if isinstance(conditions, list) else []
    return condition_status(conditions, ConditionType.RESOURCES_DEPLOYED) == ConditionStatus.TRUE


def _recorded(entry: Mapping[str, Any]) -> bool:
    """Whether a componentStatus entry records its component as (perhaps) created: deployed, or
    a create initiated or failed (a create that failed may still have taken effect), and its
    deletion not recorded since."""
    conditions = entry.get("conditions")
    conditions = conditions if isinstance(conditions, list) else []
    condition = find_condition(conditions, ConditionType.RESOURCES_DEPLOYED)
    if condition is None:
        return False
    deployed = condition_status(conditions, ConditionType.RESOURCES_DEPLOYED) == ConditionStatus.TRUE
    return deployed or condition.get("reason") != ComponentReason.DELETED


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


async def _known(component: ObservedComponent) -> ObservedComponent:
    return component


async def _none() -> None:
    return None
