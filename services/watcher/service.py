"""watcher: Kubernetes watches → observations on NATS. It decides nothing.

One list-then-watch per resource: AppWrappers, pods labelled with their AppWrapper,
nodes, and one per wrapped kind actually in use (discovered from AppWrapper components,
any GVK, also selected by the AppWrapper label). Every object's latest relevant state is
published to its own subject; unchanged states are skipped, and a restarted watcher
republishes everything once (consumers are idempotent and JetStream de-duplicates).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from services.watcher import translate
from shared import metrics
from shared.appwrapper.constants import API_VERSION, APPWRAPPER_LABEL, KIND
from shared.kube import Kube, KubeApiError, ResourceRef
from shared.kube.watch import Backoff, list_then_watch
from shared.messages import Message
from shared.runtime import Runtime, entry

log = logging.getLogger(__name__)

PUBLISHED = metrics.counter(
    "respawn_watcher_observations_published", "Observations published, by kind", ["kind"]
)
SKIPPED = metrics.counter(
    "respawn_watcher_observations_unchanged",
    "Watch events whose relevant state did not change",
    ["kind"],
)
WATCHES = metrics.gauge("respawn_watcher_watches", "Resources being watched")

Translator = Callable[[dict[str, Any]], Message | None]


class Publisher:
    """Publishes observations, skipping ones identical to the last published for the subject."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.last: dict[str, str] = {}

    async def observe(self, message: Message | None, *, deleted: bool) -> None:
        if message is None:
            return
        subject = translate.subject_for(message)
        fp = translate.fingerprint(message)
        if not deleted and self.last.get(subject) == fp:
            SKIPPED.labels(kind=message.KIND).inc()
            return
        backoff = Backoff(cap=5.0)
        while True:
            try:
                await self.rt.bus.publish(subject, message, msg_id=translate.msg_id(message, fp))
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down for longer than the bus's own retries
                delay = backoff.next()
                log.warning("publishing %s failed (%s); retrying in %.1fs", subject, exc, delay)
                await asyncio.sleep(delay)
        PUBLISHED.labels(kind=message.KIND).inc()
        if deleted:
            self.last.pop(subject, None)
        else:
            self.last[subject] = fp


def now() -> datetime:
    return datetime.now(UTC)


class Watcher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.kube: Kube = rt.require_kube()
        self.publisher = Publisher(rt)
        self.synced: dict[str, bool] = {}
        self.component_watches: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def ready(self) -> bool:
        return bool(self.synced) and all(self.synced.values())

    async def resolve(self, api_version: str, kind: str) -> ResourceRef:
        backoff = Backoff(cap=10.0)
        while True:
            try:
                return await self.kube.resource(api_version, kind)
            except KubeApiError as exc:
                delay = backoff.next()
                log.warning("cannot resolve %s %s (%s); retrying in %.1fs", api_version, kind, exc, delay)
                await asyncio.sleep(delay)

    async def watch(
        self, name: str, ref: ResourceRef, to_message: Callable[..., Message | None], **kw: Any
    ) -> None:
        self.synced[name] = False
        WATCHES.inc()
        try:
            async for event in list_then_watch(self.kube, ref, **kw):
                if event.type == "SYNCED":
                    if not self.synced[name]:
                        log.info("watch %s synced", name)
                    self.synced[name] = True
                    continue
                deleted = event.type == "DELETED"
                obj = event.obj
                obj.setdefault("apiVersion", ref.api_version)
                obj.setdefault("kind", ref.kind)
                await self.publisher.observe(to_message(obj, deleted=deleted, now=now()), deleted=deleted)
                if ref.kind == KIND and not deleted:
                    self.discover_components(obj)
        finally:
            WATCHES.dec()

    def discover_components(self, appwrapper: dict[str, Any]) -> None:
        for comp in (appwrapper.get("spec") or {}).get("components") or []:
            template = comp.get("template") if isinstance(comp, dict) else None
            if not isinstance(template, dict):
                continue
            gvk = (str(template.get("apiVersion", "")), str(template.get("kind", "")))
            if not all(gvk) or gvk in self.component_watches:
                continue
            log.info("watching wrapped kind %s %s", *gvk)
            self.component_watches[gvk] = asyncio.create_task(
                self.component_watch(*gvk), name=f"watch-{gvk[1]}"
            )

    async def component_watch(self, api_version: str, kind: str) -> None:
        ref = await self.resolve(api_version, kind)
        await self.watch(
            f"{kind}.{api_version}", ref, translate.component_observation, label_selector=APPWRAPPER_LABEL
        )

    async def run(self) -> None:
        self.rt.add_check("watches-synced", self.ready)
        pods = await self.resolve("v1", "Pod")
        nodes = await self.resolve("v1", "Node")
        appwrappers = await self.resolve(API_VERSION, KIND)
        self.tasks = [
            asyncio.create_task(
                self.watch("pods", pods, translate.pod_observation, label_selector=APPWRAPPER_LABEL)
            ),
            asyncio.create_task(self.watch("nodes", nodes, translate.node_observation)),
            asyncio.create_task(self.watch("appwrappers", appwrappers, translate.appwrapper_observation)),
        ]
        try:
            await asyncio.gather(*self.tasks)
        finally:
            for task in [*self.tasks, *self.component_watches.values()]:
                task.cancel()


async def main(rt: Runtime) -> None:
    await Watcher(rt).run()


def run() -> None:
    entry("watcher", main)
