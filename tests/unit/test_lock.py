"""requirements.lock, which the image installs: every runtime dependency of pyproject.toml is in
it at a version within the dependency's bounds, every bound has both ends, every entry is pinned
and hashed, and the lock holds what its packages themselves require."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The image's interpreter: Debian's Python 3.11 on Linux.
IMAGE_ENV = {
    **default_environment(),
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@dataclass(frozen=True)
class Locked:
    name: str
    version: Version
    hashes: tuple[str, ...]


def read_lock() -> dict[str, Locked]:
    """The entries of requirements.lock by canonical name (continuation lines joined)."""
    text = (REPO / "requirements.lock").read_text()
    entries: dict[str, Locked] = {}
    for logical in re.sub(r"\\\n", " ", text).splitlines():
        line = logical.split("#", 1)[0].strip()
        if not line:
            continue
        spec = line.partition(" --hash")[0]
        requirement = Requirement(spec.strip())
        pins = [s for s in requirement.specifier if s.operator == "=="]
        assert len(pins) == 1 and len(requirement.specifier) == 1, f"not pinned exactly: {line}"
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
        name = canonicalize_name(requirement.name)
        assert name not in entries, f"{name} twice in the lock"
        entries[name] = Locked(name, Version(pins[0].version), hashes)
    return entries


LOCK = read_lock()
RUNTIME = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def test_every_entry_is_pinned_and_hashed() -> None:
    assert LOCK
    unhashed = [e.name for e in LOCK.values() if not e.hashes]
    assert unhashed == []


@pytest.mark.parametrize("requirement", RUNTIME, ids=str)
def test_every_runtime_dependency_has_a_lower_and_an_upper_bound(requirement: Requirement) -> None:
    operators = {s.operator for s in requirement.specifier}
    assert operators & {">=", ">", "==", "~="}, f"{requirement}: no lower bound"
    assert operators & {"<", "<=", "==", "~="}, f"{requirement}: no upper bound"


@pytest.mark.parametrize(
    "requirement", [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["tools"]], ids=str
)
def test_every_tool_dependency_has_an_upper_bound_too(requirement: Requirement) -> None:
    operators = {s.operator for s in requirement.specifier}
    assert operators & {"<", "<=", "==", "~="}, f"{requirement}: no upper bound"


@pytest.mark.parametrize("requirement", RUNTIME, ids=str)
def test_the_lock_holds_every_runtime_dependency_within_its_bounds(requirement: Requirement) -> None:
    entry = LOCK.get(canonicalize_name(requirement.name))
    assert entry is not None, f"{requirement.name} is not in requirements.lock; run 'make lock'"
    assert requirement.specifier.contains(entry.version, prereleases=True), (
        f"requirements.lock has {entry.name}=={entry.version}, outside {requirement}; run 'make lock'"
    )


def test_the_lock_holds_the_build_backend_within_the_build_systems_bounds() -> None:
    [backend] = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    entry = LOCK[canonicalize_name(backend.name)]
    assert backend.specifier.contains(entry.version)


def test_the_lock_holds_what_its_packages_require() -> None:
    """Closed under the requirements the installed packages declare, wherever the lock and this
    environment agree on a version (this virtualenv is installed from the lock)."""
    missing = []
    checked = 0
    for entry in LOCK.values():
        try:
            dist = metadata.distribution(entry.name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != entry.version:
            continue
        checked += 1
        # The extras pyproject.toml asks for (nats-py[nkeys]) count as wanted.
        extras = {e for r in RUNTIME if canonicalize_name(r.name) == entry.name for e in r.extras}
        for raw in dist.requires or []:
            needed = Requirement(raw)
            wanted = needed.marker is None or any(
                needed.marker.evaluate({**IMAGE_ENV, "extra": extra}) for extra in ("", *extras)
            )
            if not wanted:
                continue
            found = LOCK.get(canonicalize_name(needed.name))
            if found is None or not needed.specifier.contains(found.version, prereleases=True):
                missing.append(f"{entry.name} needs {needed}")
    assert checked >= len(RUNTIME), "too few locked packages installed here to check the lock"
    assert missing == [], "run 'make lock'"


def test_the_image_installs_the_lock_with_its_hashes() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY requirements.lock" in dockerfile
    assert "pip install --require-hashes --no-deps -r requirements.lock" in dockerfile
    # Respawn's own package adds nothing unlocked.
    assert "pip install --no-deps --no-build-isolation --no-index ." in dockerfile
    assert "!requirements.lock" in (REPO / ".dockerignore").read_text().splitlines()
