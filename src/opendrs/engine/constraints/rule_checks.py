"""Rules that contradict each other or cannot be met, found up front (:func:`check_rules`) and
dropped with a message naming them (:class:`RuleProblem`), as Proxmox's HA rule checks do; and
the hard positive rules merged into groups that share guests (:func:`positive_components`)."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from opendrs.model.cluster import Cluster
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, Origin, Rules, precedence


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
    {"platform": "platform", "config": "configured", "pool": "pool", "tag": "tag"}
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
        origins = {r.origin for r in involved}
        if len(origins) < 2:
            return False
        ranks = {precedence(o) for o in origins}
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


class RuleCheck(NamedTuple):
    """What :func:`check_rules` finds: the rules kept and a problem per rule dropped. Computed
    once per decision (a :class:`~opendrs.engine.view.CycleView`'s ``rule_check``) and handed to
    what reads the rules kept (:meth:`~.constraint_set.Constraints.build`)."""

    rules: Rules
    problems: list[RuleProblem]


def check_rules(cluster: Cluster) -> RuleCheck:
    """The rules of ``cluster`` that :func:`find_rule_problems` keeps and the problems it finds
    (the configured nodes count, usable or not)."""
    return RuleCheck(*find_rule_problems(cluster.rules, frozenset(n.name for n in cluster.nodes)))


def find_rule_problems(rules: Rules, configured: frozenset[str]) -> tuple[Rules, list[RuleProblem]]:
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
    (:data:`~opendrs.model.rules.ORIGINS`: platform, config, pool, tag) are ignored — problems whose
    ``over`` names the rules that hold — and the check is made again on the rest.
    """
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


def _node_rule_overlaps(rules: Sequence[NodeAffinity], dropping: _Dropping) -> None:
    """The node-affinity rules that share a guest: all are dropped (a problem per guest).

    Across origins in one pass, guest by guest: a guest's kept rules only shrink as rules drop,
    so a guest passed has no contradiction between origins again, and each guest is settled
    (its latest origin's rules ignored, again while several origins are left) before the next —
    what a search started over after each drop would find, without the new starts."""

    def named_by_guest() -> list[tuple[str, list[NodeAffinity]]]:
        by_guest: dict[str, list[NodeAffinity]] = defaultdict(list)
        for rule in rules:
            if dropping.kept(rule):
                for guest in rule.guests:
                    by_guest[guest].append(rule)
        return sorted(by_guest.items())

    def what(guest: str) -> str:
        return f"guest '{guest}' is in more than one node-affinity rule"

    def find() -> Iterator[Contradiction]:
        for guest, named in named_by_guest():
            if len(named) > 1:
                fresh = tuple(r.name for r in named if dropping.kept(r))
                yield list(named), list(named), RuleProblem(fresh, what(guest)), what(guest)

    for guest, named in named_by_guest():
        live: list[AnyRule] = [r for r in named if dropping.kept(r)]
        while len(live) > 1 and dropping.by_origin(live, what(guest)):
            live = [r for r in live if dropping.kept(r)]
    for _, going, problem, _ in find():
        if problem.rules:
            dropping.drop(going, problem)
        else:
            dropping.drop_quietly(going)


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
    alike.

    Across origins in one pass: dropping rules only takes pairs away, so going on past the pairs
    of dropped rules finds what a search started over after each drop would."""

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

    for involved, _, _, what in find():
        if all(dropping.kept(r) for r in involved):
            dropping.by_origin(involved, what)
    for _, going, problem, _ in find():
        dropping.drop(going, problem)


def _merged_contradictions(rules: Sequence[GuestAffinity], dropping: _Dropping) -> None:
    """After merging, positive rules that share guests keep a whole component together: a hard
    negative rule with two guests in one component contradicts it (Proxmox's merged rules).

    Across origins, components are settled in order of their first guest: dropping rules of one
    leaves the others as they were, so only its pieces are checked again (what a search started
    over after each drop would find)."""
    negatives = [r for r in rules if not r.positive and r.hard]
    by_guest = _rules_by_guest(negatives)

    def hard_components() -> list[tuple[list[GuestAffinity], set[str]]]:
        return positive_components([r for r in rules if r.positive and r.hard and dropping.kept(r)])

    def within(
        comp_rules: list[GuestAffinity], members: set[str], across: bool = False
    ) -> Iterator[Contradiction]:
        """The contradictions of one component; ``across``: only those between origins."""
        comp_names = tuple(sorted(r.name for r in comp_rules))
        origins = {r.origin for r in comp_rules}
        for neg in _sharing_two(members, negatives, by_guest):
            if across and origins.issuperset((neg.origin,)) and len(origins) == 1:
                continue
            shared = sorted(set(neg.guests) & members)
            if dropping.kept(neg) and len(shared) >= 2:
                guests = ", ".join(f"'{g}'" for g in shared)
                why = "both together (through shared guests) and apart"
                involved = [*comp_rules, neg]
                problem = RuleProblem((*comp_names, neg.name), f"they keep guests {guests} {why}")
                yield involved, involved, problem, f"guests {guests} are kept {why}"

    order = itertools.count()
    pending = [(min(m), next(order), r, m) for r, m in hard_components()]
    while pending:
        _, _, comp_rules, members = heapq.heappop(pending)
        if any(
            dropping.by_origin(involved, what)
            for involved, _, _, what in within(comp_rules, members, across=True)
        ):
            pieces = positive_components([r for r in comp_rules if dropping.kept(r)])
            for r, m in pieces:
                heapq.heappush(pending, (min(m), next(order), r, m))
    for comp_rules, members in hard_components():
        for _, going, problem, _ in within(comp_rules, members):
            dropping.drop(going, problem)


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
    guests.

    Across origins in one pass, rule by rule: each guest is in one kept node-affinity rule at
    most (:func:`_node_rule_overlaps` ran first), so a drop only frees guests of strict node
    affinity — a rule passed stays as it was, or loses its contradiction — and the guests the
    dropped strict rules confined are let go of as they drop (:func:`_let_go`): what a search
    started over after each drop would find, without the new starts."""

    def contradiction(
        neg: GuestAffinity, strict: Mapping[str, tuple[NodeAffinity, frozenset[str]]]
    ) -> Contradiction | None:
        if neg.positive or not neg.hard or not dropping.kept(neg):
            return None
        members = sorted(set(neg.guests))
        if not all(g in strict for g in members):
            return None
        reachable = frozenset().union(*(strict[g][1] for g in members))
        if len(reachable) >= len(members):
            return None
        confining = list({strict[g][0].name: strict[g][0] for g in members}.values())
        what = (
            f"{len(members)} guests are confined to {len(reachable)} nodes by strict node affinity"
        )
        problem = RuleProblem((neg.name,), f"its {what}")
        return [neg, *confining], [neg], problem, f"{what} and kept apart"

    strict = _strict_rules(rules, configured, dropping)
    for neg in rules.guest_affinity:
        found = contradiction(neg, strict)
        if found is not None and dropping.by_origin(found[0], found[3]):
            _let_go(strict, found[0], dropping)
    strict = _strict_rules(rules, configured, dropping)
    for neg in rules.guest_affinity:
        found = contradiction(neg, strict)
        if found is not None:
            dropping.drop(found[1], found[2])


def _no_common_node(rules: Rules, configured: frozenset[str], dropping: _Dropping) -> None:
    """Hard positive groups whose guests' strict node affinities share no node.

    Across origins in one pass, group by group in order of their first guest, as
    :func:`_merged_contradictions`: a drop either splits the group (its pieces are checked in
    their turn) or lets guests go of strict node affinity (removed from the map as they drop, the
    group checked again) — a group passed stays as it was or loses its contradiction: what
    a search started over after each drop would find, without the new starts."""
    what = "strict node affinity leaves their guests no common node"

    def contradiction(
        group_rules: list[GuestAffinity],
        members: set[str],
        strict: Mapping[str, tuple[NodeAffinity, frozenset[str]]],
    ) -> Contradiction | None:
        confined = [strict[g] for g in sorted(members) if g in strict]
        if not confined or frozenset.intersection(*(nodes for _, nodes in confined)):
            return None
        confining = list({r.name: r for r, _ in confined}.values())
        problem = RuleProblem(tuple(sorted(r.name for r in group_rules)), what)
        return [*group_rules, *confining], list(group_rules), problem, what

    def hard_groups() -> list[tuple[list[GuestAffinity], set[str]]]:
        positives = [r for r in rules.guest_affinity if r.positive and r.hard and dropping.kept(r)]
        return positive_components(positives)

    strict = _strict_rules(rules, configured, dropping)
    order = itertools.count()
    pending = [(min(m), next(order), r, m) for r, m in hard_groups()]
    while pending:
        _, _, group_rules, members = heapq.heappop(pending)
        found = contradiction(group_rules, members, strict)
        if found is not None and dropping.by_origin(found[0], found[3]):
            _let_go(strict, found[0], dropping)
            for r, m in positive_components([r for r in group_rules if dropping.kept(r)]):
                heapq.heappush(pending, (min(m), next(order), r, m))
    strict = _strict_rules(rules, configured, dropping)
    for group_rules, members in hard_groups():
        found = contradiction(group_rules, members, strict)
        if found is not None:
            dropping.drop(found[1], found[2])


def _let_go(
    strict: dict[str, tuple[NodeAffinity, frozenset[str]]],
    involved: Sequence[AnyRule],
    dropping: _Dropping,
) -> None:
    """Remove from ``strict`` (:func:`_strict_rules`) the guests of the node rules of
    ``involved`` that are dropped now (each guest is in one kept node rule at most)."""
    for rule in involved:
        if isinstance(rule, NodeAffinity) and not dropping.kept(rule):
            for guest in rule.guests:
                strict.pop(guest, None)


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


def positive_components(
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


__all__ = ["RuleCheck", "RuleProblem", "check_rules", "find_rule_problems", "positive_components"]
