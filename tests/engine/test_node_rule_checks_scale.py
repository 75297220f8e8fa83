"""The node-affinity checks — overlapping node rules, hard negative rules confined by strict node
affinity — settle contradictions between origins in one pass: on small random rule sets they find
what a check that starts over after each drop finds — the same problems, in the same order."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import example, given, settings
from hypothesis import strategies as st

from opendrs.engine.constraints import RuleProblem
from opendrs.engine.constraints.rule_checks import find_rule_problems, positive_components
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, Rules
from rule_reference import AnyRule, Found, StartingOver

CONFIGURED = frozenset({"a", "b", "c"})


def _overlaps(rules: Rules, done: StartingOver) -> Iterator[Found]:
    """Each guest in more than one kept node rule."""
    live = [r for r in rules.node_affinity if done.kept(r)]
    for guest in sorted({g for r in live for g in r.guests}):
        named: list[AnyRule] = [r for r in live for g in r.guests if g == guest]
        if len(named) > 1:
            what = f"guest '{guest}' is in more than one node-affinity rule"
            fresh = tuple(r.name for r in named if done.kept(r))
            yield named, named, RuleProblem(fresh, what), what


def reference(rules: Rules) -> list[RuleProblem]:
    """The problems of ``rules`` (node rules and hard negative rules of two or three guests),
    every search started over after a drop between origins."""
    done = StartingOver()

    def confined() -> Iterator[Found]:
        strict = {
            g: (r, frozenset(r.nodes) & CONFIGURED)
            for r in rules.node_affinity
            if r.strict and done.kept(r)
            for g in r.guests
        }
        for neg in rules.guest_affinity:
            members = sorted(set(neg.guests))
            if done.kept(neg) and all(g in strict for g in members):
                reachable = frozenset().union(*(strict[g][1] for g in members))
                if len(reachable) < len(members):
                    confining = list({strict[g][0].name: strict[g][0] for g in members}.values())
                    what = (
                        f"{len(members)} guests are confined to {len(reachable)} nodes "
                        "by strict node affinity"
                    )
                    problem = RuleProblem((neg.name,), f"its {what}")
                    yield [neg, *confining], [neg], problem, f"{what} and kept apart"

    done.settle(lambda: _overlaps(rules, done))
    done.settle(confined)
    return done.problems


GUESTS = [f"g{k}" for k in range(5)]
#: A node rule: its guests, its nodes, strict or not, its origin.
node_rule = st.tuples(
    st.lists(st.sampled_from(GUESTS), min_size=1, max_size=3),
    st.sets(st.sampled_from(sorted(CONFIGURED)), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from(ORIGINS),
)
node_specs = st.lists(node_rule, max_size=8)
negative_specs = st.lists(
    st.tuples(
        st.lists(st.sampled_from(GUESTS), min_size=2, max_size=3, unique=True),
        st.sampled_from(ORIGINS),
    ),
    max_size=5,
)


def _rules(
    nodes: list[tuple[list[str], set[str], bool, str]],
    guest_rules: list[tuple[list[str], str]],
    positive: bool = False,
) -> Rules:
    return Rules(
        node_affinity=tuple(
            NodeAffinity(f"n{k}", tuple(guests), dict.fromkeys(sorted(on), 1), strict, origin)  # type: ignore[arg-type]
            for k, (guests, on, strict, origin) in enumerate(nodes)
        ),
        guest_affinity=tuple(
            GuestAffinity(f"r{k}", tuple(guests), positive, True, origin)  # type: ignore[arg-type]
            for k, (guests, origin) in enumerate(guest_rules)
        ),
    )


@settings(max_examples=300, deadline=None)
@given(node_specs, negative_specs)
@example(  # a guest in rules of three origins: the tag rule goes, then the configured one
    [
        (["g0"], {"a"}, True, "platform"),
        (["g0", "g1"], {"b"}, True, "config"),
        (["g0", "g1"], {"c"}, False, "tag"),
    ],
    [],
)
@example(  # a strict tag rule confines a configured negative rule: the tag rule goes
    [(["g0", "g1"], {"a"}, True, "tag"), (["g2", "g3"], {"b"}, True, "config")],
    [(["g0", "g1"], "config"), (["g2", "g3"], "tag"), (["g1", "g2"], "config")],
)
def test_the_node_rule_checks_in_one_pass_find_what_starting_over_finds(
    nodes: list[tuple[list[str], set[str], bool, str]], negatives: list[tuple[list[str], str]]
) -> None:
    rules = _rules(nodes, negatives)
    kept, problems = find_rule_problems(rules, CONFIGURED)
    expected = reference(rules)
    assert [str(p) for p in problems] == [str(p) for p in expected]
    assert problems == expected
    dropped = {name for p in expected for name in p.rules}
    assert [r.name for r in (*kept.node_affinity, *kept.guest_affinity)] == [
        r.name for r in (*rules.node_affinity, *rules.guest_affinity) if r.name not in dropped
    ]


def common_node_reference(rules: Rules) -> list[RuleProblem]:
    """The problems of ``rules`` (node rules and hard positive rules of distinct guests), every
    search started over after a drop between origins."""
    done = StartingOver()
    done.settle(lambda: _overlaps(rules, done))
    what = "strict node affinity leaves their guests no common node"

    def no_common_node() -> Iterator[Found]:
        positives = [r for r in rules.guest_affinity if done.kept(r)]
        strict = {
            g: (r, frozenset(r.nodes) & CONFIGURED)
            for r in rules.node_affinity
            if r.strict and done.kept(r)
            for g in r.guests
        }
        for group_rules, members in positive_components(positives):
            confined = [strict[g] for g in sorted(members) if g in strict]
            if confined and not frozenset.intersection(*(nodes for _, nodes in confined)):
                confining = list({r.name: r for r, _ in confined}.values())
                problem = RuleProblem(tuple(sorted(r.name for r in group_rules)), what)
                yield [*group_rules, *confining], list(group_rules), problem, what

    done.settle(no_common_node)
    return done.problems


@settings(max_examples=300, deadline=None)
@given(node_specs, negative_specs)
@example(  # a tag group over two configured pins to different nodes: the tag rule goes
    [(["g0"], {"a"}, True, "config"), (["g1"], {"b"}, True, "config")],
    [(["g0", "g1"], "tag")],
)
@example(  # configured groups over tag pins: the pins go, and no group is left without a node
    [(["g0", "g2"], {"a"}, True, "tag"), (["g1"], {"b"}, True, "tag")],
    [(["g0", "g1"], "config"), (["g2", "g1"], "config"), (["g3", "g4"], "platform")],
)
def test_the_common_node_check_in_one_pass_finds_what_starting_over_finds(
    nodes: list[tuple[list[str], set[str], bool, str]], positives: list[tuple[list[str], str]]
) -> None:
    rules = _rules(nodes, positives, positive=True)
    kept, problems = find_rule_problems(rules, CONFIGURED)
    expected = common_node_reference(rules)
    assert [str(p) for p in problems] == [str(p) for p in expected]
    assert problems == expected
    dropped = {name for p in expected for name in p.rules}
    assert [r.name for r in kept.guest_affinity] == [
        r.name for r in rules.guest_affinity if r.name not in dropped
    ]
