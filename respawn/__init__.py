"""Respawn's tools: the `respawn` CLI, the local testbed, the demo and the NATS account generator.

Nothing here is imported by a service (see docs/architecture.md); these modules need the `tools` extra.
"""
