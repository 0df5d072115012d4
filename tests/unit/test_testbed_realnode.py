"""The real node's configuration as `respawn local up --real-node` writes it, and what `down`
leans on (the node running pods for real: tests/integration/test_real_node.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from respawn.testbed import realnode
from respawn.testbed.errors import TestbedError
from respawn.testbed.pki import Pki

STATE = Path("/tmp/tb")
PAUSE = "registry.k8s.io/pause:3.10"


def below(path: str | Path, directory: Path) -> bool:
    return Path(path).is_relative_to(directory)


def test_machine_wide_names_fit_the_kernel_and_differ_between_state_dirs() -> None:
    one, other = realnode.Layout(Path("/tmp/a")), realnode.Layout(Path("/tmp/b"))
    assert len(one.bridge) <= 15  # IFNAMSIZ less its NUL
    assert one.bridge != other.bridge and one.cgroup_root != other.cgroup_root
    assert one.cgroup_root.startswith("/respawn-") and one.cgroup_root.strip("/")
    octets = [int(x) for x in one.node_ip.split(".")]
    assert octets[:2] == [10, 88] and 0 <= octets[2] <= 255 and octets[3] == 1


def test_containerd_keeps_everything_in_the_state_dir_and_runs_the_kubelets_way() -> None:
    layout = realnode.Layout(STATE)
    config = tomllib.loads(realnode.containerd_config_text(layout, PAUSE))
    assert below(config["root"], layout.dir) and below(config["state"], layout.dir)
    assert config["grpc"]["address"] == str(layout.socket)
    assert below(config["ttrpc"]["address"], layout.dir)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == PAUSE
    assert cri["restrict_oom_score_adj"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    assert below(runc["options"]["Root"], layout.dir)
    assert cri["cni"]["bin_dir"] == str(realnode.CNI_BIN_DIR)
    assert below(cri["cni"]["conf_dir"], layout.dir)


def test_the_pods_bridge_neither_forwards_nor_masquerades() -> None:
    layout = realnode.Layout(STATE)
    (bridge,) = json.loads(realnode.cni_config_text(layout))["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == layout.bridge
    # isGateway would turn on IP forwarding for the whole machine, ipMasq add iptables rules.
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    (subnet,) = bridge["ipam"]["ranges"][0]
    assert subnet["gateway"] == layout.node_ip
    assert subnet["subnet"] == f"{layout.subnet_prefix}.0/24"
    assert below(bridge["ipam"]["dataDir"], layout.dir)


def test_the_kubelet_registers_tainted_on_cgroupfs_and_keeps_its_files_in_the_state_dir() -> None:
    layout = realnode.Layout(STATE)
    config = yaml.safe_load(
        realnode.kubelet_config_text(layout, Pki(STATE / "pki"), port=10250, healthz_port=10248)
    )
    assert config["kind"] == "KubeletConfiguration"
    assert config["cgroupDriver"] == "cgroupfs" and config["cgroupRoot"] == layout.cgroup_root
    assert config["failSwapOn"] is False
    assert config["makeIPTablesUtilChains"] is False
    assert config["containerRuntimeEndpoint"] == f"unix://{layout.socket}"
    assert config["registerWithTaints"] == [
        {"key": realnode.TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    ]
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["address"] == layout.node_ip and config["readOnlyPort"] == 0
    assert below(config["podLogsDir"], layout.dir)
    # A full disk evicts nothing and collects no image: the images come from archives.
    assert config["imageGCHighThresholdPercent"] == 100
    assert all(config["evictionHard"][s] == "0%" for s in ("nodefs.available", "imagefs.available"))


def test_mount_points_are_read_as_the_kernel_escapes_them() -> None:
    assert realnode.unescape_mount_path("/tmp/with\\040space") == "/tmp/with space"
    assert realnode.unescape_mount_path("/plain") == "/plain"
    # The root is mounted in every process's view.
    assert "/" in realnode.mounts_below(Path("/"))


def test_stop_without_a_real_node_touches_nothing(tmp_path: Path) -> None:
    assert realnode.stop(tmp_path, {}) == []
    assert list(tmp_path.iterdir()) == []


def test_preflight_refuses_a_user_other_than_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match="--real-node needs root"):
        realnode.preflight(STATE)


def test_preflight_refuses_a_state_dir_too_long_for_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    too_long = r"too long for the sockets of containerd and the kubelet.*shorter --state-dir"
    with pytest.raises(TestbedError, match=too_long):
        realnode.preflight(Path("/tmp") / ("d" * 100))


def test_preflight_takes_the_longest_state_dir_whose_sockets_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet's device-plugin socket is the longest path under the state directory: a
    state directory that leaves it within 107 characters is taken, one character more is not."""
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 0)
    longest = "/node/kubelet/device-plugins/kubelet.sock"
    fits = Path("/tmp/" + "d" * (107 - len(longest) - len("/tmp/")))
    assert len(str(fits / longest.lstrip("/"))) == 107
    realnode.preflight(fits)
    with pytest.raises(TestbedError, match="too long"):
        realnode.preflight(Path(str(fits) + "d"))
