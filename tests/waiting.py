"""The tests wait through the tools' one polling helper (``respawn.waiting``); re-exported here so
that a test reads ``from tests.waiting import until`` like any other test support module."""

from respawn.waiting import WaitTimeout, holds, holds_sync, until, until_sync

__all__ = ["WaitTimeout", "holds", "holds_sync", "until", "until_sync"]
