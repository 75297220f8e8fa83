"""What ``opendrs status``, ``opendrs show`` and the dashboard show of a cluster and of a
configuration, as data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opendrs.controller.config import Config
from opendrs.engine.constraints import platform_balancer
from opendrs.engine.policy.failover import check_failover, recovery_for
from opendrs.engine.policy.state import FailoverCheck
from opendrs.engine.strategies.base import cluster_imbalance, imbalance_by_arch
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster
from opendrs.report.text import node_state

__all__ = [
    "FailoverWatch",
    "arch_spreads",
    "cluster_summary",
    "node_loads",
    "policy_summary",
    "stuck_rows",
]


def cluster_summary(cluster: Cluster) -> dict[str, Any]:
    """The cluster's name, its guests, and — when Proxmox VE balances its HA guests itself —
    the sentence that says so (``platform_balancer``, else ``None``)."""
    return {
        "name": cluster.name,
        "guests": len(cluster.guests),
        "platform_balancer": platform_balancer(cluster),
    }


def node_loads(cluster: Cluster, loads: LoadModel | None = None) -> list[dict[str, Any]]:
    """Each node: name, state, CPU architecture, guests, and load per resource (a fraction of
    its capacity less reserves). ``loads``: the cluster's :class:`LoadModel`, when built."""
    fractions = (loads or LoadModel.build(cluster)).fractions()
    return [
        {
            "name": node.name,
            "state": node_state(node),
            "arch": node.arch,
            "guests": len(cluster.guests_on(node.name)),
            "load": {r: float(fractions[i, k]) for k, r in enumerate(RESOURCES)},
        }
        for i, node in enumerate(cluster.nodes)
    ]


def arch_spreads(cluster: Cluster, loads: LoadModel | None = None) -> dict[str, dict[str, float]]:
    """The spread per resource of the usable nodes, per CPU architecture where they have
    several (``all`` where they share one). ``loads``: the cluster's :class:`LoadModel`."""
    groups = imbalance_by_arch(cluster) or {"all": cluster_imbalance(cluster, loads=loads)}
    return {
        arch: {r: imbalance.resources[r].spread for r in RESOURCES}
        for arch, imbalance in groups.items()
    }


class FailoverWatch:
    """The failover headroom of each observation, for the dashboard and the metrics: the
    decision's own check when the policy keeps the headroom (``keep_failover``), else checked
    here for as many nodes failing (one when off) by the policy's ``failover_recovery``, again
    only when the placement or a node's
    state changes, or after an hour (:func:`check_failover`)."""

    def __init__(self) -> None:
        self.check: FailoverCheck | None = None

    def update(
        self,
        cluster: Cluster,
        at: float,
        failures: int,
        decided: FailoverCheck | None = None,
        recovery: str = "auto",
    ) -> FailoverCheck | None:
        """The check for ``cluster`` observed at ``at`` (``decided``: the decision's), by the
        ``failover_recovery`` setting ``recovery``."""
        if decided is not None:
            self.check = decided
        else:
            judged = recovery_for(recovery, cluster)
            self.check = check_failover(cluster, max(failures, 1), at, self.check, judged)
        return self.check


def policy_summary(config: Config) -> dict[str, Any]:
    """What the configuration file tells the daemon: its mode and when to act."""
    policy = config.policy
    return {
        "mode": config.mode,
        "name": policy.name,
        "strategy": policy.strategy,
        "metric": policy.metric,
        "threshold": policy.threshold,
        "target": policy.target,
        "interval": policy.interval,
    }


def stuck_rows(cluster: Cluster, stuck: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each guest a repair leaves breaking a hard constraint (``stuck``: its id and why, as
    :attr:`Decision.stuck`): the guest, its node in ``cluster``, whether that node is in
    maintenance, and why."""
    index, guests, nodes = cluster.guest_index, cluster.guests, cluster.node_index
    rows = []
    for guest, reason in stuck:
        j = index.get(guest)
        node = guests[j].node if j is not None else None
        n = nodes.get(node) if node is not None else None
        rows.append(
            {
                "guest": guest,
                "node": node,
                "maintenance": n is not None and cluster.nodes[n].maintenance,
                "reason": reason,
            }
        )
    return rows
