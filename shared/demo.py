"""`make demo`: bring the local stack up, run a sample workload, print what happened, tear down."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shared.testbed import cluster, services, sim
from shared.testbed.cluster import Log, kubectl

SAMPLE_JOB: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "demo-job", "namespace": "default"},
    "spec": {
        "parallelism": 2,
        "completions": 2,
        "template": {
            "metadata": {"annotations": {sim.SUCCEED_AFTER: "3s"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "train", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ],
            },
        },
    },
}


def _job_status(kubeconfig: Path) -> dict[str, Any]:
    status: dict[str, Any] = sim.get_json(kubeconfig, "job", "demo-job", "-n", "default").get("status", {})
    return status


def run_demo(state_dir: Path, *, keep: bool, log: Log) -> None:
    started = time.monotonic()
    state = cluster.up(state_dir, log=log)
    try:
        running = services.start_all(state, log=log)
        log(f"stack up in {time.monotonic() - started:.1f}s; services: {', '.join(running) or 'none yet'}")
        log("submitting a 2-pod batch/v1 Job (8 GPUs per pod) whose pods succeed 3s after they start")
        kubectl(state.kubeconfig, "apply", "-f", "-", stdin=json.dumps(SAMPLE_JOB))
        t0 = time.monotonic()
        seen: set[str] = set()

        def complete() -> bool:
            listing = sim.get_json(state.kubeconfig, "pods", "-n", "default", "-l", "job-name=demo-job")
            for pod in listing["items"]:
                node = pod["spec"].get("nodeName", "-")
                key = f"{pod['metadata']['name']} {pod['status'].get('phase')} on {node}"
                if key not in seen:
                    seen.add(key)
                    log(f"  +{time.monotonic() - t0:4.1f}s pod {key}")
            conds = _job_status(state.kubeconfig).get("conditions", [])
            return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)

        cluster.wait_for(complete, timeout=120, what="the demo Job to complete")
        log(f"  +{time.monotonic() - t0:4.1f}s Job demo-job Complete")
        print(f"demo: Job demo-job completed in {time.monotonic() - t0:.1f}s on the local testbed")
    finally:
        if keep:
            log(f"testbed left running: KUBECONFIG={state.kubeconfig} NATS_URL={state.nats_url}")
        else:
            cluster.down(state_dir, log=log)
            log("testbed stopped; nothing left running")
