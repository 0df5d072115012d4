"""What a run creates and which faults it injects, before it touches a cluster.

Pure functions of the configuration: the same seed gives the same AppWrappers and the same fault
plan, so two controllers are measured against identical work. Each draws from its own named
random stream, so changing the fault settings leaves the workload alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.config import BenchConfig, PlannedFault

# kwok nodes take 110 pods and 8 GPUs each; keep a margin below the pod limit.
PODS_PER_NODE = 100
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class AwSpec:
    name: str
    kind: str  # job | pytorchjob | stuck-init
    pods: int
    gpu: bool


def plan_workload(cfg: BenchConfig) -> list[AwSpec]:
    """The N AppWrappers: exact shares of GPU and PyTorchJob workloads, placed by the seed."""
    rng = random.Random(f"workload-{cfg.seed}")
    n = cfg.appwrappers
    n_gpu = min(n, max(1 if cfg.gpu_fraction > 0 else 0, round(n * cfg.gpu_fraction)))
    n_pt = min(n, round(n * cfg.pytorch_fraction))
    gpu = [True] * n_gpu + [False] * (n - n_gpu)
    pytorch = [True] * n_pt + [False] * (n - n_pt)
    rng.shuffle(gpu)
    rng.shuffle(pytorch)
    width = len(str(max(n - 1, 0)))
    return [
        AwSpec(f"aw-{i:0{width}d}", "pytorchjob" if pytorch[i] else "job", cfg.pods_per_aw, gpu[i])
        for i in range(n)
    ]


def plan_faults(cfg: BenchConfig) -> list[PlannedFault]:
    """Poisson arrivals at ``fault_rate`` over ``duration``, kinds drawn from ``mix``."""
    if cfg.fault_plan is not None:
        return list(cfg.fault_plan)
    rng = random.Random(f"faults-{cfg.seed}")
    kinds = [k for k, _ in cfg.mix]
    weights = [w for _, w in cfg.mix]
    out: list[PlannedFault] = []
    at = 0.0
    while cfg.fault_rate > 0:
        at += rng.expovariate(cfg.fault_rate)
        if at > cfg.duration or (cfg.max_faults is not None and len(out) >= cfg.max_faults):
            break
        out.append(PlannedFault(round(at, 3), rng.choices(kinds, weights)[0]))
    return out


def nodes_needed(cfg: BenchConfig, workload: Sequence[AwSpec], planned: Sequence[PlannedFault]) -> int:
    stuck = sum(1 for f in planned if f.kind == "stuck-init") * cfg.stuck_init_pods
    pods = sum(s.pods for s in workload) + stuck
    gpu_pods = sum(s.pods for s in workload if s.gpu)
    # Headroom for a labelled node, pods kept off the nodes they failed on, terminating pods.
    return max(4, math.ceil(max(pods / PODS_PER_NODE, gpu_pods / GPUS_PER_NODE) * 1.25) + 2)
