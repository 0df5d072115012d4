"""Running the ``respawn`` command as a user runs it: a process of its own (test helper)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["RESPAWN", "respawn"]

REPO = Path(__file__).resolve().parents[2]
# The command line of ``respawn``, from the code under test whatever is installed.
RESPAWN = [sys.executable, "-m", "respawn.cli.main"]


def respawn(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``respawn *args``, run in the repository with ``env`` (default: this process's), output captured."""
    return subprocess.run(
        [*RESPAWN, *args],
        env=dict(os.environ) if env is None else env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
