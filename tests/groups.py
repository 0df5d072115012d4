"""Which tests pytest-xdist workers may run side by side (``make test``, ``tests/conftest.py``).

A worker runs whole modules, so a module's fixtures are set up once and its tests keep their
order. The modules that use what a machine has only one of (the real node's containerd, kubelet,
CNI state and network namespaces; the image store the real node loads its images from) form one
group, which a single worker runs one module after the other.
"""

from __future__ import annotations

HOST_GROUP = "host"
HOST_MODULES = frozenset(
    {
        "tests/integration/test_images.py",
        "tests/integration/test_in_cluster.py",
        "tests/integration/test_install_on_node.py",
        "tests/integration/test_real_node.py",
    }
)


def group_of(nodeid: str) -> str:
    """The group of a test: its module, or ``host`` for the modules above."""
    module = nodeid.split("::", 1)[0]
    return HOST_GROUP if module in HOST_MODULES else module
