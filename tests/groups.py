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


# The groups that take longest, in the order the workers should start them: a worker that takes
# one of these last would run on alone while the others wait (the suite's time is the slowest
# worker's). The host group first; the rest from `pytest --durations=0`, a minute or more each.
LONGEST_FIRST: tuple[str, ...] = (
    HOST_GROUP,
    "tests/integration/test_chaos.py",
    "tests/integration/test_kueue_e2e.py",
    "tests/integration/test_testbed_cli.py",
    "tests/integration/test_bench_smoke.py",
)


def group_of(nodeid: str) -> str:
    """The group of a test: its module, or ``host`` for the modules above."""
    module = nodeid.split("::", 1)[0]
    return HOST_GROUP if module in HOST_MODULES else module


def start_rank(nodeid: str) -> int:
    """Where a test's group comes in the order the workers take groups: the longest first (their
    place in :data:`LONGEST_FIRST`), every other group after them in collection order."""
    group = group_of(nodeid)
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)
