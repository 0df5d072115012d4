"""`respawn local up/down` as a user runs it: clean start and stop, and clear one-line errors."""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from respawn.testbed import binaries
from respawn.testbed.ports import port_open
from respawn.testbed.process import pid_alive
from respawn.testbed.services import SERVICES
from tests.integration import cli

needs_binaries = pytest.mark.skipif(
    bool(binaries.missing()),
    reason=f"testbed binaries not built yet in {binaries.bin_dir()} (run 'make binaries')",
)


# `local up` starts a whole control plane: it may take minutes on a loaded machine.
respawn = functools.partial(cli.respawn, timeout=300)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def assert_nothing_left(state_dir: Path, pids: dict[str, int]) -> None:
    alive = [name for name, pid in pids.items() if pid_alive(pid)]
    assert alive == [], f"processes left running: {alive}"
    assert not (state_dir / "state.json").exists()


@needs_binaries
def test_up_twice_then_down_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    state_dir = tmp_path / "tb"
    first = respawn("local", "up", "--state-dir", str(state_dir), "--nodes", "2", "--no-services", "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    assert info["version"] == "respawn.cli/v1"
    assert Path(info["kubeconfig"]).read_text().startswith("apiVersion: v1")
    assert (state_dir / "nats.url").read_text().strip() == info["natsUrl"]
    state = json.loads((state_dir / "state.json").read_text())
    pids: dict[str, int] = state["pids"]
    ports: dict[str, int] = state["ports"]
    assert {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "nats-server",
        "training-operator",
        "jobset",
        "ray-operator",
    } <= set(pids)
    try:
        # The wrapped kinds' controllers are testbed processes like any other: `status` shows them.
        status = respawn("local", "status", "--state-dir", str(state_dir), "-o", "json")
        assert status.returncode == 0, status.stderr
        processes = json.loads(status.stdout)["processes"]
        assert {p: processes.get(p) for p in ("training-operator", "jobset", "ray-operator")} == {
            "training-operator": True,
            "jobset": True,
            "ray-operator": True,
        }
        # -o json is what the deprecated --json above is an alias of; -o yaml the same document.
        again = respawn("local", "up", "--state-dir", str(state_dir), "--no-services", "-o", "json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["apiServer"] == info["apiServer"], (
            "second up reuses the running testbed"
        )
        assert json.loads((state_dir / "state.json").read_text())["pids"] == pids
        as_json = respawn("local", "status", "--state-dir", str(state_dir), "--json")
        as_yaml = respawn("local", "status", "--state-dir", str(state_dir), "-o", "yaml")
        assert as_json.returncode == as_yaml.returncode == 0, as_json.stderr + as_yaml.stderr
        assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
        assert json.loads(as_json.stdout)["version"] == "respawn.cli/v1"
        # -o wide: each process's log file beside it.
        wide = respawn("local", "status", "--state-dir", str(state_dir), "-o", "wide")
        assert wide.returncode == 0, wide.stderr
        assert str(state_dir.resolve() / "logs" / "kube-apiserver.log") in wide.stdout.replace("\n", "")
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert_nothing_left(state_dir, pids)
    # No testbed there any more: not found (exit 3), with the empty document.
    gone = respawn("local", "status", "--state-dir", str(state_dir), "-o", "json")
    assert gone.returncode == 3
    assert json.loads(gone.stdout)["running"] is False
    # A port another testbed on this machine has taken since (tests run in parallel) is not left
    # open by this one: only a listener that is this testbed's counts.
    open_ports = [name for name, port in ports.items() if port_open(port) and held_by(port, state_dir)]
    assert open_ports == [], f"ports still open after down: {open_ports}"


def listeners(port: int) -> list[int]:
    """The pids of the processes listening on TCP ``port`` (from /proc: no tool needed)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            # local address "ADDR:PORT" in hex, state 0A is LISTEN, the inode is the tenth field
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def held_by(port: int, state_dir: Path) -> bool:
    """Whether a process of the testbed in ``state_dir`` listens on ``port``: its command line or
    its environment names that directory. A listener that cannot be read counts as the testbed's."""
    marks = {str(state_dir), str(state_dir.resolve())}
    holders = listeners(port)
    for pid in holders:
        try:
            seen = [Path(f"/proc/{pid}/cmdline").read_text(errors="replace"), *environment_of(pid).values()]
        except OSError:
            return True
        if any(mark in text for mark in marks for text in seen):
            return True
    return not holders


def environment_of(pid: int) -> dict[str, str]:
    """The environment a running process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        return bool(resp.status == 200)


@needs_binaries
def test_up_with_nats_tls_and_replicas_runs_each_replica_over_tls_and_down_stops_them_all(
    tmp_path: Path,
) -> None:
    # Both flags in one start: a control plane takes half a minute to come up.
    state_dir = tmp_path / "tb"
    up = respawn(
        "local",
        "up",
        "--state-dir",
        str(state_dir),
        "--nodes",
        "1",
        "--nats-tls",
        "--replicas",
        "health=2",
        "--json",
    )
    pids: dict[str, int] = (
        json.loads((state_dir / "state.json").read_text())["pids"] if up.returncode == 0 else {}
    )
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert info["natsUrl"].startswith("tls://127.0.0.1:")
        assert (state_dir / "nats.url").read_text().strip() == info["natsUrl"]
        assert Path(info["natsCaFile"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
        assert info["services"] == list(SERVICES)
        replicas = info["replicas"]
        # Two health processes, each with its own pid, probe port, log and identity; one of the others.
        assert {s: [r["instance"] for r in rs] for s, rs in replicas.items()} == {
            "watcher": ["watcher"],
            "health": ["health-0", "health-1"],
            "lifecycle": ["lifecycle"],
            "autopilot": ["autopilot"],
        }
        health = replicas["health"]
        assert len({r["pid"] for r in health}) == len({r["probePort"] for r in health}) == 2
        for replica in (r for rs in replicas.values() for r in rs):
            name = replica["instance"]
            assert replica["running"] is True and pids[name] == replica["pid"], name
            assert ready(replica["probePort"]), f"{name} is not ready"
            assert environment_of(replica["pid"])["RESPAWN_INSTANCE"] == name
            # Every replica connected over TLS, trusting the testbed's CA (up waited until each was ready).
            assert (
                f"connected to NATS at {info['natsUrl']}" in (state_dir / "logs" / f"{name}.log").read_text()
            ), name

        status = respawn("local", "status", "--state-dir", str(state_dir), "--json")
        assert status.returncode == 0, status.stderr
        listed = json.loads(status.stdout)
        assert listed["running"] is True
        assert {"health-0", "health-1", "watcher", "lifecycle", "autopilot"} <= set(listed["processes"])
        assert listed["replicas"] == replicas

        # `up` again without --replicas leaves the replicas as they run.
        again = respawn("local", "up", "--state-dir", str(state_dir), "--nats-tls", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["services"] == []
        assert json.loads(again.stdout)["replicas"] == replicas
        # Again, for the shell: what the CLI and `respawn run` need to trust the server too.
        shell = respawn("local", "up", "--state-dir", str(state_dir), "--nats-tls")
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.splitlines() == [
            f"export KUBECONFIG={info['kubeconfig']}",
            f"export NATS_URL={info['natsUrl']}",
            f"export RESPAWN_NATS_TLS_CA_FILE={info['natsCaFile']}",
        ]
        # Asked for without TLS, the running testbed is not passed off as one.
        plain = respawn("local", "up", "--state-dir", str(state_dir))
        assert plain.returncode != 0
        line = error_line(plain)
        assert "runs NATS with TLS" in line and "respawn local down" in line
    finally:
        down = respawn("local", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert_nothing_left(state_dir, pids)


@needs_binaries
def test_busy_port_is_a_one_line_error_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        proc = respawn(
            "local", "up", "--state-dir", str(tmp_path / "tb"), "--api-port", str(busy), "--no-services"
        )
    assert proc.returncode != 0
    line = error_line(proc)
    assert f"port {busy}" in line and "in use" in line
    assert not (tmp_path / "tb" / "state.json").exists()


@needs_binaries
def test_component_dying_during_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    state_dir = tmp_path / "tb"
    state_dir.mkdir()
    # etcd cannot use a data dir that is a regular file: it exits during start-up.
    (state_dir / "etcd").write_text("not a directory")
    proc = respawn("local", "up", "--state-dir", str(state_dir), "--no-services")
    assert proc.returncode != 0
    line = error_line(proc)
    assert "etcd exited during start-up" in line
    assert not (state_dir / "state.json").exists()
    assert (state_dir / "logs" / "etcd.log").exists(), "logs are kept for a look"


def test_missing_go_is_a_one_line_error(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["RESPAWN_CACHE_DIR"] = str(tmp_path / "cache")  # nothing built here
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "go").exists())
    assert shutil.which("go", path=env["PATH"]) is None
    proc = respawn("local", "up", "--state-dir", str(tmp_path / "tb"), "--no-services", env=env)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "'go' not found" in line and "install Go" in line


def test_failed_build_is_a_one_line_error(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_go = fake_bin / "go"
    fake_go.write_text("#!/bin/sh\necho 'go: simulated failure' >&2\nexit 1\n")
    fake_go.chmod(0o755)
    env = dict(os.environ)
    env["RESPAWN_CACHE_DIR"] = str(tmp_path / "cache")
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    proc = respawn("local", "up", "--state-dir", str(tmp_path / "tb"), "--no-services", env=env)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "building the testbed binaries failed" in line and "make binaries" in line
