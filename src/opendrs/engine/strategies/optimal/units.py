"""Cutting ``optimal``'s guests into units: hard-affinity bundles (merged) and single guests,
each with the nodes it may use, and what the rules say while doing so — a note in relaxed mode,
a reason for infeasibility in strict mode (:class:`Messages`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opendrs.engine.constraints import (
    Constraints,
    Rejection,
    RejectionCode,
    fails_back,
    movability,
)
from opendrs.model.cluster import Cluster


def _negative_conflicts(cons: Constraints) -> list[tuple[str, list[str]]]:
    """Hard negative rules with two or more guests in one hard-affinity bundle."""
    gidx = cons.cluster.guest_index
    out = []
    for rule in cons.rules.guest_affinity:
        if rule.positive or not rule.hard:
            continue
        groups = [int(cons.group_of[gidx[g]]) for g in rule.guests if g in gidx]
        seen: dict[int, int] = {}
        for grp in groups:
            if grp >= 0:
                seen[grp] = seen.get(grp, 0) + 1
        clashing = [grp for grp, count in seen.items() if count > 1]
        if clashing:
            members = cons.groups[clashing[0]]
            names = sorted(
                cons.cluster.guests[m].id
                for m in members.tolist()
                if cons.cluster.guests[m].id in rule.guests
            )
            out.append((rule.name, names))
    return out


def rejection(cons: Constraints, j: int, n: int) -> Rejection | None:
    """Why the static constraints refuse node ``n`` to guest ``j`` (None: they allow it); the
    detail of an architecture or node-affinity refusal is this model's short phrase for it."""
    node = cons.cluster.nodes[n]
    if not node.online:
        return Rejection(RejectionCode.OFFLINE, node.name)
    if node.maintenance:
        return Rejection(RejectionCode.MAINTENANCE, node.name)
    if not cons.arch_ok[j, n]:
        return Rejection(RejectionCode.ARCH, node.name, f"architecture {node.arch}")
    if not cons.strict_ok[j, n]:
        guest = cons.cluster.guests[j]
        rules = cons.rules.node_rules_for(guest.id)
        names = [r.name for r in rules if r.strict]
        if not names and fails_back(guest):
            detail = "HA failback (" + ", ".join(r.name for r in rules) + ")"
        else:
            detail = "strict node affinity" + (f" ({', '.join(names)})" if names else "")
        return Rejection(RejectionCode.NODE_AFFINITY, node.name, detail)
    if not cons.permitted[j, n]:
        return Rejection(RejectionCode.FORBIDDEN, node.name)
    return None


def phrase(refused: Rejection | None) -> str:
    """This model's short phrase for a static refusal, in its notes and reasons."""
    if refused is None:
        return "allowed"
    return refused.detail or refused.code.value


@dataclass
class Messages:
    """The notes and, in strict mode, the reasons for infeasibility found while building."""

    strict: bool
    notes: list[str] = field(default_factory=list)
    infeasible: list[str] = field(default_factory=list)

    def either(self, text: str, relaxed: str = "") -> None:
        """``text`` makes the problem infeasible in strict mode; else it is a note, ``relaxed``
        saying what happens instead."""
        if self.strict:
            self.infeasible.append(text)
        else:
            self.notes.append(text + relaxed)


def contradictions(cons: Constraints, say: Messages) -> set[str]:
    """Report the contradictory rules (dropped in relaxed mode) and the hard negative rules
    that hard affinity contradicts; the names of those negative rules dropped."""
    for problem in cons.problems:
        if say.strict:
            quoted = ", ".join(f"'{r}'" for r in problem.rules)
            say.infeasible.append(
                f"rule{'s' if len(problem.rules) > 1 else ''} {quoted}: {problem.reason}"
            )
        else:
            say.notes.append(str(problem))
    dropped_neg: set[str] = set()
    for rule_name, members in _negative_conflicts(cons):
        together = ", ".join(f"'{m}'" for m in members)
        if say.strict:
            say.infeasible.append(
                f"rule '{rule_name}' keeps {together} apart, hard affinity together"
            )
        else:
            say.notes.append(
                f"Drop rule '{rule_name}', because hard affinity keeps {together} together"
            )
            dropped_neg.add(rule_name)
    return dropped_neg


def current_nodes(
    cluster: Cluster, usable: np.ndarray, say: Messages
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Each guest's node index (-1 unknown: left out, with a note), whether it is in the model,
    and why it may not move (None: it may)."""
    guests = cluster.guests
    cur = np.array([cluster.node_index.get(g.node, -1) for g in guests], dtype=np.intp)
    present = cur >= 0
    for j in np.nonzero(~present)[0].tolist():
        say.notes.append(f"guest {guests[j].id} is on unknown node {guests[j].node}: left out")
    why_fixed: list[str | None] = []
    for j, guest in enumerate(guests):
        if not present[j]:
            why_fixed.append("unknown node")
            continue
        purpose = "balance" if usable[cur[j]] else "evacuate"
        held = movability(guest, cluster, purpose)
        why_fixed.append(None if held is None else str(held))
    return cur, present, why_fixed


class UnitBuilder:
    """Cuts the guests into units: hard-affinity bundles (merged) and single guests, with their
    domains. ``held`` marks guests kept on their node: they may not move, or (relaxed mode)
    cannot go anywhere."""

    def __init__(
        self,
        cons: Constraints,
        cur: np.ndarray,
        movable: np.ndarray,
        why_fixed: list[str | None],
        say: Messages,
    ) -> None:
        self.cons = cons
        self.cur = cur
        self.movable = movable
        self.why_fixed = why_fixed
        self.say = say
        self.guests = cons.cluster.guests
        self.names = [n.name for n in cons.cluster.nodes]
        self.static = cons.static_ok()
        self.units: list[np.ndarray] = []
        self.domain: list[np.ndarray] = []
        self.held = np.zeros(len(self.guests), dtype=bool)

    def build(self, present: np.ndarray) -> np.ndarray:
        """Cut the guests ``present`` into units; the unit of each guest (-1: absent)."""
        n_guests = len(self.guests)
        in_group = np.zeros(n_guests, dtype=bool)
        for group in self.cons.groups:
            members = group[present[group]]
            in_group[members] = True
            if members.size:
                self.group(members)
        for j in range(n_guests):
            if present[j] and not in_group[j]:
                self.single(j)
        unit_of = np.full(n_guests, -1, dtype=np.intp)
        for u, members in enumerate(self.units):
            unit_of[members] = u
        return unit_of

    def add(self, members: np.ndarray, dom: np.ndarray) -> None:
        self.units.append(members)
        self.domain.append(dom)

    def hold(self, j: int) -> None:
        self.held[j] = True
        self.add(np.array([j], dtype=np.intp), np.array([self.cur[j]], dtype=np.intp))

    def single(self, j: int) -> None:
        """Guest ``j`` as a unit of its own."""
        cur, names, guest_id = self.cur, self.names, self.guests[j].id
        if not self.movable[j]:
            if self.say.strict and not self.static[j, cur[j]]:
                self.say.infeasible.append(
                    f"guest {guest_id} may not move ({self.why_fixed[j]}) but node "
                    f"{names[cur[j]]} is not allowed for it "
                    f"({phrase(rejection(self.cons, j, int(cur[j])))})"
                )
            self.hold(j)
            return
        dom = np.nonzero(self.static[j])[0]
        if dom.size == 0:
            reasons = "; ".join(
                f"{names[n]}: {phrase(rejection(self.cons, j, n))}" for n in range(len(names))
            )
            text = f"no node can take guest {guest_id} ({reasons or 'no nodes'})"
            self.say.either(text, f": it stays on {names[cur[j]]}")
            self.hold(j)
            return
        self.add(np.array([j], dtype=np.intp), dom)

    def apart(self, text: str, members: np.ndarray) -> None:
        self.say.either(text, ": kept apart")
        for m in members.tolist():
            self.single(m)

    def group(self, members: np.ndarray) -> None:
        """A hard-affinity group's guests ``members`` (present ones) as one unit where they can
        be: on the node of those that may not move, or anywhere all of them are allowed."""
        label = ", ".join(self.guests[m].label for m in members.tolist())
        movable = self.movable[members]
        fixed_nodes = sorted(set(self.cur[members[~movable]].tolist()))
        ok = np.all(self.static[members[movable]], axis=0)
        if len(fixed_nodes) > 1:
            where = ", ".join(self.names[n] for n in fixed_nodes)
            self.apart(
                f"hard affinity group {label}: guests that may not move sit on {where}", members
            )
        elif fixed_nodes:
            self.gather(members, label, fixed_nodes[0])
        elif np.any(ok):
            self.add(members, np.nonzero(ok)[0])
        else:
            text = f"no node can take hard affinity group {label} (no node is allowed for all)"
            self.say.either(text, ": its guests stay where they are")
            for m in members.tolist():
                self.hold(m)

    def gather(self, members: np.ndarray, label: str, f: int) -> None:
        """Gather the group on node ``f``, of its guests that may not move: those already there
        stay, the others join if they may go there."""
        cur, static, name = self.cur, self.static, self.names[f]
        joins = (cur[members] == f) | static[members, f]
        blocked = members[~joins]
        if self.say.strict and (blocked.size or not np.all(static[members, f])):
            self.say.infeasible.append(
                f"hard affinity group {label} cannot gather on {name}, "
                "where some of its guests may not move"
            )
        if blocked.size:
            who = ", ".join(self.guests[m].label for m in blocked.tolist())
            self.say.notes.append(
                f"hard affinity group {label}: {who} may not join {name}, where the "
                "others may not move: kept apart"
            )
        staying = members[joins]
        self.held[staying[cur[staying] == f]] = True
        self.add(staying, np.array([f], dtype=np.intp))
        for m in blocked.tolist():
            self.single(m)


__all__ = ["Messages", "UnitBuilder", "contradictions", "current_nodes", "rejection"]
