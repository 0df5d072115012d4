"""`respawn local up --real-node` as a user runs it: a real node (containerd + kubelet) beside kwok's.

- The node registers as respawn-node-0 and becomes Ready, with its taint; kwok's node stays Ready,
  and a pod that does not tolerate the taint still lands on kwok's node.
- Pods run for real there, from the images tools/images/build.sh makes: a busybox pod that exits 1
  ends Failed with exit code 1 in its container status, one that exits 0 Succeeded, and a pod
  reads its projected service-account token (its log, read through the API server from the
  kubelet, counts the bytes).
- `local status` shows the node; `local down` leaves no process, mount, bridge, cgroup, network
  namespace, log link or directory of the node, and the kernel settings as they were.
- `up --real-node` on a running testbed without one adds the node and keeps the rest running;
  once more, it changes nothing.

Needs root (containerd and the kubelet); the first run builds the images if they are not cached.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import realnode
from respawn.testbed.cluster import kubectl
from respawn.testbed.process import pid_alive
from tests.integration import cli
from tests.integration.realnode_marks import REAL_NODE
from tests.waiting import until_sync

pytestmark = REAL_NODE

respawn = functools.partial(cli.respawn, timeout=300)
NODE = realnode.NODE_NAME
NETNS_DIR = Path("/run/netns")


def pod(name: str, script: str, *, real_node: bool = True) -> dict[str, Any]:
    """A busybox pod running ``sh -c script`` once, on the real node (tolerating its taint) or
    wherever the scheduler puts it."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }
        ],
    }
    if real_node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}
        spec["tolerations"] = [{"key": realnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def get_pod(kubeconfig: Path, name: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, "get", "pod", name, "-n", "default", "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def phase(kubeconfig: Path, name: str) -> str:
    return str(get_pod(kubeconfig, name).get("status", {}).get("phase", ""))


def finished(kubeconfig: Path, name: str, *, within: float = 60) -> dict[str, Any]:
    """The pod once it Succeeded or Failed."""
    until_sync(
        f"pod {name} to finish",
        lambda: phase(kubeconfig, name),
        done=lambda p: p in ("Succeeded", "Failed"),
        within=within,
        every=0.2,
    )
    return get_pod(kubeconfig, name)


def exit_code(pod_obj: dict[str, Any]) -> int:
    (status,) = pod_obj["status"]["containerStatuses"]
    return int(status["state"]["terminated"]["exitCode"])


def netns_entries() -> set[str]:
    return set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()


def machine() -> dict[str, Any]:
    """What a real node may change on this machine outside its state dir, as it is now."""
    return {
        "sysctls": {
            name: (Path("/proc/sys") / name).read_text().strip() for name in realnode.KUBELET_SYSCTLS
        },
        "netns": netns_entries(),
        "dirs": {str(d) for d in realnode.MACHINE_DIRS if d.exists()},
    }


def processes_naming(text: str) -> list[str]:
    """The command lines of running processes that mention ``text`` (a containerd shim names
    the socket of its containerd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and pid_alive(int(entry.name)):
                found.append(cmdline.strip())
    return found


@pytest.fixture
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory short enough for the node's sockets (``tmp_path`` holds the test's name,
    and under a test worker its worker's too)."""
    return (tmp_path_factory.mktemp("rn") / "tb").resolve()


def test_real_node_runs_pods_for_real_and_down_leaves_nothing(state_dir: Path) -> None:
    layout = realnode.Layout(state_dir)
    before = machine()

    started = time.monotonic()
    up = respawn(
        "local", "up", "--state-dir", str(state_dir), "--nodes", "1", "--no-services", "--real-node", "--json"
    )
    up_seconds = time.monotonic() - started
    pids: dict[str, int] = (
        json.loads((state_dir / "state.json").read_text())["pids"]
        if (state_dir / "state.json").exists()
        else {}
    )
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert info["realNode"] == {
            "name": NODE,
            "ready": True,
            "taint": "respawn.dev/real-node=true:NoSchedule",
            "containerdSocket": str(layout.socket),
        }
        kubeconfig = Path(info["kubeconfig"])
        assert {"containerd", "kubelet"} <= set(pids)

        node = json.loads(kubectl(kubeconfig, "get", "node", NODE, "-o", "json").stdout)
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True"
        assert node["spec"]["taints"] == [
            {"key": realnode.TAINT_KEY, "value": "true", "effect": "NoSchedule"}
        ]
        assert node["metadata"]["labels"][realnode.TAINT_KEY] == "true"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        kwok = json.loads(kubectl(kubeconfig, "get", "node", "kwok-node-0", "-o", "json").stdout)
        assert {c["type"]: c["status"] for c in kwok["status"]["conditions"]}["Ready"] == "True"

        status = respawn("local", "status", "--state-dir", str(state_dir), "--json")
        assert status.returncode == 0, status.stderr
        listed = json.loads(status.stdout)
        assert listed["processes"]["containerd"] is True and listed["processes"]["kubelet"] is True
        assert listed["realNode"]["name"] == NODE and listed["realNode"]["ready"] is True
        table = respawn("local", "status", "--state-dir", str(state_dir))
        assert f"real node {NODE}: Ready" in table.stdout

        # The failing pod runs two seconds: long enough to be seen Running, and timed to it.
        created = time.monotonic()
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(pod("fails", "sleep 2; exit 1")))
        until_sync(
            "pod fails to be Running",
            lambda: phase(kubeconfig, "fails"),
            done=lambda p: p != "Pending",
            within=60,
        )
        running_seconds = time.monotonic() - created
        for name, script in (
            ("succeeds", "exit 0"),
            ("token", "cat /var/run/secrets/kubernetes.io/serviceaccount/token | wc -c"),
        ):
            kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(pod(name, script)))
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(pod("bulk", "exit 0", real_node=False)))

        failed = finished(kubeconfig, "fails")
        assert failed["spec"]["nodeName"] == NODE
        assert failed["status"]["phase"] == "Failed" and exit_code(failed) == 1
        succeeded = finished(kubeconfig, "succeeds")
        assert succeeded["status"]["phase"] == "Succeeded" and exit_code(succeeded) == 0
        token = finished(kubeconfig, "token")
        assert token["status"]["phase"] == "Succeeded", token["status"]
        # Through the API server, which fetches it from the kubelet.
        logs = kubectl(kubeconfig, "logs", "-n", "default", "token").stdout.strip()
        assert int(logs) > 0, f"the token's size in the pod's log: {logs!r}"
        # Without the toleration, a pod lands on kwok's node as before.
        until_sync(
            "pod bulk to be scheduled",
            lambda: get_pod(kubeconfig, "bulk")["spec"].get("nodeName"),
            within=30,
        )
        assert get_pod(kubeconfig, "bulk")["spec"]["nodeName"] == "kwok-node-0"
        # What down must undo: a pod still running, its volumes mounted (a projected token is a
        # tmpfs) and its network namespace held under /run/netns.
        kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(pod("runs", "sleep 3600")))
        until_sync("pod runs to be Running", lambda: phase(kubeconfig, "runs"), done=lambda p: p == "Running")
        assert realnode.mounts_below(layout.kubelet_root / "pods"), "no volume of a running pod is mounted"
        assert netns_entries() - before["netns"], "no network namespace of a running pod"
        print(
            f"\nup --real-node until Ready: {up_seconds:.1f} s; "
            f"busybox pod create → Running: {running_seconds:.1f} s"
        )
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert_nothing_left(state_dir, pids, before)


def assert_nothing_left(state_dir: Path, pids: dict[str, int], before: dict[str, Any]) -> None:
    """After `down`: no process, mount, bridge, cgroup, network namespace or log link of the
    node, no directory it made, and the kernel settings the kubelet changed are back."""
    layout = realnode.Layout(state_dir)
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert processes_naming(str(state_dir)) == []
    assert realnode.mounts_below(state_dir) == []
    assert not state_dir.exists()
    assert not Path("/sys/class/net", layout.bridge).exists()
    nat = subprocess.run(
        ["iptables", "-w", "5", "-t", "nat", "-S"], capture_output=True, text=True, check=True
    )
    assert layout.chain not in nat.stdout, "the node's iptables chain or its jump is left"
    assert [h for h in realnode.cgroup_hierarchies() if (h / layout.cgroup_root.lstrip("/")).exists()] == []
    links = realnode.CONTAINER_LOG_LINKS
    assert [
        ln for ln in (links.iterdir() if links.is_dir() else ()) if str(state_dir) in os.readlink(ln)
    ] == []
    assert machine() == before


def test_real_node_joins_a_running_testbed_and_goes_with_it(state_dir: Path) -> None:
    before = machine()
    plain = respawn("local", "up", "--state-dir", str(state_dir), "--nodes", "1", "--no-services", "--json")
    pids: dict[str, int] = (
        json.loads((state_dir / "state.json").read_text())["pids"]
        if (state_dir / "state.json").exists()
        else {}
    )
    try:
        assert plain.returncode == 0, plain.stderr
        assert json.loads(plain.stdout)["realNode"] is None
        control_plane = dict(pids)

        joined = respawn(
            "local", "up", "--state-dir", str(state_dir), "--no-services", "--real-node", "--json"
        )
        pids = json.loads((state_dir / "state.json").read_text())["pids"]
        assert joined.returncode == 0, joined.stderr
        assert json.loads(joined.stdout)["realNode"]["ready"] is True
        # The running control plane was kept; only the node's processes were added.
        assert {k: v for k, v in pids.items() if k in control_plane} == control_plane
        assert set(pids) - set(control_plane) == {"containerd", "kubelet", "cluster-dns"}
        assert realnode.node_ready(Path(json.loads(joined.stdout)["kubeconfig"])) is True

        again = respawn(
            "local", "up", "--state-dir", str(state_dir), "--no-services", "--real-node", "--json"
        )
        assert again.returncode == 0, again.stderr
        assert json.loads((state_dir / "state.json").read_text())["pids"] == pids
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert_nothing_left(state_dir, pids, before)
