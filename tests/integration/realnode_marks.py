"""What every test module that starts a testbed with a real node is marked with: it needs the
testbed binaries and root (containerd and the kubelet run as root)."""

from __future__ import annotations

import os

import pytest

from respawn.testbed import binaries

REAL_NODE = [
    pytest.mark.testbed,
    pytest.mark.skipif(os.geteuid() != 0, reason="a real node needs root (containerd and the kubelet)"),
    pytest.mark.skipif(
        bool(binaries.missing()),
        reason=f"testbed binaries not built yet in {binaries.bin_dir()} (run 'make binaries')",
    ),
]
