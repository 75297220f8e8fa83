"""The usage plugin interface (``PVE::HA::Usage``): the load the services put on the nodes.

A :class:`Usage` is built for one scheduling round from the manager's status; it scores the
nodes for starting a service (lower is better, as the Perl callers expect), gives the node stats
the imbalance and the rebalancer read, and what a service takes along when it moves.
:func:`get_used_service_nodes` says which nodes a service loads in each state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opendrs.engine.mcdm import McdmError
from opendrs.engine.pve_selection import NodeStats, node_imbalance, score_nodes_to_start_service

from ..status import ManagerStatus, Mode

__all__ = ["TopsisUsage", "Usage", "get_used_service_nodes"]


def get_used_service_nodes(
    online_nodes: Iterable[str] | set[str], state: str, node: str | None, target: str | None
) -> tuple[str | None, str | None]:
    """``Usage.pm get_used_service_nodes``: the (current, target) nodes a service loads.

    stopped/request_start load nothing; started, request_stop, fence, freeze,
    error and recovery load the current node; migrate/relocate load the current
    and the target node; request_start_balance loads the target node. Offline
    nodes are never loaded.
    """
    online = online_nodes if isinstance(online_nodes, set) else set(online_nodes)
    if state in ("stopped", "request_start"):
        return None, None
    current = None
    if state in (
        "started",
        "request_stop",
        "fence",
        "freeze",
        "error",
        "recovery",
        "migrate",
        "relocate",
    ):
        current = node if node in online else None
    tgt = None
    if state in ("migrate", "relocate", "request_start_balance"):
        tgt = target if target is not None and target in online else None
    return current, tgt


class Usage:
    """``PVE::HA::Usage``: node usage for one scheduling round.

    Subclasses fill ``stats`` (static and dynamic) or ``counts`` (basic).
    """

    mode: Mode = "basic"

    def __init__(self, status: ManagerStatus, online_nodes: Sequence[str]) -> None:
        self.status = status
        self.online = list(online_nodes)
        self.online_set = set(online_nodes)

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        """Scores per online node; a *lower* score is better (as the Perl callers expect)."""
        raise NotImplementedError

    def imbalance_stats(self) -> list[NodeStats]:
        """Per-node stats for the imbalance and for rebalancing (online nodes, sorted)."""
        return []

    def imbalance(self, *, normalized: bool = False) -> float:
        """The node imbalance (raw coefficient of variation unless ``normalized``)."""
        return node_imbalance(self.imbalance_stats(), normalized=normalized)

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        """The (cpu, mem) a service takes along when it is moved by the rebalancer."""
        raise NotImplementedError


class TopsisUsage(Usage):
    """Static and dynamic usage: start scoring by TOPSIS over ``scoring`` node stats
    (``proxmox-resource-scheduling``'s ``score_nodes_to_start_service``)."""

    scoring: dict[str, NodeStats]

    def zero_stats(self) -> dict[str, NodeStats]:
        """Stats of every online node with nothing on it (its maxcpu and maxmem)."""
        nodes = self.status.nodes
        return {n: NodeStats(0.0, nodes[n].maxcpu, 0, nodes[n].maxmem) for n in self.online}

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        svc = self.status.services[sid]
        nodes = [(n, self.scoring[n]) for n in self.online]
        try:
            scores = score_nodes_to_start_service(nodes, svc.maxcpu, svc.maxmem)
        except McdmError:
            # Proxmox: a scoring error scores every node 0, so the pick is alphabetical.
            return dict.fromkeys(self.online, 0.0)
        return {n: 0.0 - score for n, score in scores.items()}
