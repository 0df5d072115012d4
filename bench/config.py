"""What one benchmark run is asked to do: its settings, and the command-line flags that set them.

``bench.run`` and ``bench.compare`` share the flags (``add_arguments``) so that a comparison runs
both controllers with exactly the settings a single run would get.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed.services import parse_replicas
from shared.durations import parse_go_duration

CONTROLLERS = ("respawn", "upstream")
FAULT_KINDS = ("pod-failure", "evict", "stuck-init")
DEFAULT_MIX = (("pod-failure", 0.7), ("evict", 0.15), ("stuck-init", 0.15))


class BenchError(Exception):
    """A run cannot go ahead; the message is one line naming cause and fix."""


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds after the fault phase starts
    kind: str


@dataclass(frozen=True)
class BenchConfig:
    controller: str = "respawn"
    appwrappers: int = 100
    pods_per_aw: int = 8
    fault_rate: float = 0.2  # faults per second, Poisson arrivals
    duration: float = 120.0  # seconds of fault injection
    seed: int = 1
    max_faults: int | None = None
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    gpu_fraction: float = 0.25
    pytorch_fraction: float = 0.4
    # Per-AppWrapper annotations, so both controllers run with the same periods.
    failure_grace: str = "0s"
    retry_pause: str = "0s"
    warmup_grace: str = "10s"  # stuck-init AppWrappers (admission and warmup)
    setup_grace: str = "10m"  # admission and warmup of the N AppWrappers: start-up at scale is slow
    stuck_init_pods: int = 1
    idle_seconds: float = 60.0  # each idle window (0: no idle-cost measurement)
    quiesce_seconds: float = 15.0
    settle_timeout: float = 300.0
    setup_timeout: float = 1800.0
    cleanup_timeout: float = 300.0
    retry_ineligible: float = 15.0  # how long a fault waits for an eligible target
    nodes: int | None = None
    # Processes per Respawn service, as (service, count) pairs in the order given; a service not
    # named runs one. Empty for upstream, which is one process.
    replicas: tuple[tuple[str, int], ...] = ()
    # A fixed plan instead of the seeded Poisson one (the smoke test injects one of each kind).
    fault_plan: tuple[PlannedFault, ...] | None = None

    def seconds(self, duration: str) -> float:
        return parse_go_duration(duration).total_seconds()


# ------------------------------------------------------------------ command line


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``kind[=weight],...`` (weight 1 when omitted), e.g. ``pod-failure=0.7,evict``."""
    out = []
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind.strip() not in FAULT_KINDS:
            raise argparse.ArgumentTypeError(f"unknown fault kind {kind!r}; use {', '.join(FAULT_KINDS)}")
        try:
            value = float(weight or 1)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"weight of {kind.strip()!r} is not a number: {weight!r}"
            ) from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"weight of {kind.strip()!r} is negative: {weight}")
        out.append((kind.strip(), value))
    if not any(w > 0 for _, w in out):
        raise argparse.ArgumentTypeError("at least one fault kind needs a weight above 0")
    return tuple(out)


def parse_replicas_flag(text: str) -> tuple[tuple[str, int], ...]:
    """``health=2,lifecycle=2`` as ``(("health", 2), ("lifecycle", 2))``: the syntax and limits of
    ``respawn local up --replicas``, whose parser this is."""
    try:
        return tuple(parse_replicas(text).items())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument("--appwrappers", type=int, default=d.appwrappers)
    parser.add_argument("--pods-per-aw", type=int, default=d.pods_per_aw)
    parser.add_argument("--fault-rate", type=float, default=d.fault_rate, help="faults per second (Poisson)")
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of fault injection")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--max-faults", type=int, default=None)
    parser.add_argument(
        "--mix", type=parse_mix, default=d.mix, help="e.g. pod-failure=0.7,evict=0.15,stuck-init=0.15"
    )
    parser.add_argument("--gpu-fraction", type=float, default=d.gpu_fraction)
    parser.add_argument("--pytorch-fraction", type=float, default=d.pytorch_fraction)
    parser.add_argument("--failure-grace", default=d.failure_grace)
    parser.add_argument("--retry-pause", default=d.retry_pause)
    parser.add_argument("--warmup-grace", default=d.warmup_grace, help="of the stuck-init AppWrappers")
    parser.add_argument(
        "--idle", type=float, default=d.idle_seconds, help="seconds of each idle window; 0: none"
    )
    parser.add_argument("--settle-timeout", type=float, default=d.settle_timeout)
    parser.add_argument("--setup-timeout", type=float, default=d.setup_timeout)
    parser.add_argument(
        "--cleanup-timeout", type=float, default=d.cleanup_timeout, help="for deleting every AppWrapper"
    )
    parser.add_argument("--nodes", type=int, default=None, help="kwok nodes (default: from the workload)")
    parser.add_argument("--state-dir", type=Path, default=None, help="reuse the testbed running there")
    parser.add_argument(
        "--replicas",
        type=parse_replicas_flag,
        default=d.replicas,
        metavar="SERVICE=N,...",
        help="processes of each Respawn service (default: one of each), e.g. health=2,lifecycle=2",
    )


def config_from(args: argparse.Namespace, controller: str) -> BenchConfig:
    """The settings of one controller's run. ``--replicas`` counts Respawn's services, so the
    upstream controller's run (one process) leaves it out."""
    return BenchConfig(
        controller=controller,
        appwrappers=args.appwrappers,
        pods_per_aw=args.pods_per_aw,
        fault_rate=args.fault_rate,
        duration=args.duration,
        seed=args.seed,
        max_faults=args.max_faults,
        mix=args.mix,
        gpu_fraction=args.gpu_fraction,
        pytorch_fraction=args.pytorch_fraction,
        failure_grace=args.failure_grace,
        retry_pause=args.retry_pause,
        warmup_grace=args.warmup_grace,
        idle_seconds=args.idle,
        settle_timeout=args.settle_timeout,
        setup_timeout=args.setup_timeout,
        cleanup_timeout=args.cleanup_timeout,
        nodes=args.nodes,
        replicas=args.replicas if controller == "respawn" else (),
    )
