"""Where the testbed finds its add-on controllers (JobSet, KubeRay): each in a cache directory of
its own, keyed by its own pinned version, never in the Kubernetes binaries' directory."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from respawn.testbed import binaries
from respawn.testbed.errors import TestbedError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RESPAWN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_each_addon_has_a_directory_of_its_own_keyed_by_its_pinned_version(cache: Path) -> None:
    v = binaries.versions()
    assert binaries.addon_path("jobset") == cache / "bin" / f"jobset-{v['JOBSET_VERSION']}" / "jobset"
    assert (
        binaries.addon_path("ray-operator")
        == cache / "bin" / f"ray-operator-{v['KUBERAY_VERSION']}" / "ray-operator"
    )
    # The Kubernetes directory's key does not depend on them (a new one would rebuild Kubernetes).
    assert "jobset" not in binaries.bin_dir().name and "ray" not in binaries.bin_dir().name


def test_a_built_addon_is_found_without_building(cache: Path) -> None:
    path = binaries.addon_path("jobset")
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    assert binaries.addon("jobset") == path
    assert binaries.Binaries(dir=binaries.bin_dir(), nats_server=path, crds=()).path("jobset") == path


def test_an_unknown_addon_is_an_error_naming_the_known_ones(cache: Path) -> None:
    with pytest.raises(TestbedError, match="jobset, kueue, ray-operator"):
        binaries.addon_path("kueue-typo")
