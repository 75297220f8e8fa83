"""The ``dynamic`` usage plugin (``PVE::HA::Usage::Dynamic``): measured cores and memory."""

from __future__ import annotations

from collections.abc import Sequence

from opendrs.engine.pve_selection import NodeStats

from ..status import ManagerStatus, Mode
from .base import TopsisUsage, get_used_service_nodes

__all__ = ["DynamicUsage"]


class DynamicUsage(TopsisUsage):
    """``Usage::Dynamic``: measured usage.

    Without a node baseline in the query, a node's measured usage is the sum of
    the measured cpu/mem of the running services that load it. Start scoring
    additionally adds the max values (maxcpu, maxmem) of the services placed on
    a node that are not running yet. A service is running when
    ``(started and running) or (not started and it loads its current node)``.
    """

    mode: Mode = "dynamic"

    def __init__(self, status: ManagerStatus, online_nodes: Sequence[str]) -> None:
        super().__init__(status, online_nodes)
        self.measured = self.zero_stats()
        self.scoring = self.zero_stats()
        for sid in status.usage_order():
            svc = status.services[sid]
            current, target = get_used_service_nodes(
                self.online_set, svc.state, svc.node, svc.target
            )
            if current is None and target is None:
                continue
            running = (svc.state == "started" and svc.running) or (
                svc.state != "started" and current is not None
            )
            for node in (current, target):
                if node is None:
                    continue
                if running:
                    self.measured[node].add_running(svc.cpu, svc.mem)
                    self.scoring[node].add_running(svc.cpu, svc.mem)
                else:
                    self.scoring[node].add_started(svc.maxcpu, svc.maxmem)

    def imbalance_stats(self) -> list[NodeStats]:
        return [self.measured[n] for n in self.online]

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        svc = self.status.services[sid]
        return svc.cpu, svc.mem
