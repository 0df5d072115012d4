"""The watcher's work per pod change, without I/O. Prints figures; asserts nothing.

For each of ``--pods`` pod watch events shaped as a Job's pod on a kwok node (labels, owner,
finalizer, managed fields, four conditions, one running container; about 2.5 KB of JSON, as
the API server sends them): decode the event, name its subject and partition, cut down and encode
what a replica keeps for a takeover, and build the observation with its fingerprint and message
id — everything ``Watcher.on_event`` does before the publish. Reports the process time per event
(best and median of ``--rounds``), so that a change to the hot path can be measured apart from
the whole-run benchmarks, whose noise on a shared machine is larger than such a change.

.venv/bin/python -m bench.watchpath [--pods 100] [--repeat 30] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from services.watcher import translate
from services.watcher.service import Kept
from shared.appwrapper.constants import APPWRAPPER_LABEL
from shared.kube.client import decode_body
from shared.messages import PodObservation

_TIME = "2026-01-01T00:00:00Z"


def pod_event(i: int) -> bytes:
    """One MODIFIED watch event of a running Job pod, as the API server writes it."""
    name, uid = f"aw-{i:04d}-job", f"2b8f6c1e-8a3c-4b1f-9f0e-{i:012d}"
    fields: dict[str, Any] = {
        "f:metadata": {"f:labels": {".": {}, "f:job-name": {}}, "f:ownerReferences": {".": {}}},
        "f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}, "f:resources": {}}}},
    }
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-0-abcde",
            "generateName": f"{name}-0-",
            "namespace": "bench",
            "uid": f"7c1d2e3f-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100_000 + i),
            "creationTimestamp": _TIME,
            "labels": {
                APPWRAPPER_LABEL: f"aw-{i:04d}",
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "batch.kubernetes.io/job-completion-index": "0",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": True}
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "time": _TIME,
                    "fieldsV1": fields,
                },
                {"manager": "kwok", "operation": "Update", "subresource": "status", "time": _TIME},
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m"}},
                    "terminationMessagePath": "/dev/termination-log",
                }
            ],
            "restartPolicy": "Never",
            "nodeName": f"kwok-node-{i % 34}",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": _TIME}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "10.0.0.3",
            "podIP": f"10.1.{i // 250}.{i % 250}",
            "startTime": _TIME,
            "containerStatuses": [
                {
                    "name": "c",
                    "state": {"running": {"startedAt": _TIME}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "busybox",
                    "started": True,
                }
            ],
            "qosClass": "BestEffort",
        },
    }
    return json.dumps({"type": "MODIFIED", "object": obj}).encode()


def handle(raw: bytes, now: datetime) -> None:
    """What the watcher does with one pod event before publishing it."""
    pod = decode_body(raw, "watch pods")["object"]
    kind = PodObservation.KIND
    translate.object_subject(pod, kind)
    translate.object_partition(pod, kind)
    Kept.pack(translate.kept(pod, kind))
    translate.prepare(translate.pod_observation, pod, observation_kind=kind, deleted=False, now=now)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=30, help="passes over the pods per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    events = [pod_event(i) for i in range(args.pods)]
    now = datetime.now(UTC)
    per_event: list[float] = []
    for _ in range(args.rounds):
        began = time.process_time()
        for _ in range(args.repeat):
            for raw in events:
                handle(raw, now)
        per_event.append((time.process_time() - began) / (args.repeat * args.pods))
    size = statistics.mean(len(raw) for raw in events)
    print(
        f"pod watch event ({size:.0f} bytes) -> observation: "
        f"best {min(per_event) * 1e6:.1f} µs, median {statistics.median(per_event) * 1e6:.1f} µs "
        f"of process time per event ({args.rounds} rounds of {args.repeat * args.pods} events)"
    )


if __name__ == "__main__":
    main()
