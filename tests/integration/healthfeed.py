"""Observations of synthetic AppWrappers, published as the watcher would, and the verdicts health
stores for them (test helper): health judged without a cluster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from bench.workload import observed_job_appwrapper
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.appwrapper.params import FAILURE_GRACE_PERIOD_ANNOTATION
from shared.bus import Bus
from shared.kubetime import format_kube_time
from shared.messages import AppWrapperObservation, ContainerState, ObjectRef, PodObservation, Verdict, decode
from tests.nats_fixtures import read_all
from tests.waiting import until

# Short membership clocks (scaling.heartbeat, scaling.memberTtl), so that a dead replica's share
# moves within a second.
MEMBERSHIP = {"RESPAWN_SCALING_HEARTBEAT": "200ms", "RESPAWN_SCALING_MEMBER_TTL": "1s"}


@dataclass(frozen=True)
class Workload:
    """One AppWrapper of one Job of one pod, Running since a minute ago."""

    namespace: str
    name: str

    @property
    def partition(self) -> int:
        return subjects.partition(self.namespace, self.name)

    @property
    def uid(self) -> str:
        return f"uid-{self.namespace}-{self.name}"

    @property
    def pod(self) -> str:
        return f"{self.name}-0"

    async def publish_pod(self, bus: Bus, *, failed: bool, deleted: bool = False) -> None:
        """The pod Running, or Failed; ``deleted``: its tombstone, as the watcher publishes a
        deletion (the last state seen, marked deleted)."""
        now = datetime.now(UTC)
        state = (
            ContainerState(name="c", state="terminated", exit_code=1, finished_at=now - timedelta(seconds=1))
            if failed
            else ContainerState(name="c", state="running", ready=True)
        )
        pod = PodObservation(
            ref=ObjectRef(namespace=self.namespace, name=self.pod, uid=f"{self.uid}-0"),
            appwrapper=self.name,
            observed_at=now,
            created_at=now - timedelta(seconds=30),
            phase="Failed" if failed else "Running",
            deleted=deleted,
            node_name="node-0",
            scheduled=True,
            containers=(state,),
        )
        await bus.publish(
            subjects.appwrapper_obs(self.namespace, self.name, "pod", self.pod), pod, msg_id=None
        )

    async def publish_appwrapper(self, bus: Bus) -> None:
        now = datetime.now(UTC)
        body = observed_job_appwrapper(
            self.namespace, self.name, self.uid, 1, format_kube_time(now - timedelta(minutes=1))
        )
        # A failed pod is unhealthy at once.
        body["metadata"].setdefault("annotations", {})[FAILURE_GRACE_PERIOD_ANNOTATION] = "0s"
        observation = AppWrapperObservation(
            ref=ObjectRef(namespace=self.namespace, name=self.name, uid=self.uid), observed_at=now, body=body
        )
        await bus.publish(
            subjects.appwrapper_obs(self.namespace, self.name, "appwrapper", self.name),
            observation,
            msg_id=None,
        )


async def healthy(bus: Bus, namespace: str, batch: list[Workload], *, within: float) -> None:
    """Publish each AppWrapper Running with its pod Running (the pod first: the AppWrapper
    started a minute ago, and judged without its pod it would be missing it), and wait until
    health has judged every one healthy, once."""
    for w in batch:
        await w.publish_pod(bus, failed=False)
        await w.publish_appwrapper(bus)
    await until(
        "every AppWrapper to be judged healthy",
        lambda: verdicts(bus, namespace),
        done=lambda found: shape(found) == {w.name: [("Healthy", "", 1)] for w in batch},
        within=within,
    )


def workloads(namespace: str, count: int) -> list[Workload]:
    return [Workload(namespace, f"aw-{i}") for i in range(count)]


async def fail(bus: Bus, batch: list[Workload]) -> None:
    """Each AppWrapper with its one pod Failed; the pod is published first, so the AppWrapper is
    judged once, when both are known (health judges nothing without the AppWrapper)."""
    for w in batch:
        await w.publish_pod(bus, failed=True)
        await w.publish_appwrapper(bus)


async def verdicts(bus: Bus, namespace: str) -> dict[str, list[Verdict]]:
    """Every verdict stored for the AppWrappers of ``namespace``, by name, in order."""
    info = await bus.js.stream_info(
        subjects.VERDICTS_STREAM, subjects_filter=subjects.verdict_filter(namespace)
    )
    total = sum((info.state.subjects or {}).values())
    found: dict[str, list[Verdict]] = {}
    for msg in await read_all(bus, subjects.VERDICTS_STREAM, subjects.verdict_filter(namespace), total):
        verdict = decode(Verdict, msg.data, msg.headers)
        found.setdefault(verdict.ref.name, []).append(verdict)
    return found


def shape(found: dict[str, list[Verdict]]) -> dict[str, list[tuple[str, str, int]]]:
    return {name: [(v.state, v.reason, v.seq) for v in vs] for name, vs in found.items()}


def judged(found: dict[str, list[Verdict]]) -> int:
    return sum(1 for vs in found.values() if any(v.state == "Unhealthy" for v in vs))


def metric(sp: ServiceProcess, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(sp.metrics()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def owned(sp: ServiceProcess) -> float:
    return metric(sp, "respawn_partitions_owned", group="health")
