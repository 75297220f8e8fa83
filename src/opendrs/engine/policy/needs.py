"""What a repair needs, as typed facts: a guest breaking a hard constraint (:class:`Broken`),
evacuated guests going back (:class:`GoingBack`), moves toward the failover headroom
(:class:`TowardFailover`), a cluster short of it (:class:`FailoverNeeded`). A decision carries
them (a repair's need, a blocked repair's, what a closed window holds back); the operator's
words for them are made at the edge (``report.reasons``). As details (``as_dict``: the
decision's ``need`` and ``blocked``) each is one flat object whose ``kind`` says which: a broken
constraint's kind (``maintenance``, ``rules``, ``anti-affinity``, ``affinity``, ``capacity``,
``hot``), ``return``, ``toward-failover`` or ``failover-needed``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class BrokenKind(StrEnum):
    """What a guest breaks (its node's, for ``capacity`` and ``hot``)."""

    #: On a node in maintenance.
    MAINTENANCE = "maintenance"
    #: On a node its architecture or strict node affinity excludes.
    RULES = "rules"
    #: On the node of a hard anti-affinity partner.
    ANTI_AFFINITY = "anti-affinity"
    #: Apart from its hard-affinity partners.
    AFFINITY = "affinity"
    #: On a node over a capacity limit.
    CAPACITY = "capacity"
    #: On a node only measured usage puts over the hot level (not over its capacity).
    HOT = "hot"


@dataclass(frozen=True)
class Broken:
    """What a guest (``guest``, its label) breaks on ``node``; for ``capacity`` and ``hot`` the
    node's (``guest`` None, every guest on it breaks the same): its ``dimensions`` over their
    limit, for ``hot`` the ``level`` (a share of capacity) and whether it is only ``forecast``
    to run hot."""

    kind: BrokenKind
    guest: str | None
    node: str
    dimensions: tuple[str, ...] = ()
    level: float | None = None
    forecast: bool = False

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"kind": self.kind.value, "node": self.node}
        if self.guest is not None:
            data["guest"] = self.guest
        if self.dimensions:
            data["dimensions"] = list(self.dimensions)
        if self.level is not None:
            data.update(level=self.level, forecast=self.forecast)
        return data


@dataclass(frozen=True)
class GoingBack:
    """``guests`` evacuated for maintenance going back to ``nodes``."""

    guests: int
    nodes: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"kind": "return", "guests": self.guests, "nodes": list(self.nodes)}


@dataclass(frozen=True)
class TowardFailover:
    """``migrations`` toward the failover headroom."""

    migrations: int

    def as_dict(self) -> dict[str, object]:
        return {"kind": "toward-failover", "migrations": self.migrations}


@dataclass(frozen=True)
class FailoverNeeded:
    """The cluster short of the failover headroom: ``summary``, the headroom's."""

    summary: str

    def as_dict(self) -> dict[str, object]:
        return {"kind": "failover-needed", "summary": self.summary}


#: What a repair (or what a closed window holds back) needs.
Need = Broken | GoingBack | TowardFailover | FailoverNeeded


def need_sentence(need: Need) -> str:
    """The need as the operator reads it: ``db (101) is on pve1, in maintenance``. The stuck
    guests' sentences (:attr:`Decision.stuck`, still made in the engine) use it; the decision's
    sentence is made at the edge."""
    match need:
        case GoingBack(guests=guests, nodes=nodes):
            return f"{guests} guest{'s' if guests != 1 else ''} back to {', '.join(nodes)}"
        case TowardFailover(migrations=migrations):
            return f"{migrations} toward the failover headroom"
        case FailoverNeeded(summary=summary):
            return summary
    return _broken_sentence(need)


def _broken_sentence(need: Broken) -> str:
    guest, node = need.guest, need.node
    match need.kind:
        case BrokenKind.MAINTENANCE:
            return f"{guest} is on {node}, in maintenance"
        case BrokenKind.RULES:
            return f"{guest} is on {node}, which its rules exclude"
        case BrokenKind.ANTI_AFFINITY:
            return f"{guest} shares {node} with a hard anti-affinity partner"
        case BrokenKind.AFFINITY:
            return f"{guest} is apart from its hard-affinity partners"
    dims = ", ".join(need.dimensions)
    if need.kind is BrokenKind.CAPACITY or need.level is None:
        return f"{node} is over capacity ({dims})"
    level = f"{need.level * 100:g} %"
    if need.forecast:
        return f"{node} is forecast to run hot ({dims} rising above {level})"
    return f"{node} runs hot ({dims} above {level})"
