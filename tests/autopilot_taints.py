"""The Autopilot taint configuration the autopilot tests share (unit and against a real server):
one GPU resource with the four health values and their effects."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.config import ResourceTaint

GPU = "nvidia.com/gpu"
RDMA = "rdma/ib"
HEALTH = "autopilot.ibm.com/gpuhealth"
NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
TAINTS: dict[str, list[ResourceTaint]] = {
    GPU: [
        ResourceTaint(key=HEALTH, value="WARN", effect="PreferNoSchedule"),
        ResourceTaint(key=HEALTH, value="TESTING", effect="NoSchedule"),
        ResourceTaint(key=HEALTH, value="ERR", effect="NoSchedule"),
        ResourceTaint(key=HEALTH, value="EVICT", effect="NoExecute"),
    ]
}
