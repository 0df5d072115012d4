"""What tools/k8sbins/build.sh builds for the demo, for one add-on, and for everything.

The core binaries are stubs in a cache of the test's own, and ``go`` on PATH is a stub that
fails: whatever the script tries to build makes it fail at once, naming what it tried.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from respawn.testbed import binaries

# The testbed's core, and the kubelet the script builds with the control plane.
CORE = (*binaries.COMPONENTS, "kubelet")


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir(exist_ok=True)
    go = fake_bin / "go"
    go.write_text('#!/bin/sh\necho "go $*: not here" >&2\nexit 1\n')
    go.chmod(0o755)
    return subprocess.run(
        ["bash", str(binaries.BUILD_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **os.environ,
            "RESPAWN_CACHE_DIR": str(tmp_path / "cache"),
            "PATH": f"{fake_bin}:/usr/bin:/bin",
            **env,
        },
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding the testbed's core and the two add-ons every testbed starts."""
    monkeypatch.setenv("RESPAWN_CACHE_DIR", str(tmp_path / "cache"))
    paths = [binaries.bin_dir() / name for name in CORE]
    paths += [binaries.addon_path(name) for name in ("jobset", "ray-operator")]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return tmp_path


def test_the_demo_build_needs_nothing_more_than_the_testbed_local_up_starts(cache: Path) -> None:
    done = run(cache, "--demo")
    assert done.returncode == 0, done.stderr
    assert "building" not in done.stderr
    assert done.stdout.strip() == str(binaries.bin_dir())


def test_one_add_on_is_built_without_crictl_or_promtool(cache: Path) -> None:
    done = run(cache, ADDON="kueue")
    assert done.returncode != 0
    assert "building kueue" in done.stderr
    assert "crictl" not in done.stderr and "promtool" not in done.stderr


def test_the_full_build_wants_crictl_promtool_and_kueue_too(cache: Path) -> None:
    done = run(cache)
    assert done.returncode != 0
    assert "building crictl" in done.stderr  # the first of the three; the stub go fails it


def test_an_unknown_argument_is_a_usage_error(cache: Path) -> None:
    done = run(cache, "--everything")
    assert done.returncode == 2
    assert "usage:" in done.stderr
