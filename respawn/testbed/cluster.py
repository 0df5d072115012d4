"""The local testbed: a real Kubernetes control plane with kwok's nodes, plus NATS JetStream.

`up` starts etcd, kube-apiserver (TLS + RBAC), kube-controller-manager, kube-scheduler,
kwok (fake nodes and pod lifecycles following the pod simulation contract), the Kubeflow
training operator, the JobSet controller, the KubeRay operator and nats-server (with
``nats_tls``, requiring TLS with a certificate of the testbed's CA), each as its own process on
127.0.0.1 with free ports, and returns once all of them are ready; with ``real_node`` also
containerd and a kubelet, a node that runs pods for real (``respawn.testbed.realnode``). `down`
stops by pid whatever `up` recorded in ``DIR/state.json`` and removes the state directory.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from respawn.testbed import binaries, pki, ports, realnode
from respawn.testbed.errors import TestbedError
from respawn.testbed.files import replace_atomically
from respawn.testbed.process import Proc, pid_alive, start, stop_pid, tail, wait_until
from respawn.waiting import until_sync

DEFAULT_STATE_DIR = Path(".respawn")
ASSETS = Path(__file__).parent / "assets"
STATE_FILE = "state.json"
NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class State:
    """What `up` started; `down` needs nothing else."""

    state_dir: Path
    kubeconfig: Path
    nats_url: str
    api_url: str
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    # The CA a client must trust when NATS requires TLS (None: it does not).
    nats_ca_file: Path | None = None
    # The name of the real node (containerd + kubelet) this testbed runs; None: kwok's nodes only.
    real_node: str | None = None

    def save(self) -> None:
        data = {
            "kubeconfig": str(self.kubeconfig),
            "nats_url": self.nats_url,
            "api_url": self.api_url,
            "pids": self.pids,
            "ports": self.ports,
            "nodes": self.nodes,
            "nats_ca_file": str(self.nats_ca_file) if self.nats_ca_file else None,
            "real_node": self.real_node,
        }
        replace_atomically(self.state_dir / STATE_FILE, json.dumps(data, indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> State | None:
        path = state_dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return cls(
            state_dir=state_dir,
            kubeconfig=Path(data["kubeconfig"]),
            nats_url=data["nats_url"],
            api_url=data["api_url"],
            pids={k: int(v) for k, v in data.get("pids", {}).items()},
            ports={k: int(v) for k, v in data.get("ports", {}).items()},
            nodes=int(data.get("nodes", 0)),
            nats_ca_file=Path(data["nats_ca_file"]) if data.get("nats_ca_file") else None,
            real_node=data.get("real_node"),
        )

    def nats_tls_env(self) -> dict[str, str]:
        """What a service (or the CLI) needs in its environment to trust this testbed's NATS."""
        return {"RESPAWN_NATS_TLS_CA_FILE": str(self.nats_ca_file)} if self.nats_ca_file else {}

    def running(self) -> dict[str, bool]:
        return {name: pid_alive(pid) for name, pid in self.pids.items()}


# ------------------------------------------------------------------ readiness probes

_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        return bool(resp.status == 200)


def _client_ctx(p: pki.Pki, client: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca_crt))
    crt, key = p.client(client)
    ctx.load_cert_chain(str(crt), str(key))
    return ctx


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    built = binaries.bin_dir() / "kubectl"
    if built.exists():
        return str(built)
    raise TestbedError("kubectl not found on PATH; install kubectl (any version >= 1.30) and retry")


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise TestbedError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


# ------------------------------------------------------------------ up / down


def node_manifest(index: int) -> str:
    name = f"kwok-node-{index}"
    return f"""apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations:
    {NODE_ANNOTATION}: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: {name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {{cpu: "32", memory: 256Gi, pods: "110", {GPU_RESOURCE}: "8"}}
  capacity: {{cpu: "32", memory: 256Gi, pods: "110", {GPU_RESOURCE}: "8"}}
"""


_TRAINING_OPERATOR_PREREQS = """apiVersion: v1
kind: Namespace
metadata: {name: kubeflow}
---
# The operator's certificate rotator needs this object to exist. It has no webhooks:
# there is no kube-proxy to route the apiserver to the operator, and the testbed only
# needs the controllers.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validator.training-operator.kubeflow.org}
webhooks: []
"""


TRAINING_OPERATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def _seed_training_operator_certs(kubeconfig: Path) -> None:
    """Pre-seed the operator's webhook secret and its cert dir (see pki.serving_bundle)."""
    bundle = pki.serving_bundle("training-operator.kubeflow.svc")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"},
        "data": {k: base64.b64encode(v).decode() for k, v in bundle.items()},
    }
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(secret))
    TRAINING_OPERATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name, data in bundle.items():
        # The directory is the machine's: testbeds started side by side (one per test worker)
        # each write it, and an operator starting meanwhile must never read half a file.
        replace_atomically(TRAINING_OPERATOR_CERT_DIR / name, data)


# JobSet's controller defaults and validates JobSets in its admission webhook (the controller
# relies on the defaults: a JobSet without them is never reconciled), so the webhook runs. Without
# kube-proxy no Service routes to it: the API server calls it at its loopback URL, trusting the
# testbed's CA. Only the JobSet webhooks are registered, not JobSet's pod webhooks: those serve
# exclusive placement only, and would put the controller in the path of every pod created.
_JOBSET_WEBHOOKS = """apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {{name: jobset-mutating-webhook-configuration}}
webhooks:
- name: mjobset.kb.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {{url: "{url}/mutate-jobset-x-k8s-io-v1alpha2-jobset", caBundle: {ca}}}
  rules:
  - {{apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], operations: [CREATE, UPDATE],
     resources: [jobsets]}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: jobset-validating-webhook-configuration}}
webhooks:
- name: vjobset.kb.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {{url: "{url}/validate-jobset-x-k8s-io-v1alpha2-jobset", caBundle: {ca}}}
  rules:
  - {{apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], operations: [CREATE, UPDATE],
     resources: [jobsets]}}
"""


def _jobset_config(state_dir: Path, p: pki.Pki, pp: dict[str, int]) -> Path:
    """JobSet's configuration file: loopback ports, no leader election, and no certificate
    rotation (it would want a Secret and a Service in its own namespace); its webhook and metrics
    servers use a certificate for 127.0.0.1 from the testbed's CA instead."""
    certs = state_dir / "jobset-certs"
    certs.mkdir(exist_ok=True)
    crt, key = pki.serving_cert(p, "jobset")
    shutil.copyfile(crt, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    config = state_dir / "jobset-config.yaml"
    config.write_text(
        f"""apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {{leaderElect: false}}
internalCertManagement: {{enable: false}}
health: {{healthProbeBindAddress: "127.0.0.1:{pp["jobset-probes"]}"}}
metrics: {{bindAddress: "127.0.0.1:{pp["jobset-metrics"]}", certDir: "{certs}"}}
webhook: {{host: 127.0.0.1, port: {pp["jobset-webhook"]}, certDir: "{certs}"}}
"""
    )
    return config


def _check_ports_free(requested: dict[str, int]) -> None:
    for name, port in requested.items():
        if ports.port_in_use(port):
            raise TestbedError(
                f"port {port} for {name} on 127.0.0.1 is in use; free it or omit the fixed port"
            )


def up(
    state_dir: Path = DEFAULT_STATE_DIR,
    *,
    nodes: int = 4,
    log: Log = _quiet,
    fixed_ports: dict[str, int] | None = None,
    start_timeout: float = 120.0,
    nats_tls: bool = False,
    real_node: bool = False,
) -> State:
    """Start the testbed (idempotent: a running testbed in ``state_dir`` is returned as is, with
    a real node added if ``real_node`` asks for one and it has none).

    With ``nats_tls`` nats-server requires TLS: its certificate (for 127.0.0.1 and localhost) is
    signed by the testbed's CA, which is ``State.nats_ca_file``, and its URL is ``tls://``.
    With ``real_node`` containerd and a kubelet run a node of this machine's own,
    ``realnode.NODE_NAME``, tainted ``realnode.TAINT`` (needs root).
    """
    if nodes < 1:
        raise TestbedError(f"--nodes must be at least 1 (got {nodes})")
    if real_node:
        realnode.preflight(state_dir)
    state_dir = state_dir.resolve()
    existing = State.load(state_dir)
    if existing is not None:
        alive = existing.running()
        if alive and all(alive.values()):
            if (existing.nats_ca_file is not None) != nats_tls:
                running_with = "with" if existing.nats_ca_file is not None else "without"
                raise TestbedError(
                    f"the testbed in {state_dir} runs NATS {running_with} TLS; "
                    f"run 'respawn local down --state-dir {state_dir}' first to start it "
                    f"{'with' if nats_tls else 'without'} --nats-tls"
                )
            log(f"testbed already running in {state_dir}")
            if real_node and existing.real_node is None:
                _add_real_node(existing, log)
            return existing
        log(
            f"stale testbed state in {state_dir} "
            f"({', '.join(k for k, v in alive.items() if not v)} down); restarting"
        )
        down(state_dir, log=log)

    fixed = dict(fixed_ports or {})
    _check_ports_free(fixed)
    bins = binaries.ensure(real_node=real_node)
    kubectl_binary()  # fail early with a clear message

    state_dir.mkdir(parents=True, exist_ok=True)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    log(f"generating PKI in {state_dir / 'pki'}")
    p = pki.generate(
        state_dir / "pki",
        clients={
            "admin": ("respawn-admin", ("system:masters",)),
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            "kube-scheduler": ("system:kube-scheduler", ()),
            "kwok": ("respawn-kwok", ("system:masters",)),
            # The API server's own, toward kubelets (logs, exec): a kubelet authorizes it by group.
            "apiserver-kubelet-client": ("respawn-apiserver-kubelet-client", ("system:masters",)),
        },
    )

    def port(name: str) -> int:
        return fixed.get(name) or ports.free_port()

    pp = {
        n: port(n)
        for n in (
            "etcd",
            "etcd-peer",
            "apiserver",
            "kcm",
            "scheduler",
            "kwok",
            "to-metrics",
            "to-probe",
            "to-webhook",
            "jobset-probes",
            "jobset-metrics",
            "jobset-webhook",
            "ray-operator-probes",
            "ray-operator-metrics",
        )
    }
    api_url = f"https://127.0.0.1:{pp['apiserver']}"
    kubeconfig = state_dir / "kubeconfig"
    kubeconfig.write_text(pki.kubeconfig(p, api_url, "admin"))
    kubeconfig.chmod(0o600)
    for comp in ("kube-controller-manager", "kube-scheduler", "kwok"):
        (state_dir / f"{comp}.kubeconfig").write_text(pki.kubeconfig(p, api_url, comp))

    state = State(
        state_dir=state_dir, kubeconfig=kubeconfig, nats_url="", api_url=api_url, ports=pp, nodes=nodes
    )
    procs: list[Proc] = []
    launch = _launcher(state, procs)

    try:
        node: realnode.RealNode | None = None
        if real_node:
            # Recorded first, so that `down` undoes even a half-started node; containerd and the
            # images need no API server, so they start while the control plane does.
            state.real_node = realnode.NODE_NAME
            state.save()
            node = realnode.RealNode(state_dir, launch, log)
            node.prepare()

        log("starting etcd")
        etcd = launch(
            "etcd",
            [
                str(bins.path("etcd")),
                "--name=n0",
                f"--data-dir={state_dir / 'etcd'}",
                "--unsafe-no-fsync",
                f"--listen-client-urls=http://127.0.0.1:{pp['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{pp['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{pp['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{pp['etcd-peer']}",
                f"--initial-cluster=n0=http://127.0.0.1:{pp['etcd-peer']}",
                "--auto-compaction-retention=1",
                "--log-level=warn",
            ],
        )
        wait_until(
            etcd, lambda: _http_ok(f"http://127.0.0.1:{pp['etcd']}/health"), timeout=30, what="healthy"
        )

        log("starting kube-apiserver")
        apiserver = launch(
            "kube-apiserver",
            [
                str(bins.path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{pp['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={pp['apiserver']}",
                f"--tls-cert-file={p.apiserver_crt}",
                f"--tls-private-key-file={p.apiserver_key}",
                f"--client-ca-file={p.ca_crt}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                # Loopback addresses are not valid Endpoints, so the "kubernetes" Service
                # endpoint reconciler has nothing useful to do here.
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                "--profiling=false",
                # Toward a kubelet (a real node's: logs, exec), as the client the kubelet trusts,
                # at the address the kubelet registered (its node name resolves nowhere).
                f"--kubelet-client-certificate={p.client('apiserver-kubelet-client')[0]}",
                f"--kubelet-client-key={p.client('apiserver-kubelet-client')[1]}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # To a webhook (Respawn's, deployed on a real node) at its Service's endpoints,
                # not at its cluster IP: without kube-proxy nothing routes a cluster IP.
                "--enable-aggregator-routing=true",
                # A namespace may send its pods to a node and give them tolerations (annotations
                # read by these two plugins): the real node takes Respawn's namespace so.
                "--enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
                "--v=0",
                *_audit_args(state_dir),
            ],
        )
        admin_ctx = _client_ctx(p, "admin")
        wait_until(
            apiserver, lambda: _http_ok(f"{api_url}/readyz", admin_ctx), timeout=start_timeout, what="ready"
        )
        if node is not None:
            node.start_kubelet(api_url, p)

        log("starting kube-controller-manager, kube-scheduler and kwok")
        kcm = launch(
            "kube-controller-manager",
            [
                str(bins.path("kube-controller-manager")),
                f"--kubeconfig={state_dir / 'kube-controller-manager.kubeconfig'}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={pp['kcm']}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                f"--service-account-private-key-file={p.sa_key}",
                f"--root-ca-file={p.ca_crt}",
                "--use-service-account-credentials=true",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-gc-syncs=50",
                "--concurrent-job-syncs=20",
                "--v=0",
            ],
        )
        sched = launch(
            "kube-scheduler",
            [
                str(bins.path("kube-scheduler")),
                f"--kubeconfig={state_dir / 'kube-scheduler.kubeconfig'}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={pp['scheduler']}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=0",
            ],
        )
        kwok = launch(
            "kwok",
            [
                str(bins.path("kwok")),
                f"--kubeconfig={state_dir / 'kwok.kubeconfig'}",
                f"--config={ASSETS / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.240.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{pp['kwok']}",
            ],
        )
        from respawn.testbed.nats import start_nats

        log(f"starting nats-server (JetStream{', TLS required' if nats_tls else ''})")
        nats = start_nats(
            state_dir / "nats",
            port=fixed.get("nats"),
            log_file=logs / "nats-server.log",
            tls=pki.serving_cert(p, "nats") if nats_tls else None,
        )
        state.pids["nats-server"] = nats.pid
        state.nats_url = nats.url
        state.nats_ca_file = p.ca_crt if nats_tls else None
        state.ports["nats"] = nats.port
        state.save()
        (state_dir / "nats.url").write_text(nats.url + "\n")

        wait_until(
            kcm,
            lambda: _http_ok(f"https://127.0.0.1:{pp['kcm']}/healthz", _INSECURE),
            timeout=60,
            what="healthy",
        )
        wait_until(
            sched,
            lambda: _http_ok(f"https://127.0.0.1:{pp['scheduler']}/healthz", _INSECURE),
            timeout=60,
            what="healthy",
        )
        wait_until(
            kwok, lambda: _http_ok(f"http://127.0.0.1:{pp['kwok']}/healthz"), timeout=60, what="healthy"
        )

        log(f"creating {nodes} fake nodes with {GPU_RESOURCE}: 8 each")
        kubectl(kubeconfig, "apply", "-f", "-", stdin="---\n".join(node_manifest(i) for i in range(nodes)))
        log("installing the PyTorchJob, PodGroup, JobSet, RayCluster, RayJob and RayService CRDs")
        # One call for all: each kubectl start costs a few hundred milliseconds.
        kubectl(kubeconfig, "apply", "--server-side", *(f"--filename={crd}" for crd in bins.crds))
        kubectl(kubeconfig, "apply", "-f", "-", stdin=_TRAINING_OPERATOR_PREREQS)
        _seed_training_operator_certs(kubeconfig)
        kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")

        log("starting the Kubeflow training operator")
        training = launch(
            "training-operator",
            [
                str(bins.path("training-operator")),
                "--enable-scheme=pytorchjob",
                f"--metrics-bind-address=127.0.0.1:{pp['to-metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{pp['to-probe']}",
                f"--webhook-server-port={pp['to-webhook']}",
                "--leader-elect=false",
            ],
            env={**os.environ, "KUBECONFIG": str(kubeconfig), "MY_POD_NAMESPACE": "kubeflow"},
        )
        log("starting the JobSet controller and the KubeRay operator")
        jobset = launch(
            "jobset",
            [
                str(bins.path("jobset")),
                f"--config={_jobset_config(state_dir, p, pp)}",
                "--zap-log-level=info",
            ],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
        ray = launch(
            "ray-operator",
            [
                str(bins.path("ray-operator")),
                f"--metrics-addr=127.0.0.1:{pp['ray-operator-metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{pp['ray-operator-probes']}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )

        def nodes_ready() -> bool:
            ready, total = node_readiness(kubeconfig, selector=KWOK_NODES)
            return total >= nodes and ready == total

        wait_until(kwok, nodes_ready, timeout=60, what="reporting all nodes Ready", interval=0.3)

        def default_sa() -> bool:
            return (
                kubectl(
                    kubeconfig, "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            )

        wait_until(kcm, default_sa, timeout=60, what="creating the default ServiceAccount", interval=0.3)
        wait_until(
            training,
            lambda: _http_ok(f"http://127.0.0.1:{pp['to-probe']}/readyz"),
            timeout=90,
            what="ready",
            interval=0.3,
        )
        for proc, url in (
            (jobset, f"http://127.0.0.1:{pp['jobset-probes']}/readyz"),
            (ray, f"http://127.0.0.1:{pp['ray-operator-probes']}/readyz"),
        ):
            wait_until(proc, partial(_http_ok, url), timeout=90, what="ready", interval=0.3)
        kubectl(
            kubeconfig,
            "apply",
            "-f",
            "-",
            stdin=_JOBSET_WEBHOOKS.format(
                url=f"https://127.0.0.1:{pp['jobset-webhook']}",
                ca=base64.b64encode(p.ca_crt.read_bytes()).decode(),
            ),
        )
        if node is not None:
            node.wait_ready(kubeconfig)
        for proc in procs:
            if not proc.alive():
                raise TestbedError(f"{proc.name} exited during start-up; last log lines: {tail(proc.log)}")
        log(f"testbed ready: kubeconfig {kubeconfig}, NATS {state.nats_url}")
        return state
    except BaseException:
        # Leave nothing behind: stop everything that was started, keep the logs for a look.
        down(state_dir, keep_logs=True)
        raise


def _launcher(state: State, procs: list[Proc]) -> Callable[..., Proc]:
    """``launch(name, argv, env=None)``: start a process of the testbed, its log in ``DIR/logs``."""

    def launch(name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        proc = start(name, argv, state.state_dir / "logs" / f"{name}.log", env=env)
        procs.append(proc)
        state.pids[name] = proc.pid
        state.save()  # record every pid at once so `down` can clean up even a half-started testbed
        return proc

    return launch


def _add_real_node(state: State, log: Log) -> None:
    """A real node for a testbed that runs without one; stopped again if it does not come up."""
    procs: list[Proc] = []
    state.real_node = realnode.NODE_NAME
    state.save()
    node = realnode.RealNode(state.state_dir, _launcher(state, procs), log)
    try:
        node.prepare()
        node.start_kubelet(state.api_url, pki.Pki(state.state_dir / "pki"))
        node.wait_ready(state.kubeconfig)
    except BaseException:
        realnode.stop(state.state_dir, state.pids, log)
        for name in ("kubelet", "containerd", "cluster-dns"):
            state.pids.pop(name, None)
        state.real_node = None
        state.save()
        raise


def down(state_dir: Path = DEFAULT_STATE_DIR, *, log: Log = _quiet, keep_logs: bool = False) -> bool:
    """Stop everything recorded in ``state_dir`` and remove the state. True if anything was running.

    A real node's mounts that cannot be unmounted keep the state directory in place (removing
    it would reach through them): that is a ``TestbedError`` naming them, after all else stopped.
    """
    state_dir = state_dir.resolve()
    state = State.load(state_dir)
    found = state is not None and any(pid_alive(pid) for pid in state.pids.values())
    # The real node first: its pods are stopped through containerd, which must still run then.
    stuck = realnode.stop(state_dir, state.pids if state else {}, log)
    if state is not None:
        # Stop in reverse start order so controllers do not log storms about a vanished apiserver.
        for name, pid in reversed(list(state.pids.items())):
            if pid_alive(pid):
                log(f"stopping {name} (pid {pid})")
            stop_pid(pid)
    if stuck:
        raise TestbedError(
            f"still mounted under {state_dir} after stopping the real node: {', '.join(stuck)}; "
            f"unmount them (umount -l PATH) and run 'respawn local down --state-dir {state_dir}' again"
        )
    if state_dir.exists():
        if keep_logs and (state_dir / "logs").exists():
            for child in state_dir.iterdir():
                if child.name != "logs":
                    if child.is_dir():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            child.unlink()
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
    return found


# kwok's nodes (their label in ``node_manifest``).
KWOK_NODES = "type=kwok"


def node_readiness(kubeconfig: Path, *, selector: str = "") -> tuple[int, int]:
    """(Ready nodes, all nodes), of those matching the label ``selector`` if given, as the API
    server reports them; (0, 0) while it cannot answer."""
    out = kubectl(
        kubeconfig,
        "get",
        "nodes",
        *(["-l", selector] if selector else []),
        "-o",
        'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
        check=False,
    ).stdout.split()
    return sum(1 for s in out if s == "True"), len(out)


def wait_for(
    check: Callable[[], bool], *, timeout: float, interval: float = 0.2, what: str = "condition"
) -> None:
    """Poll ``check`` until true or raise ``TimeoutError`` naming ``what`` (used by tests and the demo)."""
    until_sync(what, check, within=timeout, every=interval)


AUDIT_ENV = "RESPAWN_TESTBED_AUDIT_DELETES"

# Who deleted a pod or a wrapped object, when something deletes what it should not (e.g. a
# recreated workload's fresh pods). Metadata level: user, verb, object and time only.
_AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [delete, deletecollection]
- level: None
"""


def _audit_args(state_dir: Path) -> list[str]:
    """API server flags for an audit log of every delete, when ``RESPAWN_TESTBED_AUDIT_DELETES``
    is set (``logs/audit.log`` in the state directory); none otherwise, as the log costs I/O."""
    if os.environ.get(AUDIT_ENV, "") in ("", "0", "false"):
        return []
    policy = state_dir / "audit-policy.yaml"
    policy.write_text(_AUDIT_POLICY)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={state_dir / 'logs' / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-maxsize=200",
    ]
