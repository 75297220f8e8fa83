"""The ``static`` usage plugin (``PVE::HA::Usage::Static``): configured cores and memory.

Each service adds its configured cores and memory (``maxcpu``, ``maxmem``) on every node it
loads; start scoring is TOPSIS over those stats.
"""

from __future__ import annotations

from collections.abc import Sequence

from opendrs.engine.pve_selection import NodeStats

from ..status import ManagerStatus, Mode
from .base import TopsisUsage, get_used_service_nodes

__all__ = ["StaticUsage"]


class StaticUsage(TopsisUsage):
    """``Usage::Static``: each service adds its maxcpu and maxmem on every node it loads."""

    mode: Mode = "static"

    def __init__(self, status: ManagerStatus, online_nodes: Sequence[str]) -> None:
        super().__init__(status, online_nodes)
        self.stats: dict[str, NodeStats] = self.zero_stats()
        for sid in status.usage_order():
            svc = status.services[sid]
            for node in get_used_service_nodes(self.online_set, svc.state, svc.node, svc.target):
                if node is not None:
                    self.stats[node].add_started(svc.maxcpu, svc.maxmem)
        self.scoring = self.stats

    def imbalance_stats(self) -> list[NodeStats]:
        return [self.stats[n] for n in self.online]

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        svc = self.status.services[sid]
        return svc.maxcpu, svc.maxmem
