"""Placement rules: node affinity (and pins), guest affinity, ignored guests.

The rules follow Proxmox VE 9's HA rules and ProxLB's tags, in one vocabulary:

* :class:`NodeAffinity` — a set of guests prefers (``strict=False``) or must use (``strict=True``)
  a set of nodes, each with a priority: the priorities are tiers, and a guest uses the highest tier
  that can take it (:mod:`opendrs.engine.constraints` decides which). A *pin* is a strict node
  affinity with equal priorities.
* :class:`GuestAffinity` — guests kept together (``positive``) or apart (``negative``); ``hard``
  rules are constraints, soft rules are penalties.
* ``ignored`` — guests that are never moved (they still load their node), each with the reason
  it is ignored when one is known (``ignore_reasons``: an HA resource set to ``ignored``, its
  ``auto-rebalance`` flag off, …).

A Proxmox VE 9.2 *negative* node affinity ("avoid these nodes") is read as the
:class:`NodeAffinity` on the other nodes (:func:`avoiding`), as Proxmox transforms it.

Every rule has an *origin* (:data:`ORIGINS`), which decides which of two contradictory rules
holds: a ``platform`` rule (Proxmox's HA rules and groups; Incus's cluster groups, projects
restricted to groups, pinned CPUs, members that take no automatic placement) comes before a
``config`` rule (written in an opendrs file: a snapshot's ``rules``), which comes before a
``pool`` rule (a Proxmox resource pool the configuration keeps together or apart: the backend's
``pools``), which comes before a ``tag`` (ProxLB's ``plb_*`` tags on Proxmox, opendrs's
``user.opendrs.*`` keys on Incus). A rule
is never weakened by one of a later origin: the later one is ignored, with a warning
(:func:`opendrs.engine.constraints.check_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

Origin = Literal["platform", "config", "pool", "tag"]
#: The origins of rules, first the one that holds when two rules contradict each other.
ORIGINS: Final[tuple[Origin, ...]] = ("platform", "config", "pool", "tag")
#: The name of the rule of the Proxmox resource pool ``pool`` (origin ``pool``).
POOL_RULE_PREFIX: Final = "pool "


def precedence(origin: Origin) -> int:
    """How early ``origin`` comes in :data:`ORIGINS` (0: the platform's, which holds)."""
    return ORIGINS.index(origin)


def _frozen_map(value: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True, slots=True)
class NodeAffinity:
    """Guests ``guests`` should (or, if ``strict``, must) run on ``nodes`` (node → priority)."""

    name: str
    guests: tuple[str, ...]
    nodes: Mapping[str, int]
    strict: bool = False
    origin: Origin = "config"

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", _frozen_map(self.nodes))

    def top_nodes(self, usable: set[str] | frozenset[str]) -> frozenset[str]:
        """The usable nodes of the highest priority present among the usable ones (Proxmox)."""
        tiers = self.tiers(usable)
        return tiers[0][1] if tiers else frozenset()

    def tiers(self, usable: set[str] | frozenset[str]) -> list[tuple[int, frozenset[str]]]:
        """The usable nodes grouped by priority, highest priority first."""
        by_priority: dict[int, set[str]] = {}
        for node, priority in self.nodes.items():
            if node in usable:
                by_priority.setdefault(priority, set()).add(node)
        return [(p, frozenset(by_priority[p])) for p in sorted(by_priority, reverse=True)]


@dataclass(frozen=True, slots=True)
class GuestAffinity:
    """Guests kept together (``positive``) or apart (negative); hard or soft."""

    name: str
    guests: tuple[str, ...]
    positive: bool
    hard: bool = True
    origin: Origin = "config"

    @property
    def kind(self) -> str:
        return "positive" if self.positive else "negative"


@dataclass(frozen=True, slots=True)
class Rules:
    """All placement rules of a cluster."""

    node_affinity: tuple[NodeAffinity, ...] = ()
    guest_affinity: tuple[GuestAffinity, ...] = ()
    ignored: frozenset[str] = field(default_factory=frozenset)
    #: Why an ignored guest is ignored (guest id → a short phrase), when it is known.
    ignore_reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "ignore_reasons",
            MappingProxyType(
                {g: r for g, r in self.ignore_reasons.items() if g in self.ignored and r}
            ),
        )

    def ignore_reason(self, guest_id: str) -> str | None:
        """Why ``guest_id`` is ignored, when it is and the reason is known."""
        return self.ignore_reasons.get(guest_id)

    def node_rules_for(self, guest_id: str) -> tuple[NodeAffinity, ...]:
        return tuple(r for r in self.node_affinity if guest_id in r.guests)

    def guest_rules_for(self, guest_id: str) -> tuple[GuestAffinity, ...]:
        return tuple(r for r in self.guest_affinity if guest_id in r.guests)


def avoiding(
    name: str,
    guests: tuple[str, ...],
    avoided: set[str],
    nodes: list[str],
    strict: bool,
    origin: Origin = "config",
) -> NodeAffinity | None:
    """A negative node affinity — ``guests`` avoid the nodes ``avoided`` — as the positive rule on
    the other ``nodes`` of the cluster, each at priority 0, as Proxmox VE 9.2 transforms it
    (pve-ha-manager ``Rules/NodeAffinity.pm``, ``invert_negative_node_affinity_rules``); ``None``
    when it names as many nodes as the cluster has: Proxmox drops such a rule
    (``check_nonempty_negative_nodes_complement``)."""
    if len(avoided) >= len(nodes):
        return None
    return NodeAffinity(name, guests, {n: 0 for n in nodes if n not in avoided}, strict, origin)
