"""Constraints: hard filters as vectorised (guest, node) masks, soft rules as penalties.

Hard filters, in the order they are reported when a node is rejected:

1. ``offline`` / ``maintenance`` — the node cannot take guests;
2. ``arch`` — the node's CPU architecture differs from the guest's;
3. ``platform`` — the platform cannot move the guest there (:attr:`Guest.limits
   <opendrs.model.cluster.Guest.limits>`: a replicated VM outside its replication targets, a
   mapped device the node lacks), with the platform's reason;
4. ``node-affinity`` — a strict rule allows only its nodes of the highest priority that can take
   the guest: usable, of its architecture, with room for it (pins too; :func:`_affinity_tiers`);
   so does a non-strict rule for an HA guest with ``failback`` on (:func:`binding`), whom the HA
   manager would move back to its highest-priority nodes whatever a plan does;
5. ``forbidden`` — the placement was ruled out (no safe migration order reaches it);
6. ``anti-affinity`` — a hard negative partner runs on (or is moving to) the node;
7. ``affinity`` — hard positive partners run elsewhere;
8. ``capacity`` — vCPUs × overcommit, memory, measured use, or a local storage pool would overflow.

Whether a guest may move at all (:func:`movability`) is separate: ignored, HA states the HA manager
or an operator handles (:data:`HA_HELD`), locked, local devices, local disks, containers without
restart migration, stopped guests, minimum uptime.

Soft rules become penalties (:data:`SOFT_PENALTY` each): a non-strict node affinity not met, a
soft positive partner elsewhere, a soft negative partner on the same node.

Rules that contradict each other are found up front (:func:`check_rules`) and dropped with a
message naming them, as Proxmox's HA rule checks do.

The (guest, node) masks are stored by distinct row (:class:`~.sparse_rows.RowMask`) and the
partner lists as one flat array (:class:`~.sparse_rows.Partners`), built from the guests the rules
name: at 100,000 guests and 1,000 nodes a dense mask is 100 MB, most of it the same row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

import numpy as np

from opendrs.model.cluster import Cluster, Guest
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, Origin, Rules, precedence
from opendrs.model.units import format_bytes, format_duration

from .sparse_rows import Partners, RowMask, pairs_within
from .usage import CapacityModel, Dimension, MeasuredUsage, loaded_nodes, tolerance

Purpose = Literal["balance", "evacuate", "recover", "new"]

#: Penalty added to a placement score for each broken soft rule.
SOFT_PENALTY = 1.0


# --------------------------------------------------------------------------------------------
# Rule checks


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """A rule dropped because it contradicts others or cannot be met.

    ``over`` names the rules of an earlier origin (:data:`~opendrs.model.rules.ORIGINS`) that
    it contradicts, when they hold instead: the dropped rules are then *ignored* — a warning, not
    an error in the rules (``origin`` is theirs)."""

    rules: tuple[str, ...]
    reason: str
    over: tuple[str, ...] = ()
    origin: Origin = "config"

    @property
    def ignored(self) -> bool:
        """Whether rules of an earlier origin hold instead (a warning)."""
        return bool(self.over)

    def __str__(self) -> str:
        names = ", ".join(f"'{r}'" for r in self.rules)
        noun = "rule" if len(self.rules) == 1 else "rules"
        if self.over:
            return f"Ignore {_ORIGIN_WORDS[self.origin]} {noun} {names}, because {self.reason}"
        return f"Drop {noun} {names}, because {self.reason}"


#: How a message names the rules of each origin.
_ORIGIN_WORDS: Mapping[str, str] = MappingProxyType(
    {"platform": "platform", "config": "configured", "tag": "tag"}
)

AnyRule = NodeAffinity | GuestAffinity


class _Dropping:
    """The rules dropped so far (node and guest rules apart: an Incus node rule's name is shared
    by every instance it confines) and a problem per drop."""

    def __init__(self) -> None:
        self.node: set[str] = set()
        self.guest: set[str] = set()
        self.problems: list[RuleProblem] = []

    def kept(self, rule: AnyRule) -> bool:
        return rule.name not in (self.node if isinstance(rule, NodeAffinity) else self.guest)

    def drop(self, rules: Sequence[AnyRule], problem: RuleProblem) -> None:
        self.drop_quietly(rules)
        self.problems.append(problem)

    def drop_quietly(self, rules: Sequence[AnyRule]) -> None:
        """Drop ``rules`` that a problem already names."""
        for rule in rules:
            (self.node if isinstance(rule, NodeAffinity) else self.guest).add(rule.name)

    def by_origin(self, involved: Sequence[AnyRule], what: str) -> bool:
        """When the ``involved`` rules of one contradiction (``what``: what it is) are of
        different origins, drop those of the latest origin, as ignored in
        favour of the earliest ones; True if so. False (nothing dropped) when all are of one
        origin."""
        ranks = {precedence(r.origin) for r in involved}
        if len(ranks) < 2:
            return False
        first, last = min(ranks), max(ranks)
        holding = tuple(dict.fromkeys(r.name for r in involved if precedence(r.origin) == first))
        going = [r for r in involved if precedence(r.origin) == last]
        origin = going[0].origin
        names = ", ".join(f"'{n}'" for n in holding)
        held = _ORIGIN_WORDS[ORIGINS[first]]
        noun = "rule" if len(holding) == 1 else "rules"
        verb = "holds" if len(holding) == 1 else "hold"
        reason = f"{what}, and {held} {noun} {names} {verb}"
        problem = RuleProblem(tuple(dict.fromkeys(r.name for r in going)), reason, holding, origin)
        self.drop(going, problem)
        return True


def _usable_nodes(cluster: Cluster) -> frozenset[str]:
    return frozenset(n.name for n in cluster.nodes if n.usable)


def _affinity_tiers(
    cluster: Cluster, rules: Rules, capacity: CapacityModel, arch_ok: RowMask
) -> tuple[np.ndarray, np.ndarray]:
    """(G,) the node-affinity priority each guest uses (-1: no rule, or no usable node in it),
    and (G,) the node each claims (-1: none).

    Priorities are tiers: a guest uses the highest tier with a node that can take it — usable,
    of its architecture, with room for it (its own node counts its own room as free), and not
    claimed by a hard anti-affinity partner. The guests of a rule claim a node in turn, those on
    the rule's higher-priority nodes first, then by id, so two guests never count on the same
    free room. When no tier can take it, the highest usable tier applies (and the filters say
    why the guest cannot go there). HA-managed guests with ``failback`` on always use the highest
    usable tier: Proxmox's HA manager moves them back there, whatever the load.
    """
    usable = _usable_nodes(cluster)
    tier = np.full(len(cluster.guests), -1, dtype=np.int64)
    headroom = capacity.limit - capacity.committed()
    gidx = cluster.guest_index
    apart: dict[int, set[int]] = defaultdict(set)
    for neg in rules.guest_affinity:
        if not neg.positive and neg.hard:
            members = {gidx[g] for g in neg.guests if g in gidx}
            for j in members:
                apart[j] |= members - {j}
    claimed = np.full(len(cluster.guests), -1, dtype=np.intp)
    for rule in rules.node_affinity:
        tiers = rule.tiers(usable)
        if not tiers:
            continue
        members = [gidx[g] for g in rule.guests if g in gidx]
        members.sort(
            key=lambda j: (
                -_priority_on(rule, cluster.guests[j].node, usable),
                cluster.guests[j].id,
            )
        )
        for j in members:
            taken = {int(claimed[p]) for p in apart.get(j, ())}
            tier[j], claimed[j] = _claim_tier(
                cluster, j, tiers, capacity, headroom, arch_ok[j], taken
            )
    return tier, claimed


def fails_back(guest: Guest) -> bool:
    """Whether the HA manager moves ``guest`` back to its highest-priority available nodes every
    round (an HA resource with ``failback`` on; pve-ha-manager ``Manager.pm``
    ``select_service_node``)."""
    return guest.ha and guest.failback


def binding(rule: NodeAffinity, guest: Guest) -> bool:
    """Whether ``rule`` is a hard filter for ``guest``: a strict rule, or any rule of a guest
    that :func:`fails_back` — a plan that puts it below its top tier is undone by the HA
    manager, and opendrs would move it again."""
    return rule.strict or fails_back(guest)


def _priority_on(rule: NodeAffinity, node: str, usable: frozenset[str]) -> int:
    return rule.nodes.get(node, -1) if node in usable else -1


def _claim_tier(
    cluster: Cluster,
    j: int,
    tiers: list[tuple[int, frozenset[str]]],
    capacity: CapacityModel,
    headroom: np.ndarray,
    arch_ok: np.ndarray,
    taken: set[int],
) -> tuple[int, int]:
    """The priority guest ``j`` uses and the node it claims (-1: none); its demand is taken off
    ``headroom`` there. ``taken``: nodes its hard anti-affinity partners claimed."""
    guest = cluster.guests[j]
    here = cluster.node_index.get(guest.node, -1)
    if fails_back(guest):
        return tiers[0][0], here if guest.node in tiers[0][1] else -1
    need = capacity.moving[j].copy()

    def room(n: int) -> np.ndarray:
        return headroom[n] + need if n == here else headroom[n]

    for priority, names in tiers:
        fits = [
            n
            for n in sorted(cluster.node_index[name] for name in names)
            if arch_ok[n]
            and n not in taken
            and np.all(need <= room(n) + tolerance(capacity.limit[n]))
        ]
        if fits:
            # Where it stays, or the node of the tier with the most free memory.
            target = (
                here
                if here in fits
                else min(fits, key=lambda n: (-room(n)[1], cluster.nodes[n].name))
            )
            if here >= 0:
                headroom[here] += need
            headroom[target] -= need
            return priority, target
    return tiers[0][0], -1


def check_rules(cluster: Cluster) -> tuple[Rules, list[RuleProblem]]:
    """Drop contradictory rules; return the rules that remain and a problem per dropped rule.

    Mirrors Proxmox's HA rule checks (``PVE::HA::Rules`` and its plugins), on opendrs's rules:

    * a guest in more than one node-affinity rule: all those rules are dropped;
    * a guest-affinity rule with fewer than two guests;
    * a hard negative rule with more guests than the cluster has nodes — usable or not: a node in
      maintenance or offline keeps the rule, whose guests stay apart where they can (Proxmox
      counts the configured nodes);
    * a positive and a negative rule that share two or more guests: both dropped when both are
      hard or both soft; a soft rule never makes a hard one go: only the soft one is dropped.
      Likewise a hard negative rule with two guests that hard positive rules join through shared
      guests;
    * hard negative members confined by strict node affinity to fewer nodes than members;
    * a hard positive group whose members' strict node affinities have no node in common.

    Rules of different origins that contradict each other: those of the latest origin
    (:data:`~opendrs.model.rules.ORIGINS`: platform, config, tag) are ignored — problems whose
    ``over`` names the rules that hold — and the check is made again on the rest.
    """
    rules = cluster.rules
    configured = frozenset(n.name for n in cluster.nodes)
    dropping = _Dropping()
    _node_rule_overlaps(rules.node_affinity, dropping)
    _malformed_guest_rules(rules.guest_affinity, len(configured), dropping)
    _opposite_rules(rules.guest_affinity, dropping)
    _merged_contradictions(rules.guest_affinity, dropping)
    _confined_negatives(rules, configured, dropping)
    _no_common_node(rules, configured, dropping)
    kept = Rules(
        node_affinity=tuple(r for r in rules.node_affinity if dropping.kept(r)),
        guest_affinity=tuple(r for r in rules.guest_affinity if dropping.kept(r)),
        ignored=rules.ignored,
        ignore_reasons=rules.ignore_reasons,
    )
    return kept, dropping.problems


#: One contradiction a check finds: the rules involved (every origin), the rules that go when
#: they are of one origin, the problem then, and what the contradiction is (for a rule ignored
#: in favour of one of an earlier origin, after "… because").
Contradiction = tuple[list[AnyRule], list[AnyRule], RuleProblem, str]


def _settle(find: Callable[[], Iterator[Contradiction]], dropping: _Dropping) -> None:
    """Settle the contradictions ``find`` yields (on the rules kept when it is called): first,
    again and again, each between rules of different origins — the later origin's go — then
    those left, each among rules of one origin, as the check drops them."""
    while any(dropping.by_origin(involved, what) for involved, _, _, what in find()):
        pass
    for _, going, problem, _ in find():
        dropping.drop(going, problem)


def _node_rule_overlaps(rules: Sequence[NodeAffinity], dropping: _Dropping) -> None:
    """The node-affinity rules that share a guest: all are dropped (a problem per guest)."""

    def find() -> Iterator[Contradiction]:
        by_guest: dict[str, list[NodeAffinity]] = defaultdict(list)
        for rule in rules:
            if dropping.kept(rule):
                for guest in rule.guests:
                    by_guest[guest].append(rule)
        for guest, named in sorted(by_guest.items()):
            if len(named) > 1:
                fresh = tuple(r.name for r in named if dropping.kept(r))
                what = f"guest '{guest}' is in more than one node-affinity rule"
                yield list(named), list(named), RuleProblem(fresh, what), what

    def find_fresh() -> Iterator[Contradiction]:
        for involved, going, problem, what in find():
            if problem.rules:
                yield involved, going, problem, what
            else:
                dropping.drop_quietly(going)

    _settle(find_fresh, dropping)


def _malformed_guest_rules(
    rules: Sequence[GuestAffinity], n_nodes: int, dropping: _Dropping
) -> None:
    """Guest-affinity rules with fewer than two guests, hard negative ones with more guests than
    the ``n_nodes`` nodes."""
    for rule in rules:
        if len(set(rule.guests)) < 2:
            dropping.drop([rule], RuleProblem((rule.name,), "it names fewer than two guests"))
        elif not rule.positive and rule.hard and len(set(rule.guests)) > n_nodes:
            dropping.drop(
                [rule],
                RuleProblem(
                    (rule.name,),
                    f"it keeps {len(set(rule.guests))} guests apart on only {n_nodes} nodes",
                ),
            )


def _sharing_two(
    guests: Iterable[str], rules: Sequence[GuestAffinity], by_guest: Mapping[str, list[int]]
) -> list[GuestAffinity]:
    """The ``rules`` that name two or more of ``guests``, in their order (``by_guest``: the
    :func:`_rules_by_guest` of ``rules``; no pair of rules is compared)."""
    hits: dict[int, int] = defaultdict(int)
    for guest in set(guests):
        for k in by_guest.get(guest, ()):
            hits[k] += 1
    return [rules[k] for k in sorted(k for k, n in hits.items() if n >= 2)]


def _rules_by_guest(rules: Sequence[GuestAffinity]) -> dict[str, list[int]]:
    """guest → the positions in ``rules`` of the rules naming it (each once)."""
    out: dict[str, list[int]] = defaultdict(list)
    for k, rule in enumerate(rules):
        for guest in dict.fromkeys(rule.guests):
            out[guest].append(k)
    return out


def _opposite_rules(rules: Sequence[GuestAffinity], dropping: _Dropping) -> None:
    """A positive and a negative rule sharing two or more guests: the soft one goes, or both if
    alike."""

    def find() -> Iterator[Contradiction]:
        positives = [r for r in rules if r.positive and dropping.kept(r)]
        negatives = [r for r in rules if not r.positive and dropping.kept(r)]
        by_guest = _rules_by_guest(negatives)
        for pos in positives:
            for neg in _sharing_two(pos.guests, negatives, by_guest):
                shared = sorted(set(pos.guests) & set(neg.guests))
                if len(shared) >= 2:
                    problem = _contradiction(pos, neg, shared)
                    going = [r for r in (pos, neg) if r.name in problem.rules]
                    guests = ", ".join(f"'{g}'" for g in shared)
                    what = f"guests {guests} are kept both together and apart"
                    yield [pos, neg], going, problem, what

    _settle(find, dropping)


def _merged_contradictions(rules: Sequence[GuestAffinity], dropping: _Dropping) -> None:
    """After merging, positive rules that share guests keep a whole component together: a hard
    negative rule with two guests in one component contradicts it (Proxmox's merged rules)."""

    def find() -> Iterator[Contradiction]:
        hard_pos = [r for r in rules if r.positive and r.hard and dropping.kept(r)]
        negatives = [r for r in rules if not r.positive and r.hard]
        by_guest = _rules_by_guest(negatives)
        for comp_rules, members in _positive_components(hard_pos):
            for neg in _sharing_two(members, negatives, by_guest):
                shared = sorted(set(neg.guests) & members)
                if dropping.kept(neg) and len(shared) >= 2:
                    names = (*sorted(r.name for r in comp_rules), neg.name)
                    guests = ", ".join(f"'{g}'" for g in shared)
                    why = "both together (through shared guests) and apart"
                    involved = [*comp_rules, neg]
                    problem = RuleProblem(names, f"they keep guests {guests} {why}")
                    yield involved, involved, problem, f"guests {guests} are kept {why}"

    _settle(find, dropping)


def _strict_rules(
    rules: Rules, configured: frozenset[str], dropping: _Dropping
) -> dict[str, tuple[NodeAffinity, frozenset[str]]]:
    """guest -> its kept strict node-affinity rule and every configured node it names, whatever
    the priority (a lower priority is used when the higher ones are unavailable)."""
    out: dict[str, tuple[NodeAffinity, frozenset[str]]] = {}
    for rule in rules.node_affinity:
        if rule.strict and dropping.kept(rule):
            nodes = frozenset(rule.nodes) & configured
            for guest in rule.guests:
                out[guest] = (rule, nodes)
    return out


def _confined_negatives(rules: Rules, configured: frozenset[str], dropping: _Dropping) -> None:
    """Hard negative rules whose guests strict node affinity confines to fewer nodes than
    guests."""

    def find() -> Iterator[Contradiction]:
        strict = _strict_rules(rules, configured, dropping)
        for neg in rules.guest_affinity:
            if neg.positive or not neg.hard or not dropping.kept(neg):
                continue
            members = sorted(set(neg.guests))
            if all(g in strict for g in members):
                reachable = frozenset().union(*(strict[g][1] for g in members))
                if len(reachable) < len(members):
                    confining = list({strict[g][0].name: strict[g][0] for g in members}.values())
                    what = (
                        f"{len(members)} guests are confined to {len(reachable)} nodes "
                        "by strict node affinity"
                    )
                    problem = RuleProblem((neg.name,), f"its {what}")
                    yield [neg, *confining], [neg], problem, f"{what} and kept apart"

    _settle(find, dropping)


def _no_common_node(rules: Rules, configured: frozenset[str], dropping: _Dropping) -> None:
    """Hard positive groups whose guests' strict node affinities share no node."""
    what = "strict node affinity leaves their guests no common node"

    def find() -> Iterator[Contradiction]:
        positives = [r for r in rules.guest_affinity if r.positive and r.hard and dropping.kept(r)]
        strict = _strict_rules(rules, configured, dropping)
        for group_rules, members in _positive_components(positives):
            confined = [strict[g] for g in sorted(members) if g in strict]
            if confined and not frozenset.intersection(*(nodes for _, nodes in confined)):
                confining = list({r.name: r for r, _ in confined}.values())
                problem = RuleProblem(tuple(sorted(r.name for r in group_rules)), what)
                yield [*group_rules, *confining], list(group_rules), problem, what

    _settle(find, dropping)


def _contradiction(pos: GuestAffinity, neg: GuestAffinity, shared: list[str]) -> RuleProblem:
    """A positive and a negative rule sharing ``shared``: the soft one goes, or both if alike."""
    guests = ", ".join(f"'{g}'" for g in shared)
    if pos.hard == neg.hard:
        return RuleProblem(
            (pos.name, neg.name), f"they keep guests {guests} both together and apart"
        )
    soft, hard = (neg, pos) if pos.hard else (pos, neg)
    verb = "together" if hard.positive else "apart"
    return RuleProblem((soft.name,), f"hard rule '{hard.name}' keeps guests {guests} {verb}")


def _positive_components(
    rules: Sequence[GuestAffinity],
) -> list[tuple[list[GuestAffinity], set[str]]]:
    """Connected components of positive rules that share guests (Proxmox merges them)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for rule in rules:
        first = rule.guests[0]
        for guest in rule.guests[1:]:
            ra, rb = find(first), find(guest)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    comps: dict[str, tuple[list[GuestAffinity], set[str]]] = {}
    for rule in rules:
        root = find(rule.guests[0])
        entry = comps.setdefault(root, ([], set()))
        entry[0].append(rule)
        entry[1].update(rule.guests)
    return [comps[k] for k in sorted(comps)]


# --------------------------------------------------------------------------------------------
# Movability


#: HA states in which a plan never migrates an HA-managed guest: the HA manager is handling it
#: (fencing, recovery, a node shutting down), an operator must (error), or it is not to run.
HA_HELD: frozenset[str] = frozenset({"error", "freeze", "fence", "recovery", "ignored", "stopped"})


#: Why an HA guest is not balanced while Proxmox VE's own balancer is on.
PLATFORM_BALANCES = "Proxmox VE balances HA guests itself (ha-auto-rebalance)"


def platform_balancer(cluster: Cluster) -> str | None:
    """One sentence when Proxmox VE balances the cluster's HA guests itself, with what opendrs
    does about it and what to change; ``None`` when it does not."""
    if not cluster.ha_auto_rebalance:
        return None
    count = sum(1 for g in cluster.guests if g.ha)
    return (
        f"Proxmox VE balances its HA guests itself (ha-auto-rebalance is on in the datacenter's "
        f"crs options): opendrs leaves its {count} HA guest{'s' if count != 1 else ''} to it "
        "and balances the others; turn ha-auto-rebalance off (Datacenter → Options → Cluster "
        "Resource Scheduling) to let opendrs balance them"
    )


HeldCode = Literal[
    "ignored",
    "platform-balancer",
    "ha-state",
    "local-disks",
    "local-device",
    "migrating",
    "locked",
    "node-offline",
    "container",
    "not-running",
    "uptime",
]


@dataclass(frozen=True, slots=True)
class Held:
    """Why a guest may not move: a :data:`HeldCode` for code, and the detail an operator reads
    (``str()``: ``HA state fence``, ``local disks (32 GiB)``, …)."""

    code: HeldCode
    text: str

    def __str__(self) -> str:
        return self.text


def movability(guest: Guest, cluster: Cluster, purpose: Purpose = "balance") -> Held | None:
    """Why ``guest`` may not move for ``purpose``, or ``None`` when it may.

    A plan (``balance``, ``evacuate``) never moves an HA-managed guest in a state of
    :data:`HA_HELD`; recovery is what the HA manager does for a guest fenced on a failed node.
    While Proxmox VE balances HA guests itself (``Cluster.ha_auto_rebalance``), balancing leaves
    them to it: two balancers would undo each other's moves.
    The cluster's ``min_uptime`` holds a guest for ``balance`` unless its node is in maintenance:
    a guest must leave such a node however recently it started.
    """
    settings = cluster.settings
    if guest.id in cluster.rules.ignored:
        reason = cluster.rules.ignore_reason(guest.id)
        return Held("ignored", f"ignored: {reason}" if reason else "ignored by a rule")
    if purpose == "balance" and guest.ha and cluster.ha_auto_rebalance:
        return Held("platform-balancer", PLATFORM_BALANCES)
    if purpose in ("balance", "evacuate") and guest.ha and guest.ha_state in HA_HELD:
        return Held("ha-state", f"HA state {guest.ha_state}")
    if purpose == "recover":
        return _local_only(guest, settings.allow_local_disks, devices_first=False)
    if guest.migrating_to is not None:
        return Held("migrating", f"already migrating to {guest.migrating_to}")
    if guest.lock:
        return Held("locked", f"locked ({guest.lock})")
    local = _local_only(guest, settings.allow_local_disks, devices_first=True)
    if local is not None:
        return local
    node_index = cluster.node_index.get(guest.node)
    node = cluster.nodes[node_index] if node_index is not None else None
    if node is not None and not node.online:
        return Held("node-offline", "its node is offline")
    running = bool(loaded_nodes(guest))
    if guest.kind == "ct" and running and not settings.allow_restart_migration:
        return Held("container", "container: restart migration not allowed")
    if purpose == "balance":
        if not running:
            return Held("not-running", "not running")
        if guest.uptime < settings.min_uptime and not (node is not None and node.maintenance):
            return Held(
                "uptime",
                f"up for {format_duration(guest.uptime)}, "
                f"less than {format_duration(settings.min_uptime)}",
            )
    return None


def _local_only(guest: Guest, allow_local_disks: bool, *, devices_first: bool) -> Held | None:
    """A guest tied to its node by local disks (unless allowed) or a local device."""
    disks = (
        Held("local-disks", f"local disks ({format_bytes(guest.local_disk_bytes)})")
        if guest.local_disk_bytes and not allow_local_disks
        else None
    )
    device = Held("local-device", f"local device {guest.devices[0]}") if guest.devices else None
    return (device or disks) if devices_first else (disks or device)


# --------------------------------------------------------------------------------------------
# The constraint set's tables, built by what rules name


def _arch_mask(cluster: Cluster) -> RowMask:
    """(G, N) architecture matches: one row per architecture."""
    node_names = [n.arch for n in cluster.nodes]
    guest_names = [cluster.guest_arch(g) for g in cluster.guests]
    code = {name: i for i, name in enumerate(sorted({*node_names, *guest_names}))}
    node_arch = np.array([code[name] for name in node_names], dtype=np.intp)
    guest_arch = np.array([code[name] for name in guest_names], dtype=np.intp)
    table = np.arange(len(code))[:, None] == node_arch[None, :]
    return RowMask.build(guest_arch, table)


def _limits_mask(cluster: Cluster) -> RowMask:
    """(G, N) the nodes the platform can move each guest to (:attr:`Guest.limits`): a row per
    guest with limits, the all-true row for the others."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    index = np.zeros(n_guests, dtype=np.intp)
    rows = [np.ones(n_nodes, dtype=bool)]
    names = [n.name for n in cluster.nodes]
    for j, guest in enumerate(cluster.guests):
        if not guest.limits:
            continue
        row = np.ones(n_nodes, dtype=bool)
        for limit in guest.limits:
            row &= np.array([n in limit.nodes or n == guest.node for n in names], dtype=bool)
        index[j] = len(rows)
        rows.append(row)
    return RowMask.build(index, np.array(rows))


def _node_affinity_masks(
    cluster: Cluster, rules: Rules, tier: np.ndarray, usable: np.ndarray
) -> tuple[RowMask, RowMask]:
    """(G, N) what strict node affinity allows, and what non-strict node affinity prefers
    (true where none applies): a rule's guests get its usable nodes of the priority they use
    (``tier``; a non-strict rule only where the guest has one). A non-strict rule binds the
    guests that :func:`fails_back` as a strict one does (:func:`binding`)."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    gidx, nidx = cluster.guest_index, cluster.node_index
    rows = {True: [np.ones(n_nodes, dtype=bool)], False: [np.ones(n_nodes, dtype=bool)]}
    index = {True: np.zeros(n_guests, np.intp), False: np.zeros(n_guests, np.intp)}
    for rule in rules.node_affinity:
        members = np.array([gidx[g] for g in rule.guests if g in gidx], dtype=np.intp)
        hard = np.array([binding(rule, cluster.guests[j]) for j in members], dtype=bool)
        keep = hard | (tier[members] >= 0)
        members, hard = members[keep], hard[keep]
        if not members.size:
            continue
        named = np.zeros(n_nodes, dtype=bool)
        priority = np.zeros(n_nodes, dtype=np.int64)
        for name, p in rule.nodes.items():
            if name in nidx:
                named[nidx[name]], priority[nidx[name]] = True, p
        for strict in (True, False):
            chosen = members[hard == strict]
            if strict and not rule.strict:
                # Failback binds to the top tier only while the rule has a usable node: else
                # the HA manager takes any node (the others are its priority -1).
                chosen = chosen[tier[chosen] >= 0]
            if not chosen.size:
                continue
            used, which = np.unique(tier[chosen], return_inverse=True)
            # check_rules leaves each guest in one node-affinity rule at most: one row per guest.
            index[strict][chosen] = len(rows[strict]) + which.ravel()
            rows[strict].extend(usable & named & (priority == p) for p in used.tolist())
    return (
        RowMask.build(index[True], np.array(rows[True])),
        RowMask.build(index[False], np.array(rows[False])),
    )


def _permitted_mask(cluster: Cluster, forbidden: Iterable[tuple[str, str]]) -> RowMask:
    """(G, N) false where ``forbidden`` refuses the placement: a row per guest it names."""
    n_guests, n_nodes = len(cluster.guests), len(cluster.nodes)
    gidx, nidx = cluster.guest_index, cluster.node_index
    pairs = [(gidx[g], nidx[n]) for g, n in forbidden if g in gidx and n in nidx]
    index = np.zeros(n_guests, dtype=np.intp)
    table = np.ones((1, n_nodes), dtype=bool)
    if pairs:
        guests, nodes = np.array(pairs, dtype=np.intp).T
        named, row = np.unique(guests, return_inverse=True)
        index[named] = 1 + np.arange(len(named))
        table = np.ones((1 + len(named), n_nodes), dtype=bool)
        table[1 + row.ravel(), nodes] = False
    return RowMask.build(index, table)


def _rule_members(cluster: Cluster, rules: Rules, positive: bool, hard: bool) -> list[np.ndarray]:
    """The guest indices of each guest-affinity rule of the kind."""
    gidx = cluster.guest_index
    return [
        np.array([gidx[g] for g in rule.guests if g in gidx], dtype=np.intp)
        for rule in rules.guest_affinity
        if rule.positive == positive and rule.hard == hard
    ]


def _rule_pairs(
    cluster: Cluster, rules: Rules, positive: bool, hard: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(guest, partner) pairs of the guest-affinity rules of the kind (a guest with itself too)."""
    return pairs_within(_rule_members(cluster, rules, positive, hard))


def _hard_groups(cluster: Cluster, rules: Rules) -> tuple[list[np.ndarray], np.ndarray]:
    """The hard positive groups (merged rules, two or more guests each, as sorted indices), and
    each guest's group (-1: none)."""
    gidx = cluster.guest_index
    groups: list[np.ndarray] = []
    group_of = np.full(len(cluster.guests), -1, dtype=np.intp)
    for _rules, members in _positive_components(
        [r for r in rules.guest_affinity if r.positive and r.hard]
    ):
        idx = np.array(sorted(gidx[g] for g in members if g in gidx), dtype=np.intp)
        if len(idx) >= 2:
            group_of[idx] = len(groups)
            groups.append(idx)
    return groups, group_of


def hard_groups(cluster: Cluster) -> list[np.ndarray]:
    """The hard-affinity bundles of ``cluster``, as :attr:`Constraints.groups` holds them, without
    building the rest of the constraint set."""
    return _hard_groups(cluster, check_rules(cluster)[0])[0]


def _hard_negatives(
    cluster: Cluster, rules: Rules, groups: list[np.ndarray], group_of: np.ndarray
) -> Partners:
    """Per guest, its hard negative partners. Guests kept together share their negative
    partners: between "units" (a group, or a guest alone) a negative pair of members makes the
    units apart, and every guest is apart from every member of the units its unit is apart
    from."""
    n_guests = len(cluster.guests)
    guest, partner = _rule_pairs(cluster, rules, False, True)
    unit = np.where(group_of >= 0, group_of, len(groups) + np.arange(n_guests))
    apart = unit[guest] != unit[partner]
    ua, ub = unit[guest][apart], unit[partner][apart]
    unit_pairs = np.unique(np.stack([np.r_[ua, ub], np.r_[ub, ua]], axis=1), axis=0)

    def members(u: int) -> np.ndarray:
        return groups[u] if u < len(groups) else np.array([u - len(groups)], dtype=np.intp)

    sides = [(members(a), members(b)) for a, b in unit_pairs.tolist()]
    pairs = [(np.repeat(a, len(b)), np.tile(b, len(a))) for a, b in sides]
    if not pairs:
        return Partners.from_pairs(n_guests, guest[:0], partner[:0])
    return Partners.from_pairs(
        n_guests, np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
    )


# --------------------------------------------------------------------------------------------
# The constraint set of a cluster


class RejectionCode(StrEnum):
    """Why a node may not take a guest: the hard filter that refuses it (in reporting order),
    or, for a repair, what else keeps the guest off (the policy, its hard-affinity group)."""

    OFFLINE = "offline"
    MAINTENANCE = "maintenance"
    ARCH = "arch"
    PLATFORM = "platform"
    NODE_AFFINITY = "node-affinity"
    FORBIDDEN = "forbidden"
    ANTI_AFFINITY = "anti-affinity"
    AFFINITY = "affinity"
    CAPACITY = "capacity"
    #: The policy keeps the guest (or a partner) off the node: cooldown, no return, minimum
    #: uptime or a failed move.
    POLICY = "policy"
    #: The guest's hard-affinity partners cannot join it on the node.
    GROUP = "group"


#: The sentence of each rejection whose code says it all.
_CODE_TEXT: Mapping[RejectionCode, str] = MappingProxyType(
    {
        RejectionCode.OFFLINE: "node offline",
        RejectionCode.MAINTENANCE: "node in maintenance",
        RejectionCode.FORBIDDEN: "forbidden: no safe migration order reaches it",
        RejectionCode.AFFINITY: "hard affinity: its partners run elsewhere",
        RejectionCode.POLICY: (
            "kept off by the policy (cooldown, no return, minimum uptime or a failed move)"
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One capacity dimension a guest does not fit in on a node: what it needs, what is free."""

    resource: Dimension
    need: float
    free: float

    def __str__(self) -> str:
        if self.resource.kind.in_cores:
            return f"{self.resource} needs {self.need:.1f}, free {self.free:.1f}"
        return f"{self.resource} needs {format_bytes(self.need)}, free {format_bytes(self.free)}"


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why not this node: the code of what refuses it, the node, and the facts (``str()`` is
    the sentence an operator reads)."""

    code: RejectionCode
    node: str
    #: The facts of ``arch``, ``platform``, ``node-affinity``, ``anti-affinity`` and ``group``
    #: (the other codes need none but the numbers below).
    detail: str = ""
    #: For ``capacity``: each dimension short, with the numbers.
    shortfalls: tuple[Shortfall, ...] = ()

    def __str__(self) -> str:
        if self.code is RejectionCode.CAPACITY:
            return "capacity: " + "; ".join(str(s) for s in self.shortfalls)
        return _CODE_TEXT.get(self.code, self.detail)

    def as_dict(self) -> dict[str, str]:
        return {"node": self.node, "reason": str(self)}


@dataclass
class Constraints:
    """Hard and soft constraints of one cluster, as arrays, ready to test placements."""

    cluster: Cluster
    rules: Rules
    problems: list[RuleProblem]
    capacity: CapacityModel
    #: (N,) nodes that may receive guests.
    usable: np.ndarray
    #: (G, N) architecture matches. The guests × nodes masks are stored by distinct row
    #: (:class:`RowMask`): most guests have the same row, that no rule touches.
    arch_ok: RowMask
    #: (G, N) the platform can move the guest there (its :attr:`Guest.limits`).
    limits_ok: RowMask
    #: (G, N) strict node affinity allows, within the platform's limits.
    strict_ok: RowMask
    #: (G, N) non-strict node affinity prefers (True where no preference applies).
    preferred: RowMask
    #: (G, N) False where a placement is forbidden (a plan could not be ordered safely with it).
    permitted: RowMask
    #: Per guest: sorted indices of hard negative partners (group members' partners included).
    hard_neg: Partners
    #: Per guest: sorted indices of hard positive partners (its merged group, itself excluded).
    hard_pos: Partners
    soft_neg: Partners
    soft_pos: Partners
    #: Hard positive groups (each a sorted array of guest indices), bundles that move together.
    groups: list[np.ndarray] = field(default_factory=list)
    #: guest index -> its group index, or -1.
    group_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    #: (G,) the node-affinity priority each guest uses (see :func:`_affinity_tiers`), or -1.
    tier: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: (G,) the node each guest claimed when its tier was chosen, or -1.
    claimed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))

    @classmethod
    def build(
        cls,
        cluster: Cluster,
        forbidden: Iterable[tuple[str, str]] = (),
        usage: MeasuredUsage | None = None,
        measured_limit: float = 1.0,
    ) -> Constraints:
        """The constraints of ``cluster``; ``forbidden``: (guest, node) placements to refuse;
        ``usage``: the measured usage capacity is checked on (default: the cluster's own), up to
        ``measured_limit`` of each node's capacity (the policy's hot level, or all of it)."""
        rules, problems = check_rules(cluster)
        cluster_r = replace_rules(cluster, rules)
        n_guests = len(cluster.guests)
        usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
        arch_ok = _arch_mask(cluster)
        capacity = CapacityModel.build(cluster, usage, measured_limit)
        tier, claimed = _affinity_tiers(cluster, rules, capacity, arch_ok)
        strict_ok, preferred = _node_affinity_masks(cluster, rules, tier, usable)
        limits_ok = _limits_mask(cluster)
        if len(limits_ok.table) > 1:
            # Every stage that reads strict node affinity keeps to the platform's limits too.
            strict_ok = RowMask.combine([strict_ok, limits_ok], np.ones(len(usable), dtype=bool))
        groups, group_of = _hard_groups(cluster, rules)
        return cls(
            cluster=cluster_r,
            rules=rules,
            problems=problems,
            capacity=capacity,
            usable=usable,
            arch_ok=arch_ok,
            limits_ok=limits_ok,
            strict_ok=strict_ok,
            preferred=preferred,
            permitted=_permitted_mask(cluster, forbidden),
            hard_neg=_hard_negatives(cluster, rules, groups, group_of),
            hard_pos=Partners.within(n_guests, groups),
            soft_neg=Partners.from_pairs(n_guests, *_rule_pairs(cluster, rules, False, False)),
            soft_pos=Partners.from_pairs(n_guests, *_rule_pairs(cluster, rules, True, False)),
            groups=groups,
            group_of=group_of,
            tier=tier,
            claimed=claimed,
        )

    def unit_of(self, j: int) -> int:
        """The unit guest ``j`` moves in: its hard-affinity bundle's index (≥ 0), or ``-1 - j``
        for a guest that moves alone. The one definition of a unit every stage groups by."""
        group = int(self.group_of[j]) if len(self.group_of) else -1
        return group if group >= 0 else -1 - j

    def unit_members(self, j: int) -> np.ndarray:
        """Guest ``j`` and its hard-affinity partners: the guests that move together."""
        unit = self.unit_of(j)
        return self.groups[unit] if unit >= 0 else np.array([j], dtype=np.intp)

    def forbidding(self, forbidden: Iterable[tuple[str, str]]) -> Constraints:
        """These constraints with the (guest, node) placements ``forbidden`` refused as well:
        what :meth:`build` with ``forbidden`` gives, without building the rest again."""
        gidx, nidx = self.cluster.guest_index, self.cluster.node_index
        pairs = [(gidx.get(g), nidx.get(n)) for g, n in forbidden]
        known = [(j, n) for j, n in pairs if j is not None and n is not None]
        if not known:
            return self
        rows, cols = (np.array(c, dtype=np.intp) for c in zip(*known, strict=True))
        named = np.unique(rows)
        # The guests named get rows of their own: their rows now, without the new placements.
        index = self.permitted.index.copy()
        own = self.permitted.table[index[named]].copy()
        own[np.searchsorted(named, rows), cols] = False
        index[named] = len(self.permitted.table) + np.arange(len(named))
        permitted = RowMask.build(index, np.vstack([self.permitted.table, own]))
        return replace(self, permitted=permitted)

    # ----------------------------------------------------------------------------------------

    def static_ok(self) -> RowMask:
        """(G, N): usable node, architecture, strict node affinity, not forbidden."""
        return RowMask.combine([self.arch_ok, self.strict_ok, self.permitted], self.usable)

    def guest_demand(self, j: int) -> np.ndarray:
        """Capacity demand (D,) guest ``j`` brings to a new node (storage only if not running)."""
        return self.capacity.moving[j].copy()

    def occupied(self, assign: np.ndarray, guests: np.ndarray) -> np.ndarray:
        """(N,) bool: nodes where any of ``guests`` sits (under ``assign``) or is migrating to."""
        out = np.zeros(len(self.cluster.nodes), dtype=bool)
        if guests.size:
            where = assign[guests]
            out[where[where >= 0]] = True
            for g in guests.tolist():
                target = self.cluster.guests[g].migrating_to
                if target is not None and assign[g] == self.cluster.node_index.get(
                    self.cluster.guests[g].node, -1
                ):
                    t = self.cluster.node_index.get(target)
                    if t is not None:
                        out[t] = True
        return out

    def hard_masks(
        self, j: int, assign: np.ndarray, headroom: np.ndarray, demand: np.ndarray | None = None
    ) -> list[tuple[RejectionCode, np.ndarray]]:
        """The hard filters for guest ``j`` as (N,) masks with their codes, in reporting order.

        ``assign`` places the other guests; ``headroom`` (N, D) is the free capacity with guest
        ``j`` *not* counted on any node; ``demand`` overrides the guest's demand (bundles).
        """
        nodes = self.cluster.nodes
        online = np.array([n.online for n in nodes], dtype=bool)
        not_maint = np.array([not n.maintenance for n in nodes], dtype=bool)
        demand = self.guest_demand(j) if demand is None else demand
        masks = [
            (RejectionCode.OFFLINE, online),
            (RejectionCode.MAINTENANCE, not_maint),
            (RejectionCode.ARCH, self.arch_ok[j]),
            (RejectionCode.PLATFORM, self.limits_ok[j]),
            (RejectionCode.NODE_AFFINITY, self.strict_ok[j]),
            (RejectionCode.FORBIDDEN, self.permitted[j]),
            (RejectionCode.ANTI_AFFINITY, ~self.occupied(assign, self.hard_neg[j])),
        ]
        pos = self.hard_pos[j]
        if pos.size:
            where = assign[pos]
            where = where[where >= 0]
            if where.size:
                counts = np.bincount(where, minlength=len(nodes))
                masks.append((RejectionCode.AFFINITY, counts == counts.max()))
        fits = np.all(demand[None, :] <= headroom + tolerance(self.capacity.limit), axis=1)
        masks.append((RejectionCode.CAPACITY, fits))
        return masks

    def allowed(
        self, j: int, assign: np.ndarray, headroom: np.ndarray, demand: np.ndarray | None = None
    ) -> np.ndarray:
        """(N,) nodes that pass every hard filter for guest ``j``."""
        ok = np.ones(len(self.cluster.nodes), dtype=bool)
        for _name, mask in self.hard_masks(j, assign, headroom, demand):
            ok &= mask
        return ok

    def rejection(
        self,
        code: RejectionCode,
        j: int,
        n: int,
        assign: np.ndarray,
        headroom: np.ndarray,
        demand: np.ndarray,
    ) -> Rejection:
        """Hard filter ``code`` rejecting node ``n`` for guest ``j``, with its facts."""
        node = self.cluster.nodes[n]
        guest = self.cluster.guests[j]
        if code is RejectionCode.CAPACITY:
            limit = tolerance(self.capacity.limit)[n]
            room = headroom[n]
            short = tuple(
                Shortfall(dim, float(demand[d]), float(max(room[d], 0)))
                for d, dim in enumerate(self.capacity.dimensions)
                if demand[d] > room[d] + limit[d]
            )
            return Rejection(code, node.name, shortfalls=short)
        detail = ""
        if code is RejectionCode.ARCH:
            detail = f"architecture {node.arch}, guest needs {self.cluster.guest_arch(guest)}"
        elif code is RejectionCode.PLATFORM:
            detail = next(
                (lim.reason for lim in guest.limits if node.name not in lim.nodes),
                "the platform cannot move it there",
            )
        elif code is RejectionCode.NODE_AFFINITY:
            detail = self._explain_node_affinity(j, n)
        elif code is RejectionCode.ANTI_AFFINITY:
            partners = [
                self.cluster.guests[p].id for p in self.hard_neg[j].tolist() if assign[p] == n
            ]
            if not partners:
                partners = [self.cluster.guests[p].id for p in self.hard_neg[j].tolist()]
            detail = "hard anti-affinity with " + ", ".join(partners)
        return Rejection(code, node.name, detail)

    def _explain_node_affinity(self, j: int, n: int) -> str:
        """Why guest ``j``'s strict node affinity (or its failback) rules out node ``n`` (a
        usable node)."""
        guest = self.cluster.guests[j]
        rules = [r for r in self.rules.node_rules_for(guest.id) if binding(r, guest)]
        node = self.cluster.nodes[n].name
        priority = rules[0].nodes.get(node) if len(rules) == 1 else None
        tier = int(self.tier[j]) if len(self.tier) else -1
        if rules and not any(r.strict for r in rules):
            usable = {x.name for x, ok in zip(self.cluster.nodes, self.usable, strict=True) if ok}
            top = sorted(m for m, p in rules[0].nodes.items() if p == tier and m in usable)
            where = f"priority {priority}" if priority is not None else "not one of its nodes"
            return (
                f"HA failback ({rules[0].name}): {where}, while the HA manager moves it back to "
                f"its priority {tier} nodes ({', '.join(top)}); set failback 0 on the HA "
                "resource to let it stay elsewhere"
            )
        head = f"strict node affinity ({', '.join(r.name for r in rules)})"
        if priority is None:
            return head
        if tier < 0:
            return f"{head}: none of its nodes is usable"
        if priority < tier:
            return f"{head}: priority {priority}, while priority {tier} can take it"
        partners = [
            self.cluster.guests[p].id for p in self.hard_neg[j].tolist() if self.claimed[p] == n
        ]
        if partners:
            why = f"holds its hard anti-affinity partner {', '.join(partners)}"
        else:
            why = "has no room for it"
        return f"{head}: priority {priority} {why}, priority {tier} is used"

    def soft_penalty(self, j: int, assign: np.ndarray) -> np.ndarray:
        """(N,) penalty of putting guest ``j`` on each node: broken soft rules × SOFT_PENALTY."""
        penalty = np.where(self.preferred[j], 0.0, SOFT_PENALTY)
        if self.soft_neg[j].size:
            penalty = penalty + SOFT_PENALTY * self._count_on(assign, self.soft_neg[j])
        if self.soft_pos[j].size:
            counts = self._count_on(assign, self.soft_pos[j])
            penalty = penalty + SOFT_PENALTY * (self.soft_pos[j].size - counts)
        return penalty

    def _count_on(self, assign: np.ndarray, guests: np.ndarray) -> np.ndarray:
        where = assign[guests]
        where = where[where >= 0]
        return np.bincount(where, minlength=len(self.cluster.nodes)).astype(np.float64)

    def violations(self, assign: np.ndarray) -> list[str]:
        """Hard rules broken by a full placement ``assign`` (capacity included), as sentences."""
        cluster = self.cluster
        names = [n.name for n in cluster.nodes]
        ids = [g.id for g in cluster.guests]
        placed = assign >= 0
        problems = [f"guest {ids[j]} has no node" for j in np.flatnonzero(~placed).tolist()]
        moved = placed & (assign != current_assign(cluster))
        refused = moved & ~self.static_ok()[np.arange(len(assign)), np.where(placed, assign, 0)]
        problems += [
            f"guest {ids[j]} on {names[assign[j]]}: not allowed there"
            for j in np.flatnonzero(refused).tolist()
        ]
        for j in self.hard_neg.having().tolist():
            if placed[j] and np.any(assign[self.hard_neg[j]] == assign[j]):
                problems.append(
                    f"guest {ids[j]} shares {names[assign[j]]} with a hard anti-affinity partner"
                )
        for j in self.hard_pos.having().tolist():
            if placed[j] and np.any(assign[self.hard_pos[j]] != assign[j]):
                problems.append(f"guest {ids[j]} is apart from a hard affinity partner")
        committed = committed_for(self, assign)
        over = self.capacity.over(committed)
        for n, dim in zip(*np.nonzero(over), strict=True):
            problems.append(f"node {names[n]} over capacity in {self.capacity.dimensions[dim]}")
        return sorted(set(problems))


def replace_rules(cluster: Cluster, rules: Rules) -> Cluster:
    """The cluster with other rules."""
    return replace(cluster, rules=rules)


def committed_for(constraints: Constraints, assign: np.ndarray) -> np.ndarray:
    """Committed capacity (N, D) when every guest sits where ``assign`` says (moves finished)."""
    cap = constraints.capacity
    cluster = constraints.cluster
    n_nodes = len(cluster.nodes)
    out = cap.base.copy()
    compute = np.array([bool(loaded_nodes(g)) for g in cluster.guests], dtype=bool)
    valid = assign >= 0
    demand_compute = np.where(cap.storage_cols[None, :], 0.0, cap.demand)
    demand_storage = np.where(cap.storage_cols[None, :], cap.demand, 0.0)
    idx = np.nonzero(valid & compute)[0]
    for col in range(len(cap.dimensions)):
        if idx.size:
            out[:, col] += np.bincount(
                assign[idx], weights=demand_compute[idx, col], minlength=n_nodes
            )
    idx = np.nonzero(valid)[0]
    for col in np.nonzero(cap.storage_cols)[0]:
        if idx.size:
            out[:, col] += np.bincount(
                assign[idx], weights=demand_storage[idx, col], minlength=n_nodes
            )
    return out


def current_assign(cluster: Cluster) -> np.ndarray:
    """Node index of every guest (``-1`` for an unknown node)."""
    return np.array([cluster.node_index.get(g.node, -1) for g in cluster.guests], dtype=np.intp)


__all__ = [
    "HA_HELD",
    "SOFT_PENALTY",
    "Constraints",
    "Purpose",
    "Rejection",
    "RejectionCode",
    "RuleProblem",
    "Shortfall",
    "check_rules",
    "committed_for",
    "current_assign",
    "hard_groups",
    "movability",
]
