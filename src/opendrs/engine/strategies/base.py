"""The strategy interface: ``propose(cluster, options) -> Proposal``.

A strategy decides a target placement; each move carries its reason (the metric before and after
it, its cost). A proposal also carries the predicted cluster metrics before and after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from opendrs.engine.imbalance import Imbalance, summarise
from opendrs.engine.usage import RESOURCES, LoadModel, arch_groups
from opendrs.model.cluster import Cluster, Guest, Move, Settings


def migration_cost(guest: Guest, settings: Settings | None = None) -> int:
    """``max(1, ⌊RAM/unit⌋) + factor·⌊local disk/unit⌋`` (proxlb-solver: 256 MiB and 4)."""
    settings = settings or Settings()
    unit = settings.cost_unit
    disk = int(settings.cost_disk_factor * (guest.local_disk_bytes // unit))
    return max(1, guest.memory // unit) + disk


@dataclass(frozen=True, slots=True)
class ProposedMove:
    """One move of a proposal, with why it was chosen."""

    guest: str
    source: str
    target: str
    #: The strategy's metric before and after this move (in proposal order).
    metric: str
    before: float
    after: float
    cost: int
    reason: str = ""

    @property
    def move(self) -> Move:
        return Move(self.guest, self.source, self.target)

    def as_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest,
            "source": self.source,
            "target": self.target,
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "cost": self.cost,
            "reason": self.reason,
        }


def bundle_moves(
    cluster: Cluster,
    members: Iterable[int],
    leader: str,
    source: str,
    target: str,
    *,
    metric: str,
    before: float,
    after: float,
    reason: str,
) -> list[ProposedMove]:
    """One move per member of a bundle (guest indices), each saying who leads it."""
    guests = cluster.guests
    return [
        ProposedMove(
            guest=guests[m].id,
            source=source,
            target=target,
            metric=metric,
            before=before,
            after=after,
            cost=migration_cost(guests[m], cluster.settings),
            reason=reason + (f" (with {leader})" if guests[m].id != leader else ""),
        )
        for m in members
    ]


@dataclass(frozen=True)
class Proposal:
    """A target placement and how it was reached."""

    strategy: str
    moves: tuple[ProposedMove, ...]
    before: Imbalance
    after: Imbalance
    #: Why the strategy stopped (threshold reached, no move improves enough, move limit, …).
    stopped: str
    notes: tuple[str, ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def placement(self) -> dict[str, str]:
        """Final node of every guest the proposal moves (its last move wins)."""
        out: dict[str, str] = {}
        for m in self.moves:
            out[m.guest] = m.target
        return out

    def net_moves(self) -> tuple[Move, ...]:
        """One move per guest that ends elsewhere: from its first source to its last target."""
        first: dict[str, str] = {}
        for m in self.moves:
            first.setdefault(m.guest, m.source)
        return tuple(
            Move(guest, first[guest], target)
            for guest, target in self.placement.items()
            if target != first[guest]
        )

    @property
    def total_cost(self) -> int:
        """Cost of the net moves (a guest moved twice pays once, from where it was)."""
        last = {m.guest: m.cost for m in self.moves}
        return sum(last[m.guest] for m in self.net_moves())

    def as_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "options": dict(self.options),
            "moves": [m.as_dict() for m in self.moves],
            "migrations": len(self.net_moves()),
            "cost": self.total_cost,
            "stopped": self.stopped,
            "notes": list(self.notes),
            "metrics": {"before": self.before.as_dict(), "after": self.after.as_dict()},
        }


def cluster_imbalance(cluster: Cluster, assign: np.ndarray | None = None) -> Imbalance:
    """Imbalance figures of the usable nodes, for the current placement or ``assign``."""
    loads = LoadModel.build(cluster)
    fractions = loads.fractions(assign)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    settings = cluster.settings
    return summarise(fractions[usable], RESOURCES, [settings.weight_cpu, settings.weight_memory])


def imbalance_by_arch(cluster: Cluster, assign: np.ndarray | None = None) -> dict[str, Imbalance]:
    """Imbalance figures of each CPU architecture's usable nodes — empty when the usable nodes
    share one: guests cannot move between architectures, so each is balanced on its own."""
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    arches, group = arch_groups(cluster, usable)
    if len(arches) < 2:
        return {}
    fractions = LoadModel.build(cluster).fractions(assign)
    weights = [cluster.settings.weight_cpu, cluster.settings.weight_memory]
    return {
        arch: summarise(fractions[group == g], RESOURCES, weights) for g, arch in enumerate(arches)
    }


def worst_spreads(overall: Imbalance, by_arch: Mapping[str, Imbalance]) -> dict[str, float]:
    """Per resource (and ``combined``), the largest spread of any architecture group — the
    overall spread when the usable nodes share one architecture."""
    groups = list(by_arch.values()) or [overall]
    out = {r: max(g.resources[r].spread for g in groups) for r in overall.resources}
    out["combined"] = max(g.combined.spread for g in groups)
    return out


@dataclass(frozen=True)
class StrategyInfo:
    """A registered strategy."""

    name: str
    summary: str
    propose: Callable[..., Proposal]


REGISTRY: dict[str, StrategyInfo] = {}


def register(
    name: str, summary: str
) -> Callable[[Callable[..., Proposal]], Callable[..., Proposal]]:
    """Decorator: register ``propose`` under ``name``."""

    def wrap(func: Callable[..., Proposal]) -> Callable[..., Proposal]:
        REGISTRY[name] = StrategyInfo(name, summary, func)
        return func

    return wrap
