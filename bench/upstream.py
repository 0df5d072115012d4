"""The upstream AppWrapper controller, built and run for side-by-side benchmarks.

``build`` compiles ``github.com/project-codeflare/appwrapper`` at a pinned release from the Go
module proxy into the testbed's binary cache; ``start`` runs it against a testbed with its
webhooks off and the same fault-tolerance configuration Respawn's services read, on the same
(Respawn) AppWrapper CRD.

.venv/bin/python -m bench.upstream build          # idempotent; prints the binary's path
.venv/bin/python -m bench.upstream check-crd      # does Respawn's CRD carry every field upstream writes?
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from bench.progress import Log, quiet
from respawn.testbed import binaries
from respawn.testbed.cluster import _http_ok, kubectl
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, stop_pid, tail
from respawn.testbed.process import start as start_process
from shared.config import OperatorConfig, load_config

MODULE = "github.com/project-codeflare/appwrapper"
# v1.2.1 is the newest tag, but the Go checksum database has no record of it (sum.golang.org
# answers 404), so it cannot be verified; v1.2.0 can. Verification is never switched off.
VERSION = "v1.2.0"
MAIN_PACKAGE = f"{MODULE}/cmd"
CONFIGMAP = "appwrapper-operator-config"
NAMESPACE = "appwrapper-system"
PROCESS_NAME = "appwrapper-upstream"
RESPAWN_CRD = binaries.REPO_ROOT / "deploy" / "crd" / "appwrapper.yaml"
UPSTREAM_CRD = "config/crd/bases/workload.codeflare.dev_appwrappers.yaml"


class UpstreamUnavailable(Exception):
    """The upstream controller cannot be built or run here; the message is one line saying why."""


def binary_path() -> Path:
    return binaries.cache_root() / "bin" / f"appwrapper-{VERSION}" / "manager"


def _go_env() -> dict[str, str]:
    # The same build settings as the testbed's binaries (tools/k8sbins/build.sh).
    return {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-trimpath -buildvcs=false"}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def build(*, log: Log = quiet) -> Path:
    """Build the controller once (idempotent) and return its path.

    ``go install module/cmd@version`` cannot be used: it asks the proxy for the module's version
    list (to report deprecations), which the proxy refuses for this module. A wrapper module that
    requires the pinned release and builds its main package selects exactly the versions of the
    release's own go.mod (it has no replace directives), and every module is checked against
    the checksum database as usual.
    """
    target = binary_path()
    if os.access(target, os.X_OK):
        return target
    if shutil.which("go") is None:
        raise UpstreamUnavailable(
            "'go' not found on PATH; install Go >= 1.24 to build the upstream controller"
        )
    work = binaries.cache_root() / "gomod" / f"appwrapper-{VERSION}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        f"module respawn.invalid/appwrapper-bench\n\ngo 1.24.0\n\nrequire {MODULE} {VERSION}\n"
    )
    # A build-tagged import keeps the main package in the module graph for `go mod tidy`.
    (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{MAIN_PACKAGE}"\n')
    target.parent.mkdir(parents=True, exist_ok=True)
    steps = (
        ("resolving modules", ["go", "mod", "tidy"]),
        (
            f"building {MODULE} {VERSION} (a few minutes on a cold cache)",
            ["go", "build", "-ldflags", "-s -w", "-o", str(target) + ".tmp", MAIN_PACKAGE],
        ),
    )
    for what, argv in steps:
        log(f"upstream: {what}")
        proc = subprocess.run(argv, cwd=work, env=_go_env(), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise UpstreamUnavailable(
                f"cannot build {MODULE}@{VERSION} ({' '.join(argv[:2])}): {_last_line(proc.stderr)}"
            )
    Path(str(target) + ".tmp").replace(target)
    return target


def module_dir() -> Path:
    """The pinned release's source in the Go module cache (downloaded if needed)."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise UpstreamUnavailable(
            f"cannot download {MODULE}@{VERSION}: {info.get('Error') or _last_line(proc.stderr)}"
        )
    return Path(info["Dir"])


# ------------------------------------------------------------------ CRD compatibility


def _schema(crd_file: Path) -> dict[str, Any]:
    for doc in yaml.safe_load_all(crd_file.read_text()):
        if doc and doc.get("kind") == "CustomResourceDefinition":
            versions = {v["name"]: v for v in doc["spec"]["versions"]}
            return dict(versions["v1beta2"]["schema"]["openAPIV3Schema"])
    raise UpstreamUnavailable(f"no CustomResourceDefinition in {crd_file}")


def _field_paths(schema: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        yield path
        yield from _field_paths(sub, path)
    if "items" in schema:
        yield from _field_paths(schema["items"], prefix + "[]")


def crd_missing_fields(respawn_crd: Path = RESPAWN_CRD, upstream_crd: Path | None = None) -> list[str]:
    """Fields upstream's CRD declares that Respawn's lacks: the API server would prune them from
    what the upstream controller writes, so the two CRDs are compatible only if this is empty."""
    upstream_file = upstream_crd or module_dir() / UPSTREAM_CRD
    ours = set(_field_paths(_schema(respawn_crd)))
    theirs = set(_field_paths(_schema(upstream_file)))
    return sorted(theirs - ours)


# ------------------------------------------------------------------ running it


def _ns(d: timedelta) -> int:
    # Upstream's configuration decodes time.Duration from JSON, i.e. integer nanoseconds.
    return int(d / timedelta(microseconds=1)) * 1000


def operator_config(config: OperatorConfig, health_port: int) -> dict[str, Any]:
    """Upstream's OperatorConfig equal to Respawn's effective configuration, webhooks off."""
    ft = config.fault_tolerance
    ap = config.autopilot
    return {
        "appwrapper": {
            "autopilot": {
                "injectAntiAffinities": ap.inject_anti_affinities,
                "monitorNodes": ap.monitor_nodes,
                "resourceTaints": {
                    resource: [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]
                    for resource, taints in ap.resource_taints.items()
                },
                "preferNoScheduleWeight": ap.preferred_weight,
            },
            # Checked only by the (disabled) validating webhook.
            "userRBACAdmissionCheck": False,
            "faultTolerance": {
                "admissionGracePeriod": _ns(ft.admission_grace_period),
                "warmupGracePeriod": _ns(ft.warmup_grace_period),
                "failureGracePeriod": _ns(ft.failure_grace_period),
                "resetPause": _ns(ft.retry_pause_period),
                "retryLimit": ft.retry_limit,
                "deletionGracePeriod": _ns(ft.forceful_deletion_grace_period),
                "gracePeriodCeiling": _ns(ft.grace_period_ceiling),
                "successTTLCeiling": _ns(ft.success_ttl),
            },
            "defaultQueueName": config.default_queue_name,
        },
        "controllerManager": {
            # "0" switches controller-runtime's metrics server off (nothing here scrapes it).
            "metrics": {"bindAddress": "0"},
            "health": {"bindAddress": f"127.0.0.1:{health_port}"},
            "leaderElection": False,
        },
        "webhooksEnabled": False,
    }


@dataclass
class UpstreamController:
    proc: Proc
    health_port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        stop_pid(self.proc.pid)


def _apply_config(kubeconfig: Path, namespace: str, config: dict[str, Any]) -> None:
    manifests = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": namespace},
            "data": {"config.yaml": yaml.safe_dump(config, sort_keys=True)},
        },
    ]
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
    )


def start(
    kubeconfig: Path,
    log_dir: Path,
    *,
    config: OperatorConfig | None = None,
    namespace: str = NAMESPACE,
    ready_timeout: float = 120.0,
    log: Log = quiet,
) -> UpstreamController:
    """Build if needed, then run the controller until its AppWrapper workers have started."""
    binary = build(log=log)
    missing = crd_missing_fields()
    if missing:
        raise UpstreamUnavailable(
            f"Respawn's AppWrapper CRD lacks fields the upstream controller writes: {', '.join(missing[:5])}"
        )
    health_port = free_port()
    _apply_config(
        kubeconfig, namespace, operator_config(config or load_config(None, os.environ), health_port)
    )
    log_file = log_dir / f"{PROCESS_NAME}.log"
    # Only what is appended from here on belongs to this run.
    offset = log_file.stat().st_size if log_file.exists() else 0
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NAMESPACE": namespace}
    proc = start_process(
        PROCESS_NAME, [str(binary), f"--config={CONFIGMAP}", "--zap-log-level=info"], log_file, env=env
    )
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            if not proc.alive():
                raise UpstreamUnavailable(f"the upstream controller exited at start-up: {tail(log_file)}")
            if _workers_started(log_file, offset) and _probe(health_port):
                return UpstreamController(proc, health_port)
            if time.monotonic() > deadline:
                raise UpstreamUnavailable(
                    "the upstream controller did not start its AppWrapper workers within "
                    f"{ready_timeout:.0f}s: {tail(log_file)}"
                )
            time.sleep(0.2)
    except BaseException:
        stop_pid(proc.pid)
        raise


def _probe(port: int) -> bool:
    try:
        return _http_ok(f"http://127.0.0.1:{port}/healthz")
    except OSError:
        return False


def _workers_started(log_file: Path, offset: int) -> bool:
    # controller-runtime logs this once the AppWrapper controller's caches have synced.
    with open(log_file, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return any("Starting workers" in line and '"AppWrapper"' in line for line in text.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("build", "check-crd"))
    args = parser.parse_args()
    try:
        if args.command == "build":
            print(build(log=lambda line: print(line, file=sys.stderr)))
        else:
            missing = crd_missing_fields()
            if missing:
                print("missing in Respawn's CRD: " + ", ".join(missing))
                raise SystemExit(1)
            print(f"Respawn's CRD declares every field of {MODULE}@{VERSION}'s CRD")
    except UpstreamUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
