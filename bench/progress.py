"""How the benchmarks report progress: one timestamped line at a time on stderr.

Progress goes to stderr so that stdout carries only the result (a table, or JSON with --json)
that other tools read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Log = Callable[[str], None]


def stderr_log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def quiet(_: str) -> None:
    """For callers that want no progress lines."""
