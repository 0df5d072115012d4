"""`respawn status`, `tail` and `explain` against the testbed, run as a user would run them.

watcher, health and lifecycle run as separate processes; an AppWrapper's pod fails once and the
CLI (a subprocess, configured only through KUBECONFIG and NATS_URL) has to tell that story.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn.testbed import manifests, sim
from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from shared import subjects
from shared.appwrapper.model import read_appwrapper
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION
from tests.integration.cli import RESPAWN, respawn
from tests.integration.conftest import ServiceFactory
from tests.integration.objects import FAST_RESET, apply, running_pods, wait_phase
from tests.waiting import until

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]


def cli_env(testbed: Endpoints, **overrides: str | None) -> dict[str, str]:
    env = {**os.environ, "KUBECONFIG": str(testbed.kubeconfig), "NATS_URL": testbed.nats_url}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


# docs/cli.md, "Exit codes".
NOT_FOUND = 3
UNAVAILABLE = 4


def one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The failure shape every CLI error must have: exit ``code``, one `error:` line on stderr."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert proc.stdout == ""
    return lines[0]


def failing_once(name: str) -> dict[str, Any]:
    """An AppWrapper around one Job; its pod succeeds after 3s unless the test fails it first."""
    return manifests.job_appwrapper(
        name,
        pod_annotations={sim.SUCCEED_AFTER: "3s"},
        annotations={**FAST_RESET, RETRY_LIMIT_ANNOTATION: "2"},
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def follower(testbed: Endpoints, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """`respawn tail ...` left running (following), its stdout in a file; stopped after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> Path:
        out = tmp_path / f"tail-{len(procs)}.out"
        with out.open("wb") as sink:
            procs.append(
                subprocess.Popen(
                    [*RESPAWN, "tail", *args],
                    env=cli_env(testbed),
                    cwd=REPO,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )
        return out

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_status_tail_and_explain_tell_the_story_of_a_pod_that_failed_once(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    service: ServiceFactory,
    follower: Callable[..., Path],
    tmp_path: Path,
) -> None:
    kc = testbed.kubeconfig
    traces = {name: tmp_path / f"trace-{name}.jsonl" for name in ("watcher", "health", "lifecycle")}
    for name, path in traces.items():
        service(name, env={"RESPAWN_TRACE_FILE": str(path)})
    env = cli_env(testbed)
    # A follower started before anything happens sees the verdicts as they are published.
    followed = follower("verdicts", "--namespace", namespace, "--json")

    apply(kc, namespace, failing_once("once"))
    await wait_phase(kc, namespace, "once", "Running", within=60)
    pod = (await until("a running pod", lambda: running_pods(kc, namespace, "once"), within=60))[0]
    pod_name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    sim.fail_pod(kc, namespace, pod_name, exit_code=3)
    done = await wait_phase(kc, namespace, "once", "Succeeded", within=60)
    assert read_appwrapper(done).resetting_count == 1

    # ---- status
    doc = json.loads(ok(respawn("status", "-n", namespace, "-o", "json", env=env)))
    assert doc["version"] == "respawn.cli/v1"
    [row] = doc["appwrappers"]
    assert (row["namespace"], row["name"], row["phase"]) == (namespace, "once", "Succeeded")
    assert (row["resettingCount"], row["retryLimit"]) == (1, 2)  # the limit from the annotation
    assert row["unhealthyReason"] == ""  # the reset cleared it
    assert row["lastTransitionTime"] and 0 <= row["lastTransitionAgeSeconds"] < 300
    table = ok(respawn("status", "-n", namespace, env=env))
    [line] = [line for line in table.splitlines() if " once " in f" {line} "]
    assert line.split()[:5] == [namespace, "once", "Succeeded", "1/2", "-"]
    # One AppWrapper by name: the same row (its age moves on).
    [one] = json.loads(ok(respawn("status", "-n", namespace, "once", "-o", "json", env=env)))["appwrappers"]
    assert {**one, "lastTransitionAgeSeconds": 0} == {**row, "lastTransitionAgeSeconds": 0}

    # ---- tail
    records = json_lines(
        ok(respawn("tail", "verdicts", "--no-follow", "--namespace", namespace, "--json", env=env))
    )
    assert records and all(r["version"] == "respawn.cli/v1" for r in records)
    assert all(r["stream"] == "RESPAWN_VERDICTS" and r["kind"] == "verdict" for r in records)
    assert all(r["subject"] == subjects.verdict(namespace, "once") for r in records)
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    unhealthy = [r["payload"] for r in records if r["payload"]["state"] == "Unhealthy"]
    assert unhealthy and unhealthy[0]["reason"] == "FoundFailedPods"
    # Its only pod failed with an error of its own: the application's fault, no node blamed.
    assert (unhealthy[0]["failure_class"], unhealthy[0]["failure_code"], unhealthy[0]["fault_kind"]) == (
        "Unknown",
        "ExitCode:3",
        "Application",
    )
    assert unhealthy[0]["nodes"] == []
    assert records[-1]["payload"]["state"] == "Succeeded"
    assert all(r["traceId"] for r in records)  # tracing is on in the services: every verdict has one
    # From a stream sequence: only what follows it.
    tail_from = json_lines(
        ok(
            respawn(
                "tail", "verdicts", "--no-follow", "-n", namespace, "--json", "--seq", str(seqs[-1]), env=env
            )
        )
    )
    assert [r["seq"] for r in tail_from] == [seqs[-1]]
    # From a time: an hour back covers everything, a time after the last verdict nothing.
    since = ok(
        respawn("tail", "verdicts", "--no-follow", "-n", namespace, "--json", "--since", "1h", env=env)
    )
    assert [r["seq"] for r in json_lines(since)] == seqs
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = ok(respawn("tail", "verdicts", "--no-follow", "-n", namespace, "--since", later, env=env))
    assert future == ""
    # The lifecycle stream, as readable lines.
    lines = ok(respawn("tail", "lifecycle", "--no-follow", "-n", namespace, env=env)).splitlines()
    assert any(f"{namespace}/once  ResetStarted" in line and "FoundFailedPods" in line for line in lines)
    assert any("PhaseChanged Resuming->Running" in line and "attempt=1" in line for line in lines)
    assert any("PhaseChanged Running->Succeeded" in line for line in lines)
    # The follower printed the same verdicts while they happened.
    await until(
        "the following tail to print every verdict",
        lambda: [r["seq"] for r in json_lines(followed.read_text())],
        done=lambda printed: printed == seqs,
        within=20,
    )

    # ---- explain
    text = ok(respawn("explain", f"{namespace}/once", env=env))
    assert text.splitlines()[0] == f"AppWrapper {namespace}/once: Succeeded, 1 reset"
    assert f"pod {pod_name} on {node}: deleted after Failed; main exited 3 (Error)" in text
    assert "1. FoundFailedPods [Unknown ExitCode:3, application fault]: " in text
    assert "running again +" in text and "outcome: recovered (reset to attempt 1)" in text
    explained = json.loads(ok(respawn("explain", f"{namespace}/once", "--json", env=env)))
    assert explained["version"] == "respawn.cli/v1"
    [incident] = explained["incidents"]
    assert (incident["reason"], incident["outcome"], incident["attempt"]) == (
        "FoundFailedPods",
        "recovered",
        1,
    )
    assert (incident["failureClass"], incident["failureCode"], incident["faultKind"]) == (
        "Unknown",
        "ExitCode:3",
        "Application",
    )
    assert incident["nodes"] == []
    detection, to_reset, recovery = (
        incident["detectionSeconds"],
        incident["timeToResetSeconds"],
        incident["recoverySeconds"],
    )
    assert 0 <= detection <= to_reset <= recovery < 60
    stamps = [e["at"] for e in explained["timeline"]]
    assert stamps == sorted(stamps)
    sources = {e["source"] for e in explained["timeline"]}
    assert sources == {"observation", "verdict", "lifecycle"}
    # It ends with the trace ids, which are the services' own traces.
    trace_ids = explained["traceIds"]
    assert trace_ids and set(incident["traceIds"]) <= set(trace_ids)
    tail_of_text = text.split("\nTraces\n", 1)[1].splitlines()
    assert [line.split()[0] for line in tail_of_text] == trace_ids
    exported = await until(
        "the services to export the incident's spans",
        lambda: all(
            any(f"0x{tid}" in path.read_text() for path in traces.values() if path.exists())
            for tid in incident["traceIds"]
        ),
        within=30,
    )
    assert exported


# ------------------------------------------------------------------------------------ errors


def test_no_cluster_is_one_error_line(testbed: Endpoints, tmp_path: Path) -> None:
    # A kubeconfig whose server nobody listens on.
    config = yaml.safe_load(testbed.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    line = one_error_line(respawn("status", env=cli_env(testbed, KUBECONFIG=str(dead))), UNAVAILABLE)
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:" in line
    # A kubeconfig that does not exist, and none at all.
    line = one_error_line(
        respawn("status", env=cli_env(testbed, KUBECONFIG=str(tmp_path / "missing"))), UNAVAILABLE
    )
    assert "does not exist" in line
    env = cli_env(testbed, KUBECONFIG=None, HOME=str(tmp_path), KUBERNETES_SERVICE_HOST=None)
    assert (
        one_error_line(respawn("status", env=env), UNAVAILABLE)
        == "error: no cluster configured: set KUBECONFIG or pass --kubeconfig"
    )


def test_no_nats_is_one_error_line_within_the_connect_deadline(testbed: Endpoints) -> None:
    dead = cli_env(testbed, NATS_URL=f"nats://127.0.0.1:{free_port()}")
    for args in (("tail", "verdicts", "--no-follow"), ("tail", "lifecycle"), ("explain", "default/x")):
        started = time.monotonic()
        line = one_error_line(respawn(*args, timeout=30, env=dead), UNAVAILABLE)
        assert "NATS at nats://127.0.0.1:" in line, line
        assert time.monotonic() - started < 15
    unset = cli_env(testbed, NATS_URL=None)
    assert one_error_line(respawn("tail", "verdicts", env=unset), UNAVAILABLE) == (
        "error: NATS_URL is not set; pass --nats-url or set NATS_URL"
    )


def test_unknown_appwrapper_is_one_error_line(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, service: ServiceFactory
) -> None:
    service("watcher")  # so that the streams exist, as on any cluster Respawn runs on
    env = cli_env(testbed)
    line = one_error_line(respawn("status", "-n", namespace, "nope", env=env), NOT_FOUND)
    assert line == f"error: AppWrapper {namespace}/nope not found"
    line = one_error_line(respawn("explain", f"{namespace}/nope", env=env), NOT_FOUND)
    assert line.startswith(f"error: unknown AppWrapper {namespace}/nope")
    # An empty namespace is not an error for a listing.
    assert json.loads(ok(respawn("status", "-n", namespace, "-o", "json", env=env)))["appwrappers"] == []


# ------------------------------------------------------------------------------------ namespaces


def with_context_namespace(testbed: Endpoints, tmp_path: Path, namespace: str) -> Path:
    """A copy of the testbed's kubeconfig whose current context is in ``namespace``."""
    config = yaml.safe_load(testbed.kubeconfig.read_text())
    current = config["current-context"]
    for ctx in config["contexts"]:
        if ctx["name"] == current:
            ctx["context"]["namespace"] = namespace
    path = tmp_path / "kubeconfig-in-namespace"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def other_namespace(testbed: Endpoints) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl(testbed.kubeconfig, "create", "namespace", name)
    yield name
    kubectl(testbed.kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def listed(proc: subprocess.CompletedProcess[str]) -> set[tuple[str, str]]:
    return {(r["namespace"], r["name"]) for r in json.loads(ok(proc))["appwrappers"]}


def test_status_and_explain_default_to_the_contexts_namespace_and_a_reads_every_one(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, manifests.job_appwrapper("here"))
    apply(kc, other_namespace, manifests.job_appwrapper("there"))
    env = cli_env(testbed, KUBECONFIG=str(with_context_namespace(testbed, tmp_path, namespace)))

    # Like kubectl: the context's namespace, not every namespace.
    assert listed(respawn("status", "-o", "json", env=env)) == {(namespace, "here")}
    assert listed(respawn("status", "-n", other_namespace, "-o", "json", env=env)) == {
        (other_namespace, "there")
    }
    everywhere = listed(respawn("status", "-A", "-o", "json", env=env))
    assert {(namespace, "here"), (other_namespace, "there")} <= everywhere
    # One AppWrapper by name, in the context's namespace; across namespaces it is a usage error.
    assert listed(respawn("status", "here", "-o", "json", env=env)) == {(namespace, "here")}
    refused = respawn("status", "here", "-A", env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("error: "), refused.stderr
    # explain NAME looks in the same namespace (no Respawn service ran: nothing to explain there).
    line = one_error_line(respawn("explain", "there", env=env), NOT_FOUND)
    assert line.startswith(f"error: unknown AppWrapper {namespace}/there")


# ------------------------------------------------------------------------------------ retry limit


def deployed_lifecycle(kubeconfig: Path, namespace: str, config_yaml: str, env: dict[str, str]) -> None:
    """lifecycle's Deployment of deploy/base (no replicas: nothing is to run) and its ConfigMaps,
    under hashed names as kustomize generates them, in ``namespace``."""
    docs = list(yaml.safe_load_all((REPO / "deploy/base/services/lifecycle.yaml").read_text()))
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = 0
    spec = deployment["spec"]["template"]["spec"]
    for volume in spec["volumes"]:
        if volume.get("configMap", {}).get("name") == "respawn-config":
            volume["configMap"]["name"] = "respawn-config-5f7h2"
    for source in spec["containers"][0]["envFrom"]:
        source["configMapRef"]["name"] = "respawn-env-9k2b4"
    configmaps = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "respawn-config-5f7h2"},
            "data": {"config.yaml": config_yaml},
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "respawn-env-9k2b4"}, "data": env},
    ]
    for body in (*configmaps, deployment):
        apply(kubeconfig, namespace, body)


def test_attempts_show_the_retry_limit_deployed_in_the_cluster(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str, other_namespace: str
) -> None:
    kc = testbed.kubeconfig
    apply(kc, namespace, manifests.job_appwrapper("plain"))
    apply(kc, namespace, manifests.job_appwrapper("annotated", annotations={RETRY_LIMIT_ANNOTATION: "2"}))
    env = cli_env(testbed, RESPAWN_CONFIG=None)
    # Respawn "installed" in other_namespace: its ConfigMap says 7.
    deployed_lifecycle(kc, other_namespace, "faultTolerance:\n  retryLimit: 7\n", {})
    args = ("status", "-n", namespace, "--respawn-namespace", other_namespace)

    doc = json.loads(ok(respawn(*args, "-o", "json", env=env)))
    limits = {r["name"]: (r["retryLimit"], r["retryLimitSource"]) for r in doc["appwrappers"]}
    assert limits == {"plain": (7, "cluster"), "annotated": (2, "annotation")}
    assert doc["retryLimitDefault"] == {
        "retryLimit": 7,
        "source": "cluster",
        "from": f"ConfigMap {other_namespace}/respawn-config-5f7h2",
        "clusterError": None,
    }
    table = ok(respawn(*args, env=env))
    [line] = [line for line in table.splitlines() if " plain " in f" {line} "]
    cells = line.split()
    assert (cells[0], cells[1], cells[3]) == (namespace, "plain", "0/7")

    # The Deployment's environment overrides the file, as in lifecycle's container.
    deployed_lifecycle(
        kc,
        other_namespace,
        "faultTolerance:\n  retryLimit: 7\n",
        {"RESPAWN_FAULT_TOLERANCE_RETRY_LIMIT": "5"},
    )
    doc = json.loads(ok(respawn(*args, "-o", "json", env=env)))
    assert {r["name"]: r["retryLimit"] for r in doc["appwrappers"]} == {"plain": 5, "annotated": 2}

    # --config: this file, and nothing read from the cluster for it.
    local = REPO / "deploy/base/config/config.yaml"
    doc = json.loads(ok(respawn(*args, "--config", str(local), "-o", "json", env=env)))
    assert doc["retryLimitDefault"] == {
        "retryLimit": 3,
        "source": "file",
        "from": str(local),
        "clusterError": None,
    }


def test_without_a_readable_deployed_config_the_limit_falls_back_and_says_why(
    testbed: Endpoints, appwrapper_crd: Path, namespace: str
) -> None:
    apply(testbed.kubeconfig, namespace, manifests.job_appwrapper("plain"))
    env = cli_env(testbed, RESPAWN_CONFIG=None)
    # Respawn is not installed in that namespace (on the testbed its services run as processes).
    proc = respawn("status", "-n", namespace, "--respawn-namespace", namespace, "-o", "json", env=env)
    doc = json.loads(ok(proc))
    reason = f"no Respawn lifecycle Deployment in namespace {namespace}"
    assert doc["retryLimitDefault"] == {
        "retryLimit": 3,
        "source": "builtin",
        "from": "",
        "clusterError": reason,
    }
    assert [(r["retryLimit"], r["retryLimitSource"]) for r in doc["appwrappers"]] == [(3, "builtin")]
    assert proc.stderr.splitlines() == [
        "respawn: the default retry limit (3, from the built-in default) is not the cluster's: cannot read "
        f"Respawn's configuration in namespace {namespace}: {reason}"
    ]
