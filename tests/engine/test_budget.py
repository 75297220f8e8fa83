"""The migration budget: at most ``max_migrations_per_day`` balancing migrations in any 24 hours
(one in any ``1 / budget`` days for a fraction below 1; with ``migration_budget_window``, the
budget × the window in days in any such window, free to be spent together), repairs exempt, the
budget left spent on the moves that buy the most balance."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from opendrs.engine.planner import final_placement
from opendrs.engine.policy import (
    BUDGET_WINDOW,
    Decision,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    budget_allowance,
    budget_window,
    decide,
    parse_policy,
)
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.document import DocumentError, Reader
from opendrs.report.reasons import explain

GiB = 1024**3
DAY = 86400
NOW = 1_000_000.0
#: Act on the first observation above the threshold, no other guard.
EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _g(gid: str, node: str, cores: float) -> Guest:
    return Guest(gid, node, cpu=cores, memory=int(cores * 10 * GiB), uptime=DAY)


def _cluster(*guests: Guest, maintenance: str = "") -> Cluster:
    nodes = tuple(
        Node(f"n{i}", 10, 100 * GiB, maintenance=f"n{i}" == maintenance) for i in (1, 2, 3)
    )
    return Cluster(nodes, guests, settings=Settings(mode="static"))


def _eight_on_n1() -> Cluster:
    return _cluster(*(_g(f"g{i}", "n1", 1) for i in range(8)))


def _decide(
    cluster: Cluster, config: PolicyConfig, spent: tuple[float, ...] = (), now: float = NOW
) -> Decision:
    past = PastMigrations(budget_spent=spent)
    return decide(cluster, now, config, PolicyState(), past, busy=False)


def _spread(cluster: Cluster, placement: dict[str, str]) -> float:
    """The cpu spread (memory reads alike here) with guests placed as ``placement``."""
    load = {n.name: 0.0 for n in cluster.nodes if n.usable}
    for guest in cluster.guests:
        load[placement.get(guest.id, guest.node)] += guest.cpu / 10
    return max(load.values()) - min(load.values())


def test_a_spent_budget_stops_balancing_and_says_when_it_frees() -> None:
    config = replace(EAGER, max_migrations_per_day=3)
    # Three migrations 20, 10 and 5 hours ago: the budget is spent; the oldest leaves the
    # window in 4 hours. One 30 hours ago is out of it.
    spent = (NOW - 20 * 3600, NOW - 10 * 3600, NOW - 5 * 3600, NOW - 30 * 3600)
    decision = _decide(_eight_on_n1(), config, spent)
    assert not decision.act and decision.code == "budget" and decision.plan is None
    assert explain(decision).endswith(
        "; the migration budget is spent: 3 of 3 in the last 24 h; the next is free in 4h"
    )
    # The hold stays reached: the first observation once the budget frees may act.
    assert decision.state.hold == 1
    later = _decide(_eight_on_n1(), config, spent, now=NOW + 4 * 3600)
    assert later.act and later.code == "plan" and len(later.plan.moves) == 1  # type: ignore[union-attr]
    # A budget of 0 never balances.
    assert _decide(_eight_on_n1(), replace(EAGER, max_migrations_per_day=0)).code == "budget"


def test_what_is_left_is_the_most_a_plan_makes() -> None:
    # Balance would move five of the eight guests; two are left of a budget of 5.
    cluster = _eight_on_n1()
    assert len(_decide(cluster, EAGER).plan.moves) == 5  # type: ignore[union-attr]
    config = replace(EAGER, max_migrations_per_day=5)
    decision = _decide(cluster, config, (NOW - 3600, NOW - 7200, NOW - 9000))
    assert decision.act and decision.code == "plan" and decision.budgeted
    assert len(decision.plan.moves) == 2  # type: ignore[union-attr]
    assert decision.proposal is not None and decision.proposal.options["max_moves"] == 2
    assert explain(decision).endswith("with 2 migrations, what the budget leaves of a plan of 5")
    # The batch still bounds it when it is less.
    assert len(_decide(cluster, replace(config, batch=1)).plan.moves) == 1  # type: ignore[union-attr]
    # A strategy without max_moves is cut to what is left.
    greedy = replace(config, strategy="static-greedy")
    cut = _decide(cluster, greedy, (NOW - 3600, NOW - 7200))
    assert cut.act and len(cut.plan.moves) == 3  # type: ignore[union-attr]
    assert "migrations (budget 3)" in cut.proposal.stopped  # type: ignore[union-attr]


def test_the_margin_is_the_whole_plans_to_clear() -> None:
    # The margin asks 25 % of the whole plan (80 → 10 pp); one migration brings the spread from
    # 80 to 70 pp (12 %): with a budget of 1 that part of the plan is made, not refused.
    cluster = _eight_on_n1()
    margin = replace(EAGER, margin=0.25)
    whole = _decide(cluster, margin)
    assert whole.act and len(whole.plan.moves) == 5  # type: ignore[union-attr]
    cut = _decide(cluster, replace(margin, max_migrations_per_day=1))
    assert cut.act and cut.code == "plan" and len(cut.plan.moves) == 1  # type: ignore[union-attr]
    assert cut.predicted is not None and cut.predicted < cut.metric
    # A budget larger than the plan cuts nothing.
    assert _decide(cluster, replace(margin, max_migrations_per_day=50)).plan == whole.plan
    # A budget never acts where no budget would not: the whole plan (87.5 % better) is below a
    # 90 % margin, so its first migration is not made either.
    strict = replace(EAGER, margin=0.9)
    assert _decide(cluster, strict).code == "below-margin"
    assert _decide(cluster, replace(strict, max_migrations_per_day=1)).code == "below-margin"


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_the_budget_buys_the_most_balance_per_migration(budget: int) -> None:
    # Guests of unequal sizes, all on n1 and n2: every placement that differs from this one in at
    # most ``budget`` guests is tried; none has a lower spread than the plan the budget allows.
    guests = (
        _g("a", "n1", 4),
        _g("b", "n1", 2),
        _g("c", "n1", 1),
        _g("d", "n1", 0.5),
        _g("e", "n2", 1.5),
        _g("f", "n2", 0.5),
    )
    cluster = _cluster(*guests)
    decision = _decide(cluster, replace(EAGER, max_migrations_per_day=budget))
    assert decision.act and decision.plan is not None
    assert len(decision.plan.moves) <= budget
    got = _spread(cluster, final_placement(decision.plan.moves))
    assert decision.predicted == pytest.approx(got)
    nodes = [n.name for n in cluster.nodes]
    best = min(
        _spread(cluster, dict(zip(moved, targets, strict=True)))
        for k in range(budget + 1)
        for moved in itertools.combinations([g.id for g in guests], k)
        for targets in itertools.product(nodes, repeat=k)
    )
    assert got == pytest.approx(best)


def test_repairs_are_exempt_and_counted_apart() -> None:
    # A guest on n3, in maintenance, with the budget spent: repaired all the same, and not
    # counted against the budget.
    cluster = _cluster(_g("a", "n1", 2), _g("b", "n2", 2), _g("m", "n3", 1), maintenance="n3")
    config = replace(EAGER, max_migrations_per_day=1)
    decision = _decide(cluster, config, (NOW - 60,))
    assert decision.act and decision.code == "repair" and not decision.budgeted
    assert [m.guest for m in decision.plan.moves] == ["m"]  # type: ignore[union-attr]


def _hot_cluster() -> Cluster:
    """n1 at 92 % of its cpu on measured usage (hot at 85 %), within its capacity."""
    nodes = tuple(Node(f"n{i}", 10, 64 * GiB) for i in (1, 2, 3))
    guests = tuple(
        Guest(f"g{k}", "n1", cpu=4, memory=4 * GiB, cpu_used=c, memory_used=GiB, uptime=DAY)
        for k, c in enumerate((5.0, 3.6, 0.3, 0.3))
    )
    return Cluster(nodes, guests, settings=Settings(mode="dynamic"))


def test_relieving_a_node_that_only_runs_hot_counts_against_the_budget() -> None:
    # A hold of two: balancing waits, the relief does not.
    config = replace(EAGER, hold=2, hot=0.85, max_migrations_per_day=1)
    relieved = _decide(_hot_cluster(), config)
    assert relieved.act and relieved.code == "repair" and relieved.budgeted
    spent = _decide(_hot_cluster(), config, (NOW - 60,))
    assert not spent.act
    assert "repair needed (n1 runs hot" in explain(spent)
    assert "the migration budget is spent: 1 of 1 in the last 24 h" in explain(spent)


def test_without_a_budget_nothing_changes() -> None:
    cluster = _eight_on_n1()
    spent = tuple(NOW - 60 * k for k in range(1, 50))
    assert _decide(cluster, EAGER, spent) == _decide(cluster, EAGER)
    assert BUDGET_WINDOW == DAY


def _starts(config: PolicyConfig, days: int) -> list[float]:
    """When budgeted migrations start, observed every hour for ``days`` days on a cluster that
    always wants balancing (observed as it was: what the budget lets through is all that
    counts)."""
    spent: list[float] = []
    for hour in range(days * 24):
        now = NOW + hour * 3600
        decision = _decide(_eight_on_n1(), config, tuple(spent), now=now)
        if decision.act:
            assert decision.code == "plan" and decision.budgeted
            spent += [now] * len(decision.plan.moves)  # type: ignore[union-attr]
        else:
            assert decision.code == "budget"
    return spent


@pytest.mark.parametrize(("budget", "days"), [(0.5, 2), (1 / 3, 3), (0.25, 4)])
def test_a_fractional_budget_makes_one_migration_in_any_window(budget: float, days: int) -> None:
    # Observed every hour for two weeks, the cluster always wants balancing (it is observed as
    # it was: what the budget lets through is all that counts). One migration starts every
    # ``days`` days, the first at once; no window of ``days`` days holds two.
    config = replace(EAGER, max_migrations_per_day=budget)
    assert budget_window(budget) == days * DAY and budget_allowance(budget) == 1
    spent = _starts(config, 14)
    assert spent == [NOW + k * days * DAY for k in range(-(-14 // days))]


def test_a_fractional_budget_says_its_window() -> None:
    config = replace(EAGER, max_migrations_per_day=0.5)
    decision = _decide(_eight_on_n1(), config, (NOW - 30 * 3600,))
    assert decision.code == "budget"
    assert explain(decision).endswith(
        "; the migration budget is spent: 1 of 1 in the last 2d; the next is free in 18h"
    )
    # Out of the 48 hours, it no longer counts.
    assert _decide(_eight_on_n1(), config, (NOW - 49 * 3600,)).act


def test_whole_budgets_keep_the_day() -> None:
    assert [budget_window(b) for b in (0, 1, 7)] == [DAY, DAY, DAY]
    assert [budget_allowance(b) for b in (0, 1, 7)] == [0, 1, 7]


def _parse(value: object) -> PolicyConfig:
    return parse_policy(Reader("opendrs.yaml"), value, ("policy",))


def test_parse_the_budget() -> None:
    assert _parse({}).max_migrations_per_day is None
    assert _parse({"max_migrations_per_day": 40}).max_migrations_per_day == 40
    assert _parse({"max_migrations_per_day": 0}).max_migrations_per_day == 0
    assert _parse({"max_migrations_per_day": None}).max_migrations_per_day is None
    preset = _parse({"preset": "proxmox", "max_migrations_per_day": 5})
    assert preset.name == "proxmox" and preset.max_migrations_per_day == 5
    # Fractions below 1, as numbers or ``1/N``; a whole number written as a float is whole.
    assert _parse({"max_migrations_per_day": 0.5}).max_migrations_per_day == 0.5
    assert _parse({"max_migrations_per_day": "1/3"}).max_migrations_per_day == 1 / 3
    assert _parse({"max_migrations_per_day": 0.01}).max_migrations_per_day == 0.01
    whole = _parse({"max_migrations_per_day": 2.0}).max_migrations_per_day
    assert whole == 2 and isinstance(whole, int)


EXPECTED = (
    "expected a whole number from 0 to 100000, or a fraction from 0.01 to below 1 such as 0.5 "
    "or 1/3 (one migration in any 2 or 3 days), got "
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, EXPECTED + "-1"),
        (2.5, EXPECTED + "2.5"),
        (0.001, EXPECTED + "0.001"),
        (100_001, EXPECTED + "100001"),
        ("2/3", EXPECTED + "'2/3'"),
        ("1/0", EXPECTED + "'1/0'"),
        ("ten", EXPECTED + "'ten'"),
        (True, EXPECTED + "true"),
        (float("nan"), EXPECTED + "nan"),
    ],
)
def test_a_bad_budget_is_one_line(value: object, message: str) -> None:
    with pytest.raises(DocumentError) as info:
        _parse({"max_migrations_per_day": value})
    text = str(info.value)
    assert text == f"opendrs.yaml: policy.max_migrations_per_day: {message}"


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", 0.0, 0.005, float("inf")])
def test_the_config_refuses_a_bad_budget(value: object) -> None:
    with pytest.raises(ValueError, match="policy max_migrations_per_day: expected a whole"):
        PolicyConfig(max_migrations_per_day=value)  # type: ignore[arg-type]


# The budget's window (``migration_budget_window``).


def _most_in_any(starts: list[float], window: float) -> int:
    return max(sum(1 for t in starts if s <= t < s + window) for s in starts)


def test_half_a_day_over_a_fortnight_spends_seven_together() -> None:
    config = replace(EAGER, batch=1, max_migrations_per_day=0.5, migration_budget_window=14 * DAY)
    starts = _starts(config, 28)
    # Seven in the first seven hours (one a decision, batch 1), then nothing till the first
    # leaves the window 14 days later, then seven again.
    assert starts[:7] == [NOW + h * 3600 for h in range(7)]
    assert starts[7:] == [NOW + 14 * DAY + h * 3600 for h in range(7)]
    assert _most_in_any(starts, 14 * DAY) == 7
    # Without the window: one in any two days, never two in any 48 hours.
    spread = _starts(replace(config, migration_budget_window=None), 28)
    assert spread == [NOW + k * 2 * DAY for k in range(14)]
    assert _most_in_any(spread, 2 * DAY) == 1


def test_the_window_is_named_when_spent() -> None:
    config = replace(EAGER, max_migrations_per_day=0.5, migration_budget_window=14 * DAY)
    spent = tuple(NOW - (10 * DAY + k * 3600) for k in range(7))
    decision = _decide(_eight_on_n1(), config, spent)
    assert decision.code == "budget"
    assert explain(decision).endswith(
        "the migration budget is spent: 7 of 7 in the last 14d; the next is free in 3d 18h"
    )


@pytest.mark.parametrize(
    ("budget", "window", "allowed"),
    [(0.5, 14 * DAY, 7), (0.5, 30 * DAY, 15), (1 / 3, 6 * DAY, 2), (3, DAY // 2, 1)],
)
def test_the_allowance_is_the_budget_times_the_window(
    budget: float, window: int, allowed: int
) -> None:
    assert budget_window(budget, window) == window
    assert budget_allowance(budget, window) == allowed
    assert budget_allowance(0, window) == 0
    # Rounded down: three a day over 36 hours is four.
    assert budget_allowance(3, 36 * 3600) == 4


def test_no_window_keeps_the_window_of_before() -> None:
    for budget in (0, 1, 7, 0.5, 0.25):
        assert budget_window(budget, None) == budget_window(budget)
        assert budget_allowance(budget, None) == budget_allowance(budget)
    assert PolicyConfig().migration_budget_window is None


def test_parse_the_window() -> None:
    config = _parse({"max_migrations_per_day": 0.5, "migration_budget_window": "14d"})
    assert config.migration_budget_window == 14 * DAY
    assert _parse({"max_migrations_per_day": 2}).migration_budget_window is None
    nulled = {"max_migrations_per_day": 2, "migration_budget_window": None}
    assert _parse(nulled).migration_budget_window is None


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"migration_budget_window": "7d"},
            "needs max_migrations_per_day: a window without a budget limits nothing",
        ),
        (
            {"max_migrations_per_day": 0.25, "migration_budget_window": "2d"},
            "2d is too short for 0.25 migrations a day: it must hold one, at least 4d",
        ),
        (
            {"max_migrations_per_day": 1, "migration_budget_window": "10m"},
            "must be from 1h to 365d, got 10m",
        ),
        (
            {"max_migrations_per_day": 1, "migration_budget_window": "2y"},
            "cannot read '2y' as a duration (examples: 300s, 5m, 6h, 1d 6h)",
        ),
    ],
)
def test_a_bad_window_is_one_line(policy: dict[str, object], message: str) -> None:
    with pytest.raises(DocumentError) as info:
        _parse(policy)
    assert str(info.value) == f"opendrs.yaml: policy.migration_budget_window: {message}"


@pytest.mark.parametrize("window", [7 * DAY, True, 1.5 * DAY])
def test_the_config_refuses_a_window_it_cannot_use(window: object) -> None:
    # Without a budget, or not a whole number of seconds.
    budget = None if window == 7 * DAY else 1
    with pytest.raises(ValueError, match=r"^policy migration_budget_window: "):
        PolicyConfig(max_migrations_per_day=budget, migration_budget_window=window)  # type: ignore[arg-type]
