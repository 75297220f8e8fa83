"""The guest-rule checks look rules up by guest and settle contradictions between origins without
starting over: on small random rule sets they find what a plain quadratic check that starts over
after each drop finds — the same problems, in the same order, with the same words."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from opendrs.engine.constraints import RuleProblem, check_rules
from opendrs.engine.constraints.rule_checks import find_rule_problems, positive_components
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import ORIGINS, GuestAffinity, Rules, precedence

GiB = 1024**3
WORDS = {"platform": "platform", "config": "configured", "tag": "tag"}
Found = tuple[list[GuestAffinity], list[GuestAffinity], RuleProblem, str]


def reference(rules: Sequence[GuestAffinity], n_nodes: int) -> list[RuleProblem]:
    """Guest-rule problems, every pair compared and every search started over after a drop."""
    dropped: set[str] = set()
    problems: list[RuleProblem] = []

    def drop(going: Sequence[GuestAffinity], problem: RuleProblem) -> None:
        dropped.update(r.name for r in going)
        problems.append(problem)

    def by_origin(involved: list[GuestAffinity], what: str) -> bool:
        ranks = {precedence(r.origin) for r in involved}
        if len(ranks) < 2:
            return False
        holding = tuple(
            dict.fromkeys(r.name for r in involved if precedence(r.origin) == min(ranks))
        )
        going = [r for r in involved if precedence(r.origin) == max(ranks)]
        noun, verb = ("rule", "holds") if len(holding) == 1 else ("rules", "hold")
        names = ", ".join(f"'{n}'" for n in holding)
        reason = f"{what}, and {WORDS[ORIGINS[min(ranks)]]} {noun} {names} {verb}"
        going_names = tuple(dict.fromkeys(r.name for r in going))
        drop(going, RuleProblem(going_names, reason, holding, going[0].origin))
        return True

    def settle(find: Callable[[], Iterator[Found]]) -> None:
        while any(by_origin(involved, what) for involved, _, _, what in find()):
            pass
        for _, going, problem, _ in find():
            drop(going, problem)

    def opposite() -> Iterator[Found]:
        kept = [r for r in rules if r.name not in dropped]
        for pos in [r for r in kept if r.positive]:
            for neg in [r for r in kept if not r.positive]:
                shared = sorted(set(pos.guests) & set(neg.guests))
                if len(shared) < 2:
                    continue
                guests = ", ".join(f"'{g}'" for g in shared)
                if pos.hard == neg.hard:
                    why = f"they keep guests {guests} both together and apart"
                    problem = RuleProblem((pos.name, neg.name), why)
                else:
                    soft, hard = (neg, pos) if pos.hard else (pos, neg)
                    verb = "together" if hard.positive else "apart"
                    why = f"hard rule '{hard.name}' keeps guests {guests} {verb}"
                    problem = RuleProblem((soft.name,), why)
                going = [r for r in (pos, neg) if r.name in problem.rules]
                yield (
                    [pos, neg],
                    going,
                    problem,
                    f"guests {guests} are kept both together and apart",
                )

    def merged() -> Iterator[Found]:
        hard_pos = [r for r in rules if r.positive and r.hard and r.name not in dropped]
        for comp_rules, members in positive_components(hard_pos):
            for neg in [r for r in rules if not r.positive and r.hard]:
                shared = sorted(set(neg.guests) & members)
                if neg.name not in dropped and len(shared) >= 2:
                    guests = ", ".join(f"'{g}'" for g in shared)
                    why = "both together (through shared guests) and apart"
                    names = (*sorted(r.name for r in comp_rules), neg.name)
                    problem = RuleProblem(names, f"they keep guests {guests} {why}")
                    involved = [*comp_rules, neg]
                    yield involved, involved, problem, f"guests {guests} are kept {why}"

    for rule in rules:
        if len(set(rule.guests)) < 2:
            drop([rule], RuleProblem((rule.name,), "it names fewer than two guests"))
        elif not rule.positive and rule.hard and len(set(rule.guests)) > n_nodes:
            why = f"it keeps {len(set(rule.guests))} guests apart on only {n_nodes} nodes"
            drop([rule], RuleProblem((rule.name,), why))
    settle(opposite)
    settle(merged)
    return problems


GUESTS = [f"g{k}" for k in range(6)]
rule_specs = st.lists(
    st.tuples(
        st.lists(st.sampled_from(GUESTS), min_size=1, max_size=4),
        st.booleans(),
        st.booleans(),
        st.sampled_from(ORIGINS),
    ),
    max_size=16,
)


def _cluster(specs: list[tuple[list[str], bool, bool, str]]) -> Cluster:
    rules = tuple(
        GuestAffinity(f"r{k}", tuple(guests), positive, hard, origin)  # type: ignore[arg-type]
        for k, (guests, positive, hard, origin) in enumerate(specs)
    )
    nodes = tuple(Node(n, 8, 16 * GiB) for n in ("a", "b", "c"))
    guests = tuple(Guest(g, "a", memory=GiB) for g in GUESTS)
    return Cluster(nodes, guests, Rules(guest_affinity=rules), Settings(mode="static"))


@settings(max_examples=300, deadline=None)
@given(rule_specs)
@example(  # a merged group of three origins: the tag rule goes, then the configured ones
    [
        (["g0", "g1"], True, True, "platform"),
        (["g1", "g2"], True, True, "config"),
        (["g2", "g3"], True, True, "tag"),
        (["g0", "g2"], False, True, "config"),
    ]
)
def test_the_indexed_checks_find_what_comparing_every_pair_finds(specs) -> None:
    cluster = _cluster(specs)
    kept, problems = find_rule_problems(cluster.rules, frozenset(n.name for n in cluster.nodes))
    expected = reference(cluster.rules.guest_affinity, len(cluster.nodes))
    assert [str(p) for p in problems] == [str(p) for p in expected]
    assert problems == expected
    dropped = {name for p in expected for name in p.rules}
    assert [r.name for r in kept.guest_affinity] == [
        r.name for r in cluster.rules.guest_affinity if r.name not in dropped
    ]


def test_check_rules_is_computed_once_for_the_same_rules_and_nodes() -> None:
    cluster = _cluster([(["g0", "g1"], True, True, "config"), (["g0", "g1"], False, True, "tag")])
    first_kept, first = check_rules(cluster)
    first.clear()
    again_kept, again = check_rules(cluster)
    assert again_kept is first_kept
    assert [str(p) for p in again] == [
        "Ignore tag rule 'r1', because guests 'g0', 'g1' are kept both together and apart, "
        "and configured rule 'r0' holds"
    ]
    fewer_nodes = Cluster(cluster.nodes[:1], cluster.guests, cluster.rules, cluster.settings)
    assert check_rules(fewer_nodes)[0] is not first_kept
