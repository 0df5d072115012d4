"""A real node in the local testbed: containerd and a kubelet on this machine, beside kwok's nodes.

`respawn local up --real-node` (as root) runs a containerd of the testbed's own (config, root, state
and socket under ``DIR/node/``), imports the pause, busybox, Respawn and NATS images into it, and
runs the pinned kubelet against it, registered with the testbed's API server as ``respawn-node-0``
with a client certificate of the testbed's CA for ``system:node:respawn-node-0`` (no bootstrap
token, no certificate signing request). Its pods get their network from Debian's CNI plugins: a
bridge of the testbed's own with ``host-local`` addresses (docs/deploy.md, "Real node in the local
testbed"). The node carries the taint ``respawn.dev/real-node=true:NoSchedule``, so that only pods
tolerating it land there and bulk workloads stay on kwok's nodes.

It also gives pods what a cluster gives them, so that Respawn's manifests run as they are
(docs/deploy.md, "Cluster network"): the `kubernetes` Service's address (one iptables rule to the
API server), cluster DNS (``respawn.testbed.clusterdns``), volumes for the NATS servers' claims,
and Respawn's namespace placed on this node (PodNodeSelector, PodTolerationRestriction).

Outside ``DIR`` it changes only what ``DIR/node/host.json`` records before the change (or what leads
into ``DIR``), and ``stop`` undoes all of it: the bridge, the iptables chain, the pods' cgroups
(under a root of the testbed's own), the kernel settings the kubelet sets when it starts, the
kubelet's links to its containers' logs and the directories of compiled-in paths made on the way.
``stop`` also stops every pod through the CRI (which releases the pods' network namespaces), and
unmounts whatever is still mounted under ``DIR`` (the pods' volumes, the containers' root
filesystems).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed import binaries, pki
from respawn.testbed.errors import TestbedError
from respawn.testbed.files import replace_atomically
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, pid_alive, start, stop_pid, tail, wait_until
from respawn.waiting import eventually

NODE_NAME = "respawn-node-0"
# Pods land on the real node only if they tolerate this; kwok's nodes carry no taint.
TAINT_KEY = "respawn.dev/real-node"
TAINT = f"{TAINT_KEY}=true:NoSchedule"
NODE_LABEL = f"{TAINT_KEY}=true"
# Debian's containernetworking-plugins.
CNI_BIN_DIR = Path("/usr/lib/cni")
DNS_DOMAIN = "cluster.local"
# The `kubernetes` Service's cluster IP (the first of the API server's --service-cluster-ip-range),
# which the kubelet gives every pod as KUBERNETES_SERVICE_HOST.
KUBERNETES_SERVICE_IP = "10.0.0.1"
# Respawn's namespace: its pods go to this node (PodNodeSelector, PodTolerationRestriction).
RESPAWN_NAMESPACE = "respawn-system"
# The claims of the NATS StatefulSet's servers (volumeClaimTemplate "data", three servers).
NATS_CLAIMS = tuple(f"data-respawn-nats-{i}" for i in range(3))
NATS_UID = 1000
# The kernel settings the kubelet sets at start (its setupKernelTunables), put back at stop.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Directories outside DIR whose paths are compiled into the kubelet (its links to the containers'
# logs), the CNI library (its cache of results) and containerd (network namespaces, shims'
# sockets), made when missing: `stop` removes those `up` did not find, once they are empty.
# Children before their parents.
MACHINE_DIRS = (
    Path("/var/log/containers"),
    Path("/var/lib/cni/results"),
    Path("/var/lib/cni"),
    Path("/run/netns"),
    Path("/run/containerd/s"),
    Path("/run/containerd"),
)
CONTAINER_LOG_LINKS = MACHINE_DIRS[0]
# The images a node needs itself (the pod sandbox) and the one its first workloads run;
# directories of tools/images/build.sh's cache, each with image.tar and name.
# The pause image, busybox for workloads, and Respawn's and NATS's images, so that Respawn's
# manifests (dist/install.yaml, `respawn local deploy`) run on the node without a registry.
NODE_IMAGES = ("pause", "busybox", "respawn", "respawn-nats")
IMAGES_SCRIPT = binaries.REPO_ROOT / "tools" / "images" / "build.sh"
# The longest path of a unix socket (sun_path less its terminating NUL).
_MAX_SOCKET_PATH = 107
# The longest socket path under the state directory: the kubelet's device-plugin socket
# (containerd's, ``node/containerd.sock.ttrpc``, is shorter). A longer path fails at bind(2)
# as "invalid argument" deep in the kubelet's log, so it is refused before anything starts.
_LONGEST_SOCKET = "/node/kubelet/device-plugins/kubelet.sock"
_MAX_STATE_DIR = _MAX_SOCKET_PATH - len(_LONGEST_SOCKET)

Log = Callable[[str], None]
Launch = Callable[..., Proc]


@dataclass(frozen=True)
class Layout:
    """Where everything of the real node lives, and the names it takes on this machine."""

    state_dir: Path

    @property
    def dir(self) -> Path:
        return self.state_dir / "node"

    @property
    def ident(self) -> str:
        # The machine-wide names (bridge, cgroup root, subnet) differ between state directories,
        # so two testbeds' nodes do not share them.
        return hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:8]

    @property
    def bridge(self) -> str:
        return f"rsp{self.ident}"  # at most 15 characters, as the kernel allows

    @property
    def subnet_prefix(self) -> str:
        return f"10.88.{int(self.ident[:2], 16)}"

    @property
    def node_ip(self) -> str:
        return f"{self.subnet_prefix}.1"

    @property
    def chain(self) -> str:
        # An iptables chain of this node's own (at most 28 characters).
        return f"RSP-{self.ident}"

    @property
    def volumes(self) -> Path:
        return self.dir / "volumes"

    @property
    def cgroup_root(self) -> str:
        return f"/respawn-{self.ident}"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def host_file(self) -> Path:
        return self.dir / "host.json"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"


def _say_nothing(_: str) -> None:
    pass


# ------------------------------------------------------------------ what the node needs


def preflight(state_dir: Path) -> None:
    """What rules a real node out before anything starts: not root, a state directory too long."""
    if os.geteuid() != 0:
        raise TestbedError("--real-node needs root (containerd and the kubelet run as root); rerun as root")
    layout = Layout(state_dir.resolve())
    if len(str(layout.state_dir)) > _MAX_STATE_DIR:
        raise TestbedError(
            f"the state directory {layout.state_dir} is too long for the sockets of containerd and "
            f"the kubelet (at most {_MAX_STATE_DIR} characters); choose a shorter --state-dir"
        )


def ensure_packages(log: Log) -> None:
    """containerd, runc and the CNI plugins from Debian's packages, installed if missing."""
    wanted = {
        "containerd": shutil.which("containerd") is not None and shutil.which("ctr") is not None,
        "runc": shutil.which("runc") is not None,
        "containernetworking-plugins": all(
            os.access(CNI_BIN_DIR / p, os.X_OK) for p in ("bridge", "host-local", "loopback")
        ),
    }
    missing = [name for name, present in wanted.items() if not present]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise TestbedError(
            f"--real-node needs the packages {', '.join(missing)} and there is no apt-get; "
            "install them and retry"
        )
    log(f"installing {', '.join(missing)} from Debian's packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise TestbedError(
                f"{' '.join(argv[:2])} of {', '.join(missing)} failed (exit {proc.returncode}): "
                f"{tail_text(proc.stderr or proc.stdout)}; install them by hand and retry"
            )


def tail_text(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip()[:300] for line in text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class BuiltImage:
    """One line of tools/images/build.sh's output: ``NAME sha256:DIGEST SIZE MB cached|built ARCHIVE``."""

    name: str
    digest: str
    archive: Path


def parse_build_output(text: str) -> dict[str, BuiltImage]:
    """The images on build.sh's stdout, by short name (``respawn``, ``respawn-nats``, ...)."""
    images: dict[str, BuiltImage] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or not fields[1].startswith("sha256:"):
            continue
        name = fields[0]
        short = name.rsplit("/", 1)[-1].split(":", 1)[0]
        images[short] = BuiltImage(name=name, digest=fields[1], archive=Path(fields[5]))
    return images


def build_images(log: Log = _say_nothing) -> dict[str, BuiltImage]:
    """The current images, by short name: tools/images/build.sh builds what is missing or whose
    sources changed (seconds when all is cached) and names every one."""
    log("building the images if needed (tools/images/build.sh)")
    proc = subprocess.run(
        ["bash", str(IMAGES_SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "VENV": str(binaries.nats_server_path().parent.parent)},
        check=False,
    )
    if proc.returncode != 0:
        raise TestbedError(
            f"tools/images/build.sh failed (exit {proc.returncode}): {tail_text(proc.stderr)}; "
            "fix it and run 'make images'"
        )
    images = parse_build_output(proc.stdout)
    missing = [want for want in NODE_IMAGES if want not in images]
    if missing:
        raise TestbedError(f"tools/images/build.sh printed no {', '.join(missing)} image: {proc.stdout!r}")
    return images


def node_images(log: Log) -> list[BuiltImage]:
    """The images the node imports: what the kubelet needs, busybox, and Respawn's own two."""
    images = build_images(log)
    return [images[want] for want in NODE_IMAGES]


# ------------------------------------------------------------------ the machine's side


def _run(argv: Sequence[str], *, what: str, fix: str, timeout: float = 60) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise TestbedError(f"{what} failed: {tail_text(proc.stderr or proc.stdout)}; {fix}")
    return proc.stdout


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def _read_sysctls() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = _sysctl_path(name).read_text().strip()
    return out


def _record_host(layout: Layout) -> None:
    """What is about to change outside DIR, written before it changes (``stop`` reads it)."""
    layout.dir.mkdir(parents=True, exist_ok=True)
    record = {
        "bridge": layout.bridge,
        "iptablesChain": layout.chain,
        "cgroupRoot": layout.cgroup_root,
        "sysctls": _read_sysctls(),
        "madeDirs": [str(d) for d in MACHINE_DIRS if not d.exists()],
    }
    replace_atomically(layout.host_file, json.dumps(record, indent=2))


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _make_bridge(layout: Layout) -> None:
    """The pods' bridge, with the node's address on it: the kubelet registers that address, the
    API server reaches the kubelet there, and the pods reach this machine through it."""
    subnet = f"{layout.subnet_prefix}.0/24"
    if not _link_exists(layout.bridge):
        used = _run(
            ["ip", "-o", "-4", "addr", "show", "to", subnet],
            what=f"ip addr show to {subnet}",
            fix="check that iproute2 is installed",
        ).strip()
        if used:
            raise TestbedError(
                f"the real node's subnet {subnet} is in use on this machine ({used.split()[1]}); "
                "choose another --state-dir (the subnet follows from it)"
            )
        fix = "check that this machine allows bridges (root, CAP_NET_ADMIN)"
        _run(["ip", "link", "add", "name", layout.bridge, "type", "bridge"], what="ip link add", fix=fix)
    addresses = _run(
        ["ip", "-o", "-4", "addr", "show", "dev", layout.bridge], what="ip addr show", fix="check iproute2"
    )
    if f" {layout.node_ip}/" not in addresses:  # a bridge left by a node that did not start has it
        _run(
            ["ip", "addr", "add", f"{layout.node_ip}/24", "dev", layout.bridge],
            what=f"ip addr add {layout.node_ip}/24 dev {layout.bridge}",
            fix="check that this machine allows it (root, CAP_NET_ADMIN)",
        )
    _run(["ip", "link", "set", layout.bridge, "up"], what="ip link set up", fix="check iproute2")


def _iptables(*args: str, check: bool = True) -> bool:
    proc = subprocess.run(
        ["iptables", "-w", "5", "-t", "nat", *args], capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        raise TestbedError(
            f"iptables -t nat {' '.join(args)} failed: {tail_text(proc.stderr)}; "
            "check that this machine allows iptables (root, CAP_NET_ADMIN)"
        )
    return proc.returncode == 0


def route_api(layout: Layout, api_port: int) -> None:
    """Pods reach the API server at the `kubernetes` Service's address, as in a cluster: one DNAT
    rule, in a chain of this node's own, from that address (port 443) to the API server on
    127.0.0.1 for packets coming from the node's bridge. Loopback is a legal destination for those
    packets only with ``route_localnet`` on the bridge (a setting that goes with the bridge)."""
    chain = layout.chain
    if not _iptables("-L", chain, "-n", check=False):
        _iptables("-N", chain)
    _iptables("-F", chain)
    _iptables(
        "-A", chain, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}",
    )  # fmt: skip
    jump = ("PREROUTING", "-i", layout.bridge, "-j", chain)
    if not _iptables("-C", *jump, check=False):
        _iptables("-A", *jump)
    Path(f"/proc/sys/net/ipv4/conf/{layout.bridge}/route_localnet").write_text("1")


def _unroute_api(chain: str, bridge: str) -> None:
    while _iptables("-D", "PREROUTING", "-i", bridge, "-j", chain, check=False):
        pass
    if _iptables("-F", chain, check=False):
        _iptables("-X", chain, check=False)


def cluster_manifests(layout: Layout) -> list[dict[str, object]]:
    """What the node provides to Respawn's manifests as a cluster would: its namespace, whose
    pods the API server sends to this node, and a volume for each NATS server, with its claim
    already bound to it."""
    toleration = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    docs: list[dict[str, object]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": RESPAWN_NAMESPACE,
                "annotations": {
                    # Read by the API server's PodNodeSelector and PodTolerationRestriction
                    # admission plugins, on every pod created in the namespace.
                    "scheduler.alpha.kubernetes.io/node-selector": NODE_LABEL,
                    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(toleration),
                },
            },
        }
    ]
    for i, claim in enumerate(NATS_CLAIMS):
        volume = nats_volume(i)
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "volumeMode": "Filesystem",
                    "claimRef": {"namespace": RESPAWN_NAMESPACE, "name": claim},
                    "local": {"path": str(layout.volumes / f"nats-{i}")},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [NODE_NAME],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
        # The claim the StatefulSet would make, made first and naming its volume, so that it
        # is Bound before the NATS pod exists. Left to the StatefulSet, the pod meets its claim
        # unbound and the scheduler sets it aside until something requeues it; a NATS pod has
        # stayed Pending that way through all of `deploy`'s five-minute wait.
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim,
                    "namespace": RESPAWN_NAMESPACE,
                    # The labels of deploy/nats/statefulset.yaml's volumeClaimTemplate.
                    "labels": {"app.kubernetes.io/name": "respawn", "app.kubernetes.io/component": "nats"},
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "",
                    "volumeMode": "Filesystem",
                    "volumeName": volume,
                },
            }
        )
    return docs


def nats_volume(i: int) -> str:
    """The name of the PersistentVolume kept for the NATS server of ordinal ``i``."""
    return f"respawn-testbed-nats-{i}"


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, and the unified one of a hybrid setup)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                out.append(Path(unescape_mount_path(fields[4])))
    return out


def _make_cgroup_root(layout: Layout) -> None:
    """The kubelet refuses a cgroup root that does not exist; it is made in every hierarchy."""
    for hierarchy in cgroup_hierarchies():
        (hierarchy / layout.cgroup_root.lstrip("/")).mkdir(exist_ok=True)


# ------------------------------------------------------------------ configuration files


def containerd_config_text(layout: Layout, pause: str) -> str:
    d = layout.dir
    return f"""version = 2
root = "{d / "containerd" / "root"}"
state = "{d / "containerd" / "state"}"
# The snapshotters this machine cannot use would only log their failure at every start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{layout.socket}"
[ttrpc]
  address = "{layout.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "containerd" / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  # The pause image tools/images/build.sh builds under the name the kubelet expects.
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # A pod's sandbox asks for an OOM score of -998 and a Guaranteed pod's containers for -997,
  # which needs CAP_SYS_RESOURCE: where root lacks it (some VMs and containers), runc fails
  # every sandbox. Scores are kept at containerd's own or above, with or without it.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # The kubelet's cgroup driver (cgroupfs), and runc's state in DIR too.
        SystemdCgroup = false
        Root = "{d / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d / "cni"}"
    max_conf_num = 1
"""


def cni_config_text(layout: Layout) -> str:
    # The bridge is not the pods' gateway in the plugin's sense (isGateway: false), so the plugin
    # neither turns on IP forwarding nor touches iptables: the bridge's address (set by `up`) is
    # the default route, which reaches this machine and nothing beyond it.
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "respawn",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": layout.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [
                                {
                                    "subnet": f"{layout.subnet_prefix}.0/24",
                                    "rangeStart": f"{layout.subnet_prefix}.10",
                                    "gateway": layout.node_ip,
                                }
                            ]
                        ],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(layout.dir / "cni-ipam"),
                    },
                }
            ],
        },
        indent=2,
    )


def kubelet_config_text(layout: Layout, p: pki.Pki, *, port: int, healthz_port: int) -> str:
    serving_crt, serving_key = p.dir / "kubelet.crt", p.dir / "kubelet.key"
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {layout.node_ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
tlsCertFile: {serving_crt}
tlsPrivateKeyFile: {serving_key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {p.ca_crt}}}
authorization: {{mode: Webhook}}
containerRuntimeEndpoint: unix://{layout.socket}
imageServiceEndpoint: unix://{layout.socket}
cgroupDriver: cgroupfs
cgroupRoot: {layout.cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
# No iptables chains of the kubelet's on this machine: nothing here reads them.
makeIPTablesUtilChains: false
podLogsDir: {layout.dir / "pod-logs"}
# A full disk must not evict the testbed's pods nor delete its imported images: images come
# from archives, not from a registry, and would not come back.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
# The testbed's cluster DNS (respawn.testbed.clusterdns) answers on the node's address.
clusterDNS: [{layout.node_ip}]
clusterDomain: {DNS_DOMAIN}
registerWithTaints:
- {{key: {TAINT_KEY}, value: "true", effect: NoSchedule}}
# Ready within seconds of the runtime being ready, instead of the default 10 s.
nodeStatusUpdateFrequency: 2s
"""


# ------------------------------------------------------------------ start


class RealNode:
    """Starting the real node in steps, so that `up` can overlap them with the control plane's."""

    def __init__(self, state_dir: Path, launch: Launch, log: Log = _say_nothing) -> None:
        self.layout = Layout(state_dir)
        self.launch = launch
        self.log = log
        self.containerd: Proc | None = None
        self.kubelet: Proc | None = None
        self.dns: Proc | None = None
        self._imports: threading.Thread | None = None
        self._import_error: str | None = None

    def prepare(self) -> None:
        """Everything that needs no API server: packages, images, bridge, cgroups, containerd,
        and the image imports (in the background)."""
        layout = self.layout
        preflight(layout.state_dir)
        ensure_packages(self.log)
        binaries.ensure(real_node=True)
        images = node_images(self.log)
        pause = next(i.name for i in images if "/pause:" in i.name)
        layout.dir.mkdir(parents=True, exist_ok=True)
        _record_host(layout)
        _make_bridge(layout)
        _make_cgroup_root(layout)
        (layout.dir / "cni").mkdir(exist_ok=True)
        (layout.dir / "cni" / "10-respawn.conflist").write_text(cni_config_text(layout))
        layout.containerd_config.write_text(containerd_config_text(layout, pause))

        self.log(f"starting containerd ({layout.socket})")
        self.containerd = self.launch("containerd", ["containerd", "--config", str(layout.containerd_config)])
        wait_until(self.containerd, lambda: _socket_answers(layout.socket), timeout=30, what="serving")
        self._imports = threading.Thread(target=self._import, args=(images,), daemon=True)
        self._imports.start()

    def _import(self, images: list[BuiltImage]) -> None:
        try:
            import_archives(self.layout.state_dir, [image.archive for image in images])
        except (TestbedError, subprocess.TimeoutExpired) as exc:
            self._import_error = str(exc)

    def start_kubelet(self, api_url: str, p: pki.Pki) -> None:
        """The kubelet, with a client certificate for its node and a serving certificate of the CA."""
        layout = self.layout
        pki.client_cert(p, "kubelet-client", f"system:node:{NODE_NAME}", ("system:nodes",))
        pki.serving_cert(p, "kubelet", dns_names=(NODE_NAME, "localhost"), ips=(layout.node_ip, "127.0.0.1"))
        kubeconfig = layout.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(pki.kubeconfig(p, api_url, "kubelet-client", user=f"system:node:{NODE_NAME}"))
        config = layout.dir / "kubelet.yaml"
        # Free ports, not the usual 10250 and 10248: another kubelet may run on this machine.
        config.write_text(kubelet_config_text(layout, p, port=free_port(), healthz_port=free_port()))
        self.log(f"starting the kubelet (node {NODE_NAME})")
        bins = binaries.ensure(real_node=True)
        self.kubelet = self.launch(
            "kubelet",
            [
                str(bins.path("kubelet")),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={layout.node_ip}",
                f"--root-dir={layout.kubelet_root}",
                f"--node-labels={NODE_LABEL}",
                "--v=0",
            ],
        )
        # The cluster network Respawn's manifests expect: the `kubernetes` Service's address
        # and cluster DNS (respawn.testbed.clusterdns), both answered on this machine.
        route_api(layout, int(api_url.rstrip("/").rsplit(":", 1)[1]))
        admin_crt, admin_key = p.client("admin")
        self.dns = self.launch(
            "cluster-dns",
            [
                sys.executable, "-m", "respawn.testbed.clusterdns", "--address", layout.node_ip,
                "--api-url", api_url, "--ca", str(p.ca_crt),
                "--cert", str(admin_crt), "--key", str(admin_key),
            ],
        )  # fmt: skip

    def wait_ready(self, kubeconfig: Path, *, timeout: float = 120) -> None:
        """Until the images are imported and the node is Ready and takes pods; a dead kubelet or
        containerd fails it."""
        if self._imports is not None:
            self._imports.join(timeout)
            if self._imports.is_alive():
                raise TestbedError(
                    f"importing the node's images took over {timeout:.0f}s; "
                    f"see {self.layout.state_dir / 'logs' / 'containerd.log'}"
                )
            if self._import_error:
                raise TestbedError(self._import_error)
        assert self.kubelet is not None and self.containerd is not None
        containerd = self.containerd

        def ready() -> bool:
            if not containerd.alive():
                raise TestbedError(
                    f"containerd exited while the node started; last log lines ({containerd.log}): "
                    f"{tail(containerd.log)}"
                )
            return node_ready(kubeconfig, schedulable=True) is True

        # Ready is not enough: until the node controller lifts its not-ready taint (it looks every
        # 5 s), the scheduler places no pod there.
        wait_until(
            self.kubelet,
            ready,
            timeout=timeout,
            what=f"running node {NODE_NAME} Ready for pods",
            interval=0.2,
        )
        self.log(f"node {NODE_NAME} Ready")
        self.provide(kubeconfig)

    def provide(self, kubeconfig: Path) -> None:
        provide(self.layout, kubeconfig)


def provide(layout: Layout, kubeconfig: Path) -> None:
    """Respawn's namespace (its pods sent to this node) and the NATS servers' volumes."""
    for i in range(len(NATS_CLAIMS)):
        volume = layout.volumes / f"nats-{i}"
        volume.mkdir(parents=True, exist_ok=True)
        os.chown(volume, NATS_UID, NATS_UID)
    text = "".join("---\n" + json.dumps(d) + "\n" for d in cluster_manifests(layout))
    from respawn.testbed.cluster import kubectl  # the cluster module imports this one

    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=respawn-testbed", "-f", "-", stdin=text)


def import_archives(state_dir: Path, archives: Sequence[Path], *, timeout: float = 300) -> None:
    """Import docker-archives into the running node's containerd, where its kubelet finds them."""
    layout = Layout(state_dir.resolve())
    for archive in archives:
        _run(
            [*_ctr(layout), "images", "import", str(archive)],
            what=f"ctr images import {archive}",
            fix=f"see {layout.state_dir / 'logs' / 'containerd.log'}",
            timeout=timeout,
        )


def tag_image(state_dir: Path, source: str, target: str) -> None:
    """Give an imported image a second name (a new tag without a registry: a rollout to it)."""
    layout = Layout(state_dir.resolve())
    _run(
        [*_ctr(layout), "images", "tag", "--force", source, target],
        what=f"ctr images tag {source} {target}",
        fix=f"see {layout.state_dir / 'logs' / 'containerd.log'}",
    )


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(str(path)) == 0


def _ctr(layout: Layout) -> list[str]:
    return ["ctr", "--address", str(layout.socket), "--namespace", "k8s.io"]


def node_ready(kubeconfig: Path, *, schedulable: bool = False) -> bool | None:
    """Whether the real node is Ready (with ``schedulable``: and rid of the taints the node
    controller keeps on a node until it has seen it Ready, ``node.kubernetes.io/not-ready`` and
    the like); None when the API server does not know it (or cannot answer)."""
    from respawn.testbed.cluster import kubectl

    proc = kubectl(
        kubeconfig,
        "get",
        "node",
        NODE_NAME,
        "-o",
        'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}',
        check=False,
        timeout=10,
    )
    if proc.returncode != 0:
        return None
    ready, *taints = proc.stdout.split()
    return ready == "True" and not (schedulable and any(t.startswith("node.kubernetes.io/") for t in taints))


# ------------------------------------------------------------------ stop


def stop(state_dir: Path, pids: dict[str, int], log: Log = _say_nothing) -> list[str]:
    """Stop the real node of the testbed in ``state_dir`` and undo what it changed on this machine.

    Returns the mount points under ``state_dir`` that could not be unmounted (nothing may be
    removed below those). Every step is safe on a node that was only partly started.
    """
    layout = Layout(state_dir.resolve())
    try:
        host = json.loads(layout.host_file.read_text())
    except (OSError, json.JSONDecodeError):
        host = None
    if host is None and not layout.dir.exists():
        return []

    if pid := pids.get("cluster-dns"):
        stop_pid(pid)
    if pid := pids.get("kubelet"):
        if pid_alive(pid):
            log(f"stopping kubelet (pid {pid})")
        # First, so that it starts no pod again while they are being removed.
        stop_pid(pid)
    _remove_pods(layout, pids.get("containerd"), log)
    if pid := pids.get("containerd"):
        if pid_alive(pid):
            log(f"stopping containerd (pid {pid})")
        stop_pid(pid)
    # What the CRI could not stop: shims of this containerd, then whatever runs in the pods' cgroups.
    _kill_shims(layout)
    _kill_cgroups(host["cgroupRoot"] if host else layout.cgroup_root)
    left = unmount_below(state_dir.resolve())
    _remove_cgroups(host["cgroupRoot"] if host else layout.cgroup_root)
    bridge = host["bridge"] if host else layout.bridge
    if shutil.which("iptables") is not None:
        _unroute_api(host.get("iptablesChain", layout.chain) if host else layout.chain, bridge)
    if _link_exists(bridge):
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
    _remove_log_links(state_dir.resolve())
    if host:
        _restore_sysctls(host.get("sysctls", {}), log)
        for made in host.get("madeDirs", []):
            with contextlib.suppress(OSError):  # not empty: in use by another node's pods
                Path(made).rmdir()
    return left


def _remove_pods(layout: Layout, containerd_pid: int | None, log: Log) -> None:
    """Stop and remove every pod sandbox through the CRI, which also tears down its network (the
    pod's interface and address, and its network namespace's mount under /run/netns). If
    containerd is not running any more, it is started again for this, from its own records."""
    meta = layout.dir / "containerd" / "root" / "io.containerd.metadata.v1.bolt" / "meta.db"
    if not meta.exists():
        return
    crictl = binaries.bin_dir() / "crictl"
    if not os.access(crictl, os.X_OK):
        log(f"no crictl in {crictl.parent}; the pods are killed without releasing their networks")
        return
    temporary: Proc | None = None
    if not (containerd_pid and pid_alive(containerd_pid)):
        if not layout.containerd_config.exists() or shutil.which("containerd") is None:
            return
        log("starting containerd again to remove the node's pods")
        temporary = start(
            "containerd-cleanup",
            ["containerd", "--config", str(layout.containerd_config)],
            layout.state_dir / "logs" / "containerd-cleanup.log",
        )
        if not eventually(lambda: _socket_answers(layout.socket), within=30):
            stop_pid(temporary.pid)
            return
    try:
        endpoint = f"unix://{layout.socket}"
        proc = subprocess.run(
            [
                str(crictl),
                "--runtime-endpoint",
                endpoint,
                "--image-endpoint",
                endpoint,
                "rmp",
                "--all",
                "--force",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            log(f"crictl rmp failed: {tail_text(proc.stderr)}")
    finally:
        if temporary is not None:
            stop_pid(temporary.pid)


def _processes() -> list[tuple[int, list[str]]]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                out.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return out


def _kill_shims(layout: Layout) -> None:
    """containerd's shims outlive it (each in its own process group): those of this containerd
    name its socket in their arguments."""
    sock = str(layout.socket)
    shims = [
        pid
        for pid, argv in _processes()
        if argv and Path(argv[0]).name.startswith("containerd-shim") and sock in argv
    ]
    for pid in shims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    eventually(lambda: not any(pid_alive(pid) for pid in shims), within=10)


def _our_cgroups(cgroup_root: str) -> list[Path]:
    out = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / cgroup_root.lstrip("/")
        if top.is_dir():
            # Deepest first, so that each can be removed once its children are.
            out += sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            out.append(top)
    return out


def _pids_in(cgroups: list[Path]) -> set[int]:
    pids: set[int] = set()
    for cg in cgroups:
        with contextlib.suppress(OSError):
            pids |= {int(x) for x in (cg / "cgroup.procs").read_text().split()}
    return pids


def _kill_cgroups(cgroup_root: str) -> None:
    """Whatever still runs in the pods' cgroups (a container whose shim was killed)."""
    if not cgroup_root.strip("/"):
        return  # never the whole machine
    cgroups = _our_cgroups(cgroup_root)
    pids = _pids_in(cgroups)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    eventually(lambda: not _pids_in(cgroups), within=10)


def _remove_cgroups(cgroup_root: str) -> None:
    if not cgroup_root.strip("/"):
        return
    for cg in _our_cgroups(cgroup_root):
        with contextlib.suppress(OSError):
            cg.rmdir()


def _remove_log_links(state_dir: Path) -> None:
    """The kubelet's links to its containers' logs (it removes one when it removes the container;
    its pods were removed without it), those that lead into ``state_dir`` and no others."""
    if not CONTAINER_LOG_LINKS.is_dir():
        return
    for link in CONTAINER_LOG_LINKS.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and Path(os.readlink(link)).is_relative_to(state_dir):
                link.unlink()


def _restore_sysctls(saved: dict[str, str], log: Log) -> None:
    for name, value in saved.items():
        path = _sysctl_path(name)
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
                log(f"restored {name.replace('/', '.')} = {value}")


def unescape_mount_path(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash as octal)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_below(directory: Path) -> list[str]:
    """The mount points at or under ``directory``, in the order they were mounted."""
    prefix = str(directory).rstrip("/") + "/"
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = unescape_mount_path(line.split()[4])
            if point == str(directory) or point.startswith(prefix):
                out.append(point)
    return out


_MNT_DETACH = 2


def unmount_below(directory: Path) -> list[str]:
    """Unmount everything mounted at or under ``directory`` (the last mounted first); what
    could not be unmounted is returned."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):  # a mount may hide others below it: unmount, then look again
        points = mounts_below(directory)
        if not points:
            return []
        for point in reversed(points):
            if libc.umount2(point.encode(), 0) != 0 and ctypes.get_errno() == errno.EBUSY:
                libc.umount2(point.encode(), _MNT_DETACH)
    return mounts_below(directory)
