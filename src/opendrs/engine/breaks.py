"""Rule breaks: which guests break a placement rule right now, and how.

Read from the cluster as it is, on the rules :func:`~opendrs.engine.constraints.check_rules` keeps
(a dropped rule is reported as a rule problem instead): a hard or soft anti-affinity rule whose
guests share a node, an affinity rule whose guests are spread over several nodes, a guest outside
the nodes its node affinity names (a strict rule is hard, a preference soft). Stopped guests count
where they are, as the engine places them. ``opendrs show`` lists the breaks, and the policy repairs
the hard ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from opendrs.engine.constraints import check_rules
from opendrs.model.cluster import Cluster
from opendrs.model.rules import Rules


@dataclass(frozen=True, slots=True)
class RuleBreak:
    """Guests that break one rule, on the nodes named."""

    rule: str
    #: ``anti-affinity``, ``affinity`` or ``node-affinity``.
    kind: str
    hard: bool
    guests: tuple[str, ...]
    nodes: tuple[str, ...]

    def __str__(self) -> str:
        return self.describe()

    def describe(self, label: Callable[[str], str] = str) -> str:
        """The break in a sentence, each guest as ``label`` names it (default: its id)."""
        strength = "hard" if self.hard else "soft"
        guests = ", ".join(label(g) for g in self.guests)
        nodes = ", ".join(self.nodes)
        if self.kind == "anti-affinity":
            what = f"{guests} share {nodes}"
        elif self.kind == "affinity":
            what = f"{guests} are spread over {nodes}"
        else:
            noun = "runs" if len(self.guests) == 1 else "run"
            what = f"{guests} {noun} on {nodes}, outside its nodes"
        return f"{self.rule} ({strength} {self.kind}): {what}"

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule,
            "kind": self.kind,
            "hard": self.hard,
            "guests": list(self.guests),
            "nodes": list(self.nodes),
            "text": str(self),
        }


def rule_breaks(cluster: Cluster, kept: Rules | None = None) -> list[RuleBreak]:
    """Every rule broken now, hard ones first, then by rule name (``kept``: the rules
    :func:`check_rules` keeps, when the caller has them)."""
    rules = kept if kept is not None else check_rules(cluster).rules
    where = {g.id: g.node for g in cluster.guests}
    found: list[RuleBreak] = []
    for rule in rules.guest_affinity:
        members = sorted({g for g in rule.guests if g in where}, key=_order)
        by_node: dict[str, list[str]] = defaultdict(list)
        for gid in members:
            by_node[where[gid]].append(gid)
        if rule.positive and len(by_node) > 1:
            nodes = tuple(sorted(by_node))
            found.append(RuleBreak(rule.name, "affinity", rule.hard, tuple(members), nodes))
        elif not rule.positive:
            for node in sorted(by_node):
                if len(by_node[node]) > 1:
                    guests = tuple(by_node[node])
                    found.append(RuleBreak(rule.name, "anti-affinity", rule.hard, guests, (node,)))
    for affinity in rules.node_affinity:
        outside = [g for g in sorted(affinity.guests, key=_order) if g in where]
        outside = [g for g in outside if where[g] not in affinity.nodes]
        for gid in outside:
            found.append(
                RuleBreak(affinity.name, "node-affinity", affinity.strict, (gid,), (where[gid],))
            )
    return sorted(found, key=lambda b: (not b.hard, b.rule, b.kind, b.nodes, b.guests))


def _order(gid: str) -> tuple[int, int | str]:
    """Numeric ids in number order, then the others by name."""
    return (0, int(gid)) if gid.isdigit() else (1, gid)
