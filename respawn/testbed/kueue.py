"""Kueue on the local testbed, configured as MLBatch runs it, admitting AppWrappers to Respawn.

Kueue (``sigs.k8s.io/kueue``, pinned in ``tools/k8sbins/versions.env``) runs as one process on
127.0.0.1 with the admin kubeconfig, like the training operator. Its webhooks are real: the
configurations of its own manifests (``config/components/webhook``) are registered with
``clientConfig.url`` pointing at the process and a serving certificate for 127.0.0.1 from the
testbed's CA (Kueue's internal certificate management is off), and so is the conversion webhook
of its CRDs. Only what the AppWrapper integration needs is kept: the webhooks of Kueue's own kinds
and of AppWrappers.

Kueue's reach is limited to namespaces labelled ``respawn.dev/kueue=true``
(``managedJobsNamespaceSelector`` and the AppWrapper webhooks' ``namespaceSelector``), and the
AppWrapper framework is its only integration, so the rest of the testbed's workloads (Jobs,
PyTorchJobs, AppWrappers elsewhere) never meet it. ``docs/kueue.md`` has the configuration and
why.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from respawn.testbed import binaries, pki, ports
from respawn.testbed.cluster import State, _http_ok, kubectl
from respawn.testbed.errors import TestbedError
from respawn.testbed.files import replace_atomically
from respawn.testbed.process import pid_alive, start, stop_pid, tail, wait_until

# The label that puts a namespace in Kueue's reach on the testbed.
NAMESPACE_LABEL = "respawn.dev/kueue"
KUEUE_SYSTEM = "kueue-system"
PROCESS = "kueue"
# The names Kueue's release gives its webhook configurations (its kustomization's namePrefix).
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
# The kinds whose webhooks are kept: Kueue's own, and the AppWrapper integration's.
_GROUPS = {"kueue.x-k8s.io", "workload.codeflare.dev"}
# Kueue's release serves these CRDs through its conversion webhook (config/components/crd).
_CONVERTED = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def configuration(
    *, webhook_port: int, health_port: int, cert_dir: Path, wait_for_pods_ready: str | None = None
) -> dict[str, Any]:
    """Kueue's Configuration: MLBatch's (``setup.k8s/kueue/controller_manager_config.yaml``), in
    Kueue's v1beta2 form, with the testbed's addresses and scope.

    MLBatch: ``manageJobsWithoutQueueName`` on, ``managedJobsNamespaceSelector`` on a namespace
    label, ``waitForPodsReady`` off, fair sharing on, AppWrappers admitted (here through the
    built-in ``workload.codeflare.dev/appwrapper`` framework of Kueue 0.11 and later; the other
    frameworks MLBatch enables are left out so that the testbed's other workloads stay Kueue's
    strangers). ``wait_for_pods_ready`` (a Go duration) turns waitForPodsReady on with that timeout.
    """
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_SYSTEM,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        # "0": no metrics server; the tests read Kueue's objects, not its metrics.
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "true"}},
        "integrations": {"frameworks": ["workload.codeflare.dev/appwrapper"]},
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        # The visibility API is an aggregated API server of its own, which nothing here uses.
        "featureGates": {"VisibilityOnDemand": False},
    }
    if wait_for_pods_ready is not None:
        config["waitForPodsReady"] = {
            "timeout": wait_for_pods_ready,
            "blockAdmission": False,
            # Requeued a few seconds after an eviction (Kueue's default waits a minute and more),
            # long enough for the suspended state in between to be seen.
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 5, "backoffMaxSeconds": 10},
        }
    return config


def crds(module: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs from its module, served through its conversion webhook at ``url``."""
    out = []
    for path in sorted((module / "config" / "components" / "crd" / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in _CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(module: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's own webhook configurations (``config/components/webhook/manifests.yaml``), cut to
    the webhooks of Kueue's kinds and of AppWrappers, pointed at ``url``; those of AppWrappers
    reach only namespaces labelled ``NAMESPACE_LABEL``."""
    path = module / "config" / "components" / "webhook" / "manifests.yaml"
    out = []
    for conf in yaml.safe_load_all(path.read_text()):
        if not conf:
            continue
        conf["metadata"] = {
            "name": MUTATING if conf["kind"] == "MutatingWebhookConfiguration" else VALIDATING,
            "labels": {"app.kubernetes.io/name": "kueue"},
        }
        kept = []
        for hook in conf["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            if not groups <= _GROUPS:
                continue
            hook["clientConfig"] = {
                "url": url + hook["clientConfig"]["service"]["path"],
                "caBundle": ca_bundle,
            }
            if "workload.codeflare.dev" in groups:
                hook["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: "true"}}
            kept.append(hook)
        conf["webhooks"] = kept
        out.append(conf)
    return out


# Without its internal certificate management, Kueue loads a metrics certificate from this fixed
# path at start and exits when there is none (cmd/kueue/main.go), even with metrics off. Any valid
# pair will do, as nothing connects to it; it is shared by every testbed of the machine, the way
# the training operator's certificate directory is.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def _apply(kubeconfig: Path, items: list[dict[str, Any]]) -> None:
    """Server-side apply, taking over fields another manager set (a Kueue started again)."""
    kubectl(
        kubeconfig,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        timeout=120,
    )


def _seed_metrics_certs(crt: Path, key: Path) -> None:
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for src, name in ((crt, "tls.crt"), (key, "tls.key")):
            if not (METRICS_CERT_DIR / name).exists():
                replace_atomically(METRICS_CERT_DIR / name, src.read_bytes())
    except OSError as exc:
        raise TestbedError(
            f"Kueue needs a certificate in {METRICS_CERT_DIR} and it cannot be written ({exc}); "
            "run as a user who may create it"
        ) from exc


def _refresh(state: State) -> None:
    """Take what another `up` or `down` recorded meanwhile (the CLI and a test may share a
    testbed): the pids and ports on disk are the truth."""
    on_disk = State.load(state.state_dir)
    if on_disk is not None:
        state.pids, state.ports = on_disk.pids, on_disk.ports


def running(state: State) -> bool:
    _refresh(state)
    pid = state.pids.get(PROCESS)
    return pid is not None and pid_alive(pid)


def up(
    state: State, *, log: Log = _quiet, wait_for_pods_ready: str | None = None, restart: bool = False
) -> None:
    """Start Kueue on a running testbed (a no-op when it runs already, unless ``restart``:
    then it is stopped and started again with this configuration)."""
    if running(state):
        if not restart:
            log("Kueue already running")
            return
        stop_pid(state.pids.pop(PROCESS))
        state.save()
    binary = binaries.addon("kueue")
    module = binaries.kueue_module_dir()
    p = pki.Pki(state.state_dir / "pki")
    webhook_port = ports.free_port()
    health_port = ports.free_port()
    state.ports["kueue-webhook"] = webhook_port
    state.ports["kueue-health"] = health_port
    work = state.state_dir / "kueue"
    cert_dir = work / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    crt, key = pki.serving_cert(p, "kueue-webhook")
    # controller-runtime reads tls.crt and tls.key from its certDir.
    shutil.copyfile(crt, cert_dir / "tls.crt")
    shutil.copyfile(key, cert_dir / "tls.key")
    _seed_metrics_certs(crt, key)
    ca_bundle = base64.b64encode(p.ca_crt.read_bytes()).decode()
    url = f"https://127.0.0.1:{webhook_port}"

    kubeconfig = state.kubeconfig
    log("installing Kueue's CRDs and webhook configurations")
    kubectl(kubeconfig, "create", "namespace", KUEUE_SYSTEM, check=False)
    docs = crds(module, url, ca_bundle)
    _apply(kubeconfig, docs)
    kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        *(f"crd/{d['metadata']['name']}" for d in docs),
    )
    hooks = webhook_configurations(module, url, ca_bundle)
    _apply(kubeconfig, hooks)
    config = configuration(
        webhook_port=webhook_port,
        health_port=health_port,
        cert_dir=cert_dir,
        wait_for_pods_ready=wait_for_pods_ready,
    )
    config_file = work / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    log(
        "starting Kueue"
        + (f" (waitForPodsReady timeout {wait_for_pods_ready})" if wait_for_pods_ready else "")
    )
    proc = start(
        PROCESS,
        [str(binary), f"--config={config_file}", "--zap-log-level=2"],
        state.state_dir / "logs" / "kueue.log",
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    state.pids[PROCESS] = proc.pid
    state.save()
    try:
        wait_until(proc, lambda: _http_ok(f"http://127.0.0.1:{health_port}/readyz"), timeout=90, what="ready")
    except BaseException:
        stop(state)
        raise
    if not proc.alive():
        raise TestbedError(f"Kueue exited during start-up; last log lines: {tail(proc.log)}")


def stop(state: State, *, log: Log = _quiet) -> None:
    """Stop Kueue and remove its webhook configurations, which would otherwise refuse what they
    match (they fail closed) with nothing serving them. Its CRDs and objects stay."""
    _refresh(state)
    pid = state.pids.pop(PROCESS, None)
    if pid is not None:
        log(f"stopping Kueue (pid {pid})")
        stop_pid(pid)
        state.save()
    for kind, name in (
        ("mutatingwebhookconfiguration", MUTATING),
        ("validatingwebhookconfiguration", VALIDATING),
    ):
        kubectl(state.kubeconfig, "delete", kind, name, "--ignore-not-found", check=False)
