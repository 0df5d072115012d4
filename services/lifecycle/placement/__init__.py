"""Lifecycle's pod-placement policy: anti-affinity for new pods and per-workload node exclusion."""
