"""What an encoding costs per message: encode + decode time and payload bytes, msgpack vs JSON.

``python -m bench.codec [--rounds N] [--json]``: each kind of message as the services publish it
(a pod of a Running 8-GPU worker, an AppWrapper of 8 pods, an unhealthy verdict, a lifecycle
event, a node verdict), encoded and decoded with :mod:`shared.messages`' codec in each encoding,
as the bus does it (the model to bytes, and bytes to a validated model). No server, no network:
CPU and size only. The figures are in bench/README.md ("Encodings").
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

from bench.workload import observed_job_appwrapper
from shared.kubetime import format_kube_time
from shared.messages import (
    AppWrapperObservation,
    ContainerState,
    Encoding,
    LifecycleEvent,
    Message,
    NodeVerdict,
    ObjectRef,
    PodConditionState,
    PodObservation,
    Verdict,
    decode,
    encode,
)

ENCODINGS: tuple[Encoding, ...] = ("msgpack", "json", "cloudevents")


def samples() -> dict[str, Message]:
    """One message of each kind, filled in as a real one would be."""
    now = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
    ref = ObjectRef(namespace="team-a", name="llama-ft-7b", uid="6f1c2d3e-4a5b-6c7d-8e9f-0a1b2c3d4e5f")
    pod_ref = ObjectRef(
        namespace="team-a", name="llama-ft-7b-worker-3", uid="0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a"
    )
    body = observed_job_appwrapper(ref.namespace, ref.name, ref.uid, 8, format_kube_time(now))
    return {
        "observation.pod": PodObservation(
            ref=pod_ref,
            appwrapper=ref.name,
            resource_version="48213377",
            observed_at=now,
            created_at=now,
            phase="Running",
            node_name="gpu-node-042",
            scheduled=True,
            containers=(
                ContainerState(
                    name="init-data", init=True, state="terminated", exit_code=0, reason="Completed"
                ),
                ContainerState(
                    name="trainer", state="running", ready=True, restart_count=1, last_exit_code=137
                ),
            ),
            resources=("nvidia.com/gpu",),
            owner_kind="Job",
            owner_name=ref.name,
            conditions=tuple(
                PodConditionState(type=t, status="True")
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ),
            pod_set=0,
        ),
        "observation.appwrapper": AppWrapperObservation(
            ref=ref, resource_version="48213300", observed_at=now, body=body
        ),
        "verdict": Verdict(
            ref=ref,
            state="Unhealthy",
            reason="FoundFailedPods",
            message="pod llama-ft-7b-worker-3 failed: container trainer exited with code 137 (OOMKilled)",
            nodes=("gpu-node-042",),
            resetting_count=1,
            first_unhealthy_at=now,
            decided_at=now,
            seq=12,
            deadline=now,
            attempt_started_at=now,
            failure_class="Transient",
            failure_code="OOMKilled",
            fault_kind="Application",
        ),
        "lifecycle.event": LifecycleEvent(
            ref=ref,
            event="ResetStarted",
            phase="Resetting",
            previous_phase="Running",
            reason="FoundFailedPods",
            message="resetting after a failed pod (attempt 2)",
            resetting_count=2,
            nodes=("gpu-node-042",),
            at=now,
            failure_class="Transient",
            failure_code="OOMKilled",
        ),
        "verdict.node": NodeVerdict(
            resource="nvidia.com/gpu",
            no_schedule=tuple(f"gpu-node-{i:03d}" for i in range(4)),
            no_execute=("gpu-node-042",),
            decided_at=now,
        ),
    }


def _per_call(fn: Callable[[], object], rounds: int) -> float:
    """µs per call: the fastest of 7 batches of ``rounds`` calls (after one warm-up batch), the
    one least disturbed by whatever else the machine runs."""
    batches = []
    for _ in range(8):
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        batches.append((time.perf_counter() - started) / rounds * 1e6)
    return min(batches[1:])


def measure(message: Message, encoding: Encoding, rounds: int) -> dict[str, float]:
    payload, headers = encode(message, encoding, msg_id="bench-0001", source="respawn-health")
    cls = type(message)
    assert decode(cls, payload, headers) == message
    return {
        "encode_us": _per_call(
            lambda: encode(message, encoding, msg_id="bench-0001", source="respawn-health"), rounds
        ),
        "decode_us": _per_call(lambda: decode(cls, payload, headers), rounds),
        "payload_bytes": len(payload),
        # What the encoding adds on the wire as headers ("key: value\r\n" each).
        "header_bytes": sum(len(k) + len(v) + 4 for k, v in headers.items()),
    }


def run(rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    return {kind: {e: measure(m, e, rounds) for e in ENCODINGS} for kind, m in samples().items()}


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| message | encoding | encode µs | decode µs | encode + decode µs | payload bytes | header bytes |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for kind, by_encoding in results.items():
        for encoding, r in by_encoding.items():
            lines.append(
                f"| `{kind}` | {encoding} | {r['encode_us']:.1f} | {r['decode_us']:.1f} | "
                f"{r['encode_us'] + r['decode_us']:.1f} | {r['payload_bytes']:.0f} | "
                f"{r['header_bytes']:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2000, help="calls per timed batch (default 2000)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results = run(args.rounds)
    print(json.dumps(results, indent=2) if args.json else table(results))


if __name__ == "__main__":
    main()
