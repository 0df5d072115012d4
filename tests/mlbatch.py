"""The sample workloads of the MLBatch usage guide, copied unchanged into tests/data/mlbatch.

One YAML file per sample, named as the guide names it (``oc apply -f samples/<name>.yaml``); the
priority sample, to which the guide gives no file name, is ``job-with-priority``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["APPWRAPPERS", "load", "text"]

DIR = Path(__file__).parent / "data" / "mlbatch"


def text(name: str) -> str:
    """A sample as written (YAML)."""
    return (DIR / f"{name}.yaml").read_text()


def load(name: str) -> dict[str, Any]:
    """A sample as an object."""
    doc: dict[str, Any] = yaml.safe_load(text(name))
    return doc


# The samples that are AppWrappers (the guide submits its PyTorchJob unwrapped).
APPWRAPPERS = tuple(sorted(p.stem for p in DIR.glob("*.yaml") if load(p.stem)["kind"] == "AppWrapper"))
