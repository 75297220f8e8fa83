"""The ``basic`` usage plugin (``PVE::HA::Usage::Basic``): a node's score is the number of
services loading it; it never rebalances."""

from __future__ import annotations

from collections.abc import Sequence

from ..status import ManagerStatus, Mode
from .base import Usage, get_used_service_nodes

__all__ = ["BasicUsage"]


class BasicUsage(Usage):
    """``Usage::Basic``: a node's score is the number of services loading it."""

    mode: Mode = "basic"

    def __init__(self, status: ManagerStatus, online_nodes: Sequence[str]) -> None:
        super().__init__(status, online_nodes)
        self.counts: dict[str, int] = dict.fromkeys(self.online, 0)
        for sid in status.usage_order():
            svc = status.services[sid]
            for node in get_used_service_nodes(self.online_set, svc.state, svc.node, svc.target):
                if node is not None:
                    self.counts[node] += 1

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        return {node: float(count) for node, count in self.counts.items()}

    def imbalance(self, *, normalized: bool = False) -> float:
        return 0.0

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        return 0.0, 0
