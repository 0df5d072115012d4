"""Files the testbed writes that something else may read at any moment."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace_atomically"]


def replace_atomically(path: Path, data: bytes | str) -> None:
    """Write ``path`` so that a reader sees the old content or the new, never part of it: a
    temporary file beside it (named for this process, so that testbeds started side by side do
    not share one) renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(path)
