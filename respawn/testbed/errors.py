"""The one error type the local testbed raises.

Its message is a single line that names the cause and the fix, because it is
printed as-is by the command line and shown by pytest as the reason a fixture failed.
"""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A testbed component could not be started, reached or stopped."""

    # Not a test class, even though pytest collects names starting with "Test".
    __test__ = False
