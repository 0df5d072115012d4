"""Submitting AppWrappers to the testbed and following them, as a user would with kubectl
(test helpers; the requests go straight to the API server, ``respawn.testbed.kubeapi``). What
an AppWrapper says is read with the services' own reader,
:func:`shared.appwrapper.model.read_appwrapper`; the manifests come from
``respawn.testbed.manifests``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from respawn.testbed import kubeapi, manifests, sim
from respawn.testbed.kubeapi import get_object
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.appwrapper.model import read_appwrapper
from tests.waiting import until

__all__ = [
    "FAST_RESET",
    "apply",
    "deployment_appwrapper",
    "events_of",
    "events_when",
    "get_appwrapper",
    "has_event",
    "jobs",
    "labelled_pods",
    "running_pods",
    "wait_phase",
]

# Upstream's per-AppWrapper clocks cut to seconds, so that a reset takes seconds, not minutes.
FAST_RESET = manifests.fault_tolerance(failure_grace="0s", retry_pause="1s", forceful_deletion_grace="5s")


def deployment_appwrapper(name: str) -> dict[str, Any]:
    """An AppWrapper (resetting fast) that wraps a one-replica Deployment ``name``: its pod's
    controller is a ReplicaSet, which the watcher reads by a GET to attribute the pod."""
    template = manifests.pod_template(labels={"app": name}, restart_policy="Always")
    return manifests.appwrapper(
        name,
        manifests.component(manifests.deployment(name, replicas=1, template=template)),
        annotations=FAST_RESET,
    )


def apply(kubeconfig: Path, namespace: str, manifest: dict[str, Any]) -> None:
    """Create or update the object, as ``kubectl apply --server-side`` does (without a kubectl
    process: :func:`respawn.testbed.kubeapi.apply`)."""
    kubeapi.apply(kubeconfig, manifest, namespace=namespace)


def get_appwrapper(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any] | None:
    """The AppWrapper as stored, without its managedFields (as kubectl prints it: noise in a
    failure message); None once it is gone."""
    body: dict[str, Any] | None = get_object(kubeconfig, "appwrapper", name, "-n", namespace)
    return body


async def wait_phase(
    kubeconfig: Path, namespace: str, name: str, phase: str, *, within: float = 30
) -> dict[str, Any]:
    """The AppWrapper once its status says ``phase``."""
    found: dict[str, Any] = await until(
        f"{namespace}/{name} to reach {phase}",
        lambda: get_appwrapper(kubeconfig, namespace, name),
        done=lambda aw: read_appwrapper(aw).phase == phase,
        within=within,
    )
    return found


def jobs(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sim.get_json(kubeconfig, "jobs", "-n", namespace)["items"]
    return items


def labelled_pods(kubeconfig: Path, namespace: str, appwrapper: str) -> list[dict[str, Any]]:
    """The pods labelled as the AppWrapper's, deleting ones included."""
    selector = f"{APPWRAPPER_LABEL}={appwrapper}"
    items: list[dict[str, Any]] = sim.get_json(kubeconfig, "pods", "-n", namespace, "-l", selector)["items"]
    return items


def running_pods(kubeconfig: Path, namespace: str, appwrapper: str) -> list[dict[str, Any]]:
    """The AppWrapper's pods that are Running and not being deleted."""
    return [
        p
        for p in labelled_pods(kubeconfig, namespace, appwrapper)
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def events_of(kubeconfig: Path, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Kubernetes Events about the AppWrapper ``name``."""
    selector = f"involvedObject.name={name},involvedObject.kind=AppWrapper"
    items: list[dict[str, Any]] = sim.get_json(
        kubeconfig, "events", "-n", namespace, "--field-selector", selector
    )["items"]
    return items


def has_event(reason: str, saying: str = "") -> Callable[[list[dict[str, Any]]], bool]:
    """Whether Events include one with ``reason`` whose message contains ``saying``."""
    return lambda events: any(e["reason"] == reason and saying in e.get("message", "") for e in events)


async def events_when(
    kubeconfig: Path,
    namespace: str,
    name: str,
    what: str,
    done: Callable[[list[dict[str, Any]]], object],
    *,
    within: float = 30,
) -> list[dict[str, Any]]:
    """The Kubernetes Events about the AppWrapper ``name`` once ``done`` holds for them. An Event
    is recorded after the change it tells of (the status a test waits for) and may be read a
    moment later than that change."""
    found: list[dict[str, Any]] = await until(
        f"Events on {namespace}/{name}: {what}",
        lambda: events_of(kubeconfig, namespace, name),
        done=done,
        within=within,
    )
    return found


def on_nodes(aw: dict[str, Any], nodes: tuple[str, ...]) -> dict[str, Any]:
    """``aw`` with its pods allowed only on ``nodes`` (one term per node: the terms are ORed)."""
    template = aw["spec"]["components"][0]["template"]["spec"]["template"]
    template["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                    for n in nodes
                ]
            }
        }
    }
    return aw
