"""The guest-rule checks look rules up by guest and settle contradictions between origins without
starting over: on small random rule sets they find what a plain quadratic check that starts over
after each drop finds — the same problems, in the same order, with the same words."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from opendrs.cli.planning import make_plan
from opendrs.engine.bounds import migration_lower_bound
from opendrs.engine.constraints import RuleProblem, check_rules, rule_checks
from opendrs.engine.constraints.rule_checks import find_rule_problems, positive_components
from opendrs.engine.strategies import get_strategy
from opendrs.engine.usage import LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import ORIGINS, GuestAffinity, Rules
from rule_reference import Found, StartingOver

GiB = 1024**3


def reference(rules: Sequence[GuestAffinity], n_nodes: int) -> list[RuleProblem]:
    """Guest-rule problems, every pair compared and every search started over after a drop."""
    done = StartingOver()

    def opposite() -> Iterator[Found]:
        kept = [r for r in rules if done.kept(r)]
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
        hard_pos = [r for r in rules if r.positive and r.hard and done.kept(r)]
        for comp_rules, members in positive_components(hard_pos):
            for neg in [r for r in rules if not r.positive and r.hard]:
                shared = sorted(set(neg.guests) & members)
                if done.kept(neg) and len(shared) >= 2:
                    guests = ", ".join(f"'{g}'" for g in shared)
                    why = "both together (through shared guests) and apart"
                    names = (*sorted(r.name for r in comp_rules), neg.name)
                    problem = RuleProblem(names, f"they keep guests {guests} {why}")
                    involved = [*comp_rules, neg]
                    yield involved, involved, problem, f"guests {guests} are kept {why}"

    for rule in rules:
        if len(set(rule.guests)) < 2:
            done.drop([rule], RuleProblem((rule.name,), "it names fewer than two guests"))
        elif not rule.positive and rule.hard and len(set(rule.guests)) > n_nodes:
            why = f"it keeps {len(set(rule.guests))} guests apart on only {n_nodes} nodes"
            done.drop([rule], RuleProblem((rule.name,), why))
    done.settle(opposite)
    done.settle(merged)
    return done.problems


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


def _counting_checks(monkeypatch) -> list[object]:
    """The calls of :func:`find_rule_problems` from now on (check_rules makes one each)."""
    calls: list[object] = []
    checked = rule_checks.find_rule_problems

    def counted(*args: object) -> object:
        calls.append(args)
        return checked(*args)

    monkeypatch.setattr(rule_checks, "find_rule_problems", counted)
    return calls


def test_a_cycle_view_checks_the_rules_once_and_hands_them_down(monkeypatch) -> None:
    cluster = _cluster([(["g0", "g1"], True, True, "config"), (["g0", "g1"], False, True, "tag")])
    calls = _counting_checks(monkeypatch)
    view = CycleView(cluster)
    cons = view.constraints
    assert cons.rules is view.rule_check.rules and cons.problems is view.rule_check.problems
    assert view.guarding(None, frozenset({("g0", "b")})).constraints.rules is cons.rules
    assert CycleView.holding(cluster, constraints=cons).rule_check.rules is cons.rules
    assert CycleView(cluster).with_rule_check(view.rule_check).constraints.rules is cons.rules
    assert len(calls) == 1
    assert [str(p) for p in view.rule_check.problems] == [
        "Ignore tag rule 'r1', because guests 'g0', 'g1' are kept both together and apart, "
        "and configured rule 'r0' holds"
    ]
    # Nothing is kept between calls: check_rules checks again.
    assert check_rules(cluster) == view.rule_check
    assert len(calls) == 2


def test_a_plan_checks_the_rules_once(monkeypatch) -> None:
    cluster = _cluster([(["g0", "g1"], True, True, "config"), (["g2", "g3"], False, True, "tag")])
    calls = _counting_checks(monkeypatch)
    strategy = get_strategy("balance")
    make_plan(
        cluster,
        strategy,
        strategy.options.parse("balance", {}),
        max_parallel=None,
        max_node_inflow=None,
    )
    assert len(calls) == 1


def test_a_plan_builds_the_balance_loads_once(monkeypatch) -> None:
    """The strategy and the lower bounds read the loads the plan built, the cluster's own (its
    rules hold: no repair)."""
    cluster = _cluster([(["g0", "g1"], True, True, "config")])
    built: list[Cluster] = []
    build = LoadModel.build.__func__  # type: ignore[attr-defined]

    def counting(cls, of: Cluster, *args, **kwargs) -> LoadModel:
        built.append(of)
        return build(cls, of, *args, **kwargs)

    monkeypatch.setattr(LoadModel, "build", classmethod(counting))
    strategy = get_strategy("balance")
    result = make_plan(
        cluster,
        strategy,
        strategy.options.parse("balance", {}),
        max_parallel=None,
        max_node_inflow=None,
    )
    assert result.plan.moves
    assert [of for of in built if of is cluster] == [cluster]
    monkeypatch.undo()
    kept = result.constraints.rules
    assert result.bounds == migration_lower_bound(cluster, result.achieved, kept=kept)
