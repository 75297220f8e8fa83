"""Why a decision moves nothing: what keeps each candidate where it is, grouped and counted."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from opendrs.engine.constraints import (
    Constraints,
    Held,
    current_assign,
    fails_back,
    movability,
)
from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.policy.state import PastMigrations
from opendrs.engine.strategies.pve import started_members
from opendrs.engine.usage import demand_rows, loaded_nodes, tolerance
from opendrs.model.cluster import Cluster, Guest
from opendrs.model.units import format_duration

#: :func:`~opendrs.engine.constraints.movability` reasons as group labels (prefix → label;
#: ``{}`` is the reason itself), per-guest details left out.
_HELD_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "ha-state": "in {}",
        "platform-balancer": "HA guests Proxmox VE balances itself (ha-auto-rebalance)",
        "local-device": "with local devices",
        "local-disks": "with local disks",
        "migrating": "already migrating",
        "container": "containers (restart migration not allowed)",
    }
)

#: Guests whose exclusion is checked for room in one array (guests × nodes × dimensions).
_WHY_CHUNK = 512


#: How many of the roomiest nodes are tried first for every guest that may move.
_WHY_ROOMIEST = 16


class WhyNot(NamedTuple):
    """The candidates of a decision that moves nothing: how many, how many may move, and the
    others grouped by what excludes them (label, count), the largest group first (said at the
    edge, ``report.reasons``)."""

    candidates: int
    movable: int
    excluded: tuple[tuple[str, int], ...]


def _uptime_label(seconds: float) -> str:
    return f"up for less than min_uptime {format_duration(seconds)}"


def _held_label(held: Held, cluster: Cluster) -> str:
    """A :func:`movability` verdict as a group label (per-guest details left out)."""
    if held.code == "uptime":
        return _uptime_label(cluster.settings.min_uptime)
    return _HELD_LABELS.get(held.code, "{}").format(held)


def _guard_label(
    guest: Guest, now: float, config: PolicyConfig, past: PastMigrations
) -> str | None:
    """The policy guard that keeps ``guest`` on its node (as :func:`forbidden_placements`)."""
    if past.cooldown_until.get(guest.id, -math.inf) > now:
        return "in cooldown"
    if config.min_uptime > 0 and guest.uptime < config.min_uptime and loaded_nodes(guest):
        return _uptime_label(config.min_uptime)
    return None


def why_not(
    cluster: Cluster, now: float, config: PolicyConfig, past: PastMigrations, cons: Constraints
) -> WhyNot:
    """Why the candidates — running guests on usable nodes — stay where they are.

    Each is counted under the first thing that excludes it: :func:`movability`, then the
    policy's cooldown and minimum uptime, then, node by node, no-return and failed migrations
    (``past``), the hard rules and room (``cons``: the capacity the decision checks). A guest
    with a node left to go to may move. Deterministic; pure.
    """
    usable = {n.name for n in cluster.nodes if n.usable}
    labels: dict[str, int] = {}
    free: list[int] = []
    outside = _outside_scope(cluster, config)
    for j, guest in enumerate(cluster.guests):
        if guest.node not in usable or guest.state == "stopped":
            continue
        verdict = movability(guest, cluster, "balance")
        held = _held_label(verdict, cluster) if verdict is not None else None
        held = held or outside.get(j) or _guard_label(guest, now, config, past)
        if held is None:
            free.append(j)
        else:
            labels[held] = labels.get(held, 0) + 1
    candidates = len(free) + sum(labels.values())
    movable = 0
    for label in _targets_left(cluster, now, config, past, cons, free):
        if label is None:
            movable += 1
        else:
            labels[label] = labels.get(label, 0) + 1
    excluded = tuple(sorted(labels.items(), key=lambda item: (-item[1], item[0])))
    return WhyNot(candidates, movable, excluded)


def _outside_scope(cluster: Cluster, config: PolicyConfig) -> dict[int, str]:
    """Guest index → why the policy's strategy never moves it by itself: ``pve-bruteforce`` and
    ``pve-topsis`` with ``scope: ha`` (the ``proxmox`` preset) move only HA resources in the
    state ``started``, as Proxmox's own balancer does."""
    if getattr(config.strategy_options, "scope", None) != "ha":
        return {}
    started = started_members(cluster, "ha")
    label = f"not started HA resources ({config.strategy} moves only those)"
    return {j: label for j in range(len(cluster.guests)) if not started[j]}


def _policy_off(
    cluster: Cluster, now: float, config: PolicyConfig, past: PastMigrations, guests: set[str]
) -> dict[str, dict[int, str]]:
    """Guest id → node index → which guard keeps the guest off that node: ``no_return`` or a
    failed migration (``past.avoid``), for ``guests``."""
    node_index = cluster.node_index
    off: dict[str, dict[int, str]] = {}
    if config.no_return > 0:
        gone = f"no_return {format_duration(config.no_return)}"
        for guest_id, left in past.departures.items():
            for node, when in left:
                if guest_id in guests and now - when < config.no_return and node in node_index:
                    off.setdefault(guest_id, {})[node_index[node]] = gone
    for (guest_id, node), until in past.avoid.items():
        if until > now and guest_id in guests and node in node_index:
            off.setdefault(guest_id, {}).setdefault(
                node_index[node], "avoided after a failed migration"
            )
    return off


def _targets_left(
    cluster: Cluster,
    now: float,
    config: PolicyConfig,
    past: PastMigrations,
    cons: Constraints,
    free: list[int],
) -> list[str | None]:
    """For each guest of ``free`` (indices of guests that may move), None when some other
    usable node takes it, else why none does."""
    if not free:
        return []
    off = _policy_off(cluster, now, config, past, {cluster.guests[j].id for j in free})
    assign = current_assign(cluster)
    cap = cons.capacity
    room = cap.limit - cap.committed() + tolerance(cap.limit)
    strict: dict[str, list[str]] = {}
    for rule in cons.rules.node_affinity:
        if rule.strict:
            for guest_id in rule.guests:
                strict.setdefault(guest_id, []).append(rule.name)
    left = _TargetCheck(cons, assign, off, room, frozenset(free), strict)
    found: dict[int, str | None] = {}
    every = np.array(free, dtype=np.intp)
    # Most guests fit on one of the roomiest nodes: try those first, then every node.
    share = np.where(cap.limit > 0, room / np.where(cap.limit > 0, cap.limit, 1.0), np.inf)
    roomiest = np.argsort(-share.min(axis=1), kind="stable")[:_WHY_ROOMIEST]
    for j in every[_somewhere(cons, assign, room, every, roomiest)].tolist():
        if left.alone(j):
            found[j] = None
    rest = np.array([j for j in free if j not in found], dtype=np.intp)
    for start in range(0, len(rest), _WHY_CHUNK):
        chunk = rest[start : start + _WHY_CHUNK]
        other = np.repeat(cons.usable[None, :], len(chunk), axis=0)
        other[np.arange(len(chunk)), assign[chunk]] = False
        rules = cons.arch_ok[chunk] & cons.strict_ok[chunk]
        fits = np.all(cap.demand[chunk][:, None, :] <= room[None, :, :], axis=2)
        for row, j in enumerate(chunk.tolist()):
            found[j] = left(j, other[row], rules[row], fits[row])
    return [found[j] for j in free]


def _somewhere(
    cons: Constraints, assign: np.ndarray, room: np.ndarray, guests: np.ndarray, nodes: np.ndarray
) -> np.ndarray:
    """(G',) whether one of ``nodes`` other than its own is usable, allowed by architecture and
    strict node affinity, and has room, for each of ``guests``."""
    pick = np.ix_(guests, nodes)
    ok = cons.arch_ok[pick] & cons.strict_ok[pick] & cons.usable[nodes][None, :]
    ok &= assign[guests][:, None] != nodes[None, :]
    ok &= np.all(cons.capacity.demand[guests][:, None, :] <= room[nodes][None, :, :], axis=2)
    return np.any(ok, axis=1)


#: What keeps a guest off another node, in reporting order, and the label when it is the only
#: thing (None: named in a list).
_NODE_GUARDS: tuple[tuple[str, str | None], ...] = (
    ("no_return", None),
    ("avoided", None),
    ("platform", "with no node the platform can move it to"),
    ("rules", "with no node their rules allow"),
    ("failback", "with HA failback on, kept to their top node-affinity tier"),
    ("room", "with no node that has room"),
)


class _TargetCheck(NamedTuple):
    """Whether a guest that may move has another usable node to go to."""

    cons: Constraints
    assign: np.ndarray
    #: Guest id → node index → the policy guard that keeps it off the node.
    off: Mapping[str, Mapping[int, str]]
    #: (N, D) free capacity, rounding slack included.
    room: np.ndarray
    free: frozenset[int]
    #: Guest id → the names of its strict node-affinity rules.
    strict: Mapping[str, list[str]]

    def _strict_rules(self, j: int, nodes: np.ndarray) -> str:
        """`` (NAMES)``: the strict node-affinity rules of guest ``j`` when they refuse some of
        ``nodes`` (so the operator reads which setting keeps it), else nothing."""
        cons = self.cons
        if not np.any(nodes & ~cons.strict_ok[j]):
            return ""
        names = self.strict.get(cons.cluster.guests[j].id)
        return f" ({'; '.join(names)})" if names else ""

    def alone(self, j: int) -> bool:
        """Whether guest ``j`` is free of bundles, hard anti-affinity and node guards."""
        cons = self.cons
        guest_id = cons.cluster.guests[j].id
        return cons.group_of[j] < 0 and not cons.hard_neg[j].size and guest_id not in self.off

    def failback_only(self, j: int) -> bool:
        """Whether guest ``j``'s node affinity binds it only because the HA manager fails it
        back (its rules are not strict)."""
        guest = self.cons.cluster.guests[j]
        rules = self.cons.rules.node_rules_for(guest.id)
        return fails_back(guest) and bool(rules) and not any(r.strict for r in rules)

    def __call__(
        self, j: int, other: np.ndarray, rules: np.ndarray, fits: np.ndarray
    ) -> str | None:
        """None when guest ``j`` (or its hard-affinity bundle) may go to one of the ``other``
        nodes (``rules``, ``fits``: the nodes the rules allow, with room), else why not."""
        cons, assign = self.cons, self.assign
        group = int(cons.group_of[j])
        if group >= 0:  # the bundle moves whole: its demand, its members' anti-affinity
            members = cons.groups[group]
            if not self.free.issuperset(members.tolist()):
                return "with hard-affinity partners that may not move"
            assign = assign.copy()
            assign[members] = -1
            fits = np.all(demand_rows(cons.capacity, members.tolist()) <= self.room, axis=1)
        if cons.hard_neg[j].size:
            rules = rules & ~cons.occupied(assign, cons.hard_neg[j])
        if not other.any():
            return "with no other usable node"
        guards = self.off.get(cons.cluster.guests[j].id, {})
        kept = np.zeros_like(other)
        kept[list(guards)] = True
        if np.any(other & ~kept & rules & fits):
            return None
        kinds = {why.split()[0]: why for n, why in guards.items() if other[n]}
        # The platform's own limits (replication targets, mapped devices) apart from the rules.
        platform = cons.limits_ok[j]
        if np.any(other & ~kept & ~platform):
            kinds["platform"] = "the platform's limits"
        excluded = other & ~kept & platform & ~rules
        if np.any(excluded):
            # A non-strict rule binds a guest the HA manager fails back: say which it is.
            back = np.zeros_like(excluded)
            if self.failback_only(j):
                back = excluded & ~cons.strict_ok[j]
            if back.any():
                kinds["failback"] = "HA failback to the top tier"
            if np.any(excluded & ~back):
                kinds["rules"] = "rules"
        if np.any(other & ~kept & rules & ~fits):
            kinds["room"] = "no room"
        if "rules" in kinds:
            kinds["rules"] += self._strict_rules(j, other & ~kept)
        named = [(kinds[key], alone) for key, alone in _NODE_GUARDS if key in kinds]
        if len(named) == 1 and named[0][1] is not None:
            if "rules" in kinds:
                return named[0][1] + kinds["rules"].removeprefix("rules")
            return named[0][1]
        return "with no node to go to (" + ", ".join(text for text, _alone in named) + ")"
