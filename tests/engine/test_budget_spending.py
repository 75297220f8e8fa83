"""Spending the migration budget on reaction (``spend_budget``): a budget above one migration per
smoothing window lets the policy react faster — usage closer to the recent demand, a shorter
hold, the margin kept — in proportion to what the rolling window has left; no budget, a small
one, a spent one or one that only caps decides as the default does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, decide
from opendrs.engine.policy.smoothing import UsageWindow
from opendrs.engine.policy.spending import blend, eagerness, reach, react
from opendrs.engine.usage import MeasuredUsage
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.report.reasons import explain

GiB = 1024**3
DAY = 86400
NOW = 1_000_000.0
DEFAULT = PolicyConfig()


def spending(**changes: object) -> PolicyConfig:
    """The default policy with ``changes`` (a budget) and ``spend_budget`` on."""
    return replace(DEFAULT, spend_budget=True, **changes)  # type: ignore[arg-type]


def test_a_budget_only_caps_unless_spending_is_on() -> None:
    assert reach(replace(DEFAULT, max_migrations_per_day=96)) == 0.0
    assert reach(spending(max_migrations_per_day=96)) == 1.0
    assert _decide(replace(DEFAULT, max_migrations_per_day=96))[1] == "balanced"


def test_spending_needs_a_budget() -> None:
    with pytest.raises(ValueError, match="spend_budget: needs max_migrations_per_day"):
        replace(DEFAULT, spend_budget=True)


def test_no_budget_or_a_small_one_reaches_nothing() -> None:
    assert reach(DEFAULT) == 0.0
    # The default's 6-hour smoothing affords one migration per 6 hours: 4 a day.
    for budget in (0, 0.5, 1, 2, 3, 4):
        assert reach(spending(max_migrations_per_day=budget)) == 0.0
    # A budget window counts the rate: 15 in any 30 days is half a migration a day.
    assert reach(spending(max_migrations_per_day=0.5, migration_budget_window=30 * DAY)) == 0
    # No smoothing longer than the hold: nothing to reach towards.
    assert reach(spending(max_migrations_per_day=30, smoothing=1800)) == 0.0


def test_a_larger_budget_reaches_by_its_horizon() -> None:
    # 30 a day: a migration every 48 minutes, from 6 h towards the hold's 30 minutes.
    assert reach(spending(max_migrations_per_day=30)) == pytest.approx(
        (6 * 3600 - 48 * 60) / (6 * 3600 - 1800)
    )
    assert reach(spending(max_migrations_per_day=5)) == pytest.approx(
        (6 * 3600 - 4.8 * 3600) / (6 * 3600 - 1800)
    )
    # 48 a day or more: a horizon at most the hold's, all the way.
    assert reach(spending(max_migrations_per_day=48)) == 1.0
    assert reach(spending(max_migrations_per_day=500)) == 1.0
    # The same rate over a week's window reaches as far.
    weekly = spending(max_migrations_per_day=30, migration_budget_window=7 * DAY)
    assert reach(weekly) == pytest.approx(reach(spending(max_migrations_per_day=30)))


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=300))
def test_eagerness_falls_with_what_is_spent(budget: int, spent: int) -> None:
    config = spending(max_migrations_per_day=budget)
    left = max(budget - spent, 0)
    e = eagerness(config, left)
    assert 0.0 <= e <= reach(config) <= 1.0
    assert e == pytest.approx(reach(config) * left / budget if budget else 0.0)
    if left == 0:
        assert e == 0.0
    assert eagerness(config, None) == 0.0


def _usage(cpu: list[float]) -> MeasuredUsage:
    def frozen(values: list[float]) -> np.ndarray:
        out = np.array(values, dtype=np.float64)
        out.setflags(write=False)
        return out

    ids = tuple(f"g{k}" for k in range(len(cpu)))
    return MeasuredUsage(
        ids,
        ("n1", "n2"),
        frozen(cpu),
        frozen([float(GiB)] * len(cpu)),
        frozen([0.0, 0.0]),
        frozen([0.0, 0.0]),
    )


def test_react_scales_the_hold_and_the_usage() -> None:
    average, latest = _usage([1.0, 3.0]), _usage([3.0, 1.0])
    # No budget, or all spent: the same config and usage, untouched.
    for config, left in ((DEFAULT, None), (spending(max_migrations_per_day=30), 0)):
        same = react(config, left, average, latest)
        assert same.config is config and same.average is average
    budget = spending(max_migrations_per_day=96)  # reach 1
    full = react(budget, 96, average, latest)
    assert (full.config.hold, full.config.margin) == (1, 0.25)  # each plan still pays for itself
    assert full.average is not None and list(full.average.cpu) == [3.0, 1.0]
    half = react(budget, 48, average, latest)
    assert half.config == replace(budget, hold=3)
    assert half.average is not None and list(half.average.cpu) == [2.0, 2.0]
    # Without the recent mean only the hold changes.
    assert react(budget, 96, average, None).average is average
    with pytest.raises(ValueError, match="another cluster"):
        blend(average, _usage([1.0, 2.0, 3.0]), 0.5)


def _cluster(now: tuple[float, float, float, float]) -> Cluster:
    """Two nodes of 10 cores; a and b on n1, c and d on n2, using ``now`` cores."""
    nodes = (Node("n1", 10, 64 * GiB), Node("n2", 10, 64 * GiB))
    guests = tuple(
        Guest(gid, node, cpu=8, memory=4 * GiB, cpu_used=c, memory_used=2 * GiB, uptime=DAY)
        for gid, node, c in zip("abcd", ("n1", "n1", "n2", "n2"), now, strict=True)
    )
    return Cluster(nodes, guests, settings=Settings(mode="dynamic"))


def _decide(config: PolicyConfig, spent: int = 0, hold: int = 0) -> tuple[bool, str, str]:
    """A decision on an observation whose six-hour average is balanced (every guest at 2 cores)
    and whose last half hour is not (a and b at 4, c and d at 1: n1 80 %, n2 20 %)."""
    cluster = _cluster((4.0, 4.0, 1.0, 1.0))
    average = MeasuredUsage.replacing(
        cluster, np.full(4, 2.0), np.full(4, 2.0 * GiB), np.zeros(2), np.zeros(2)
    )
    latest = MeasuredUsage.of(cluster)
    past = PastMigrations(budget_spent=tuple(NOW - 600.0 * (k + 1) for k in range(spent)))
    state = PolicyState(hold=hold)
    decision = decide(cluster, NOW, config, state, past, busy=False, average=average, latest=latest)
    return decision.act, decision.code, explain(decision)


def test_with_budget_left_the_recent_demand_is_balanced_at_once() -> None:
    # No budget: the six-hour average is balanced, the recent half hour does not count.
    assert _decide(DEFAULT)[1] == "balanced"
    # A small budget buys no faster reaction: the same.
    assert _decide(spending(max_migrations_per_day=4))[1] == "balanced"
    # 96 a day, none spent: balancing reads the last half hour, acts on the first observation.
    act, code, reason = _decide(spending(max_migrations_per_day=96))
    assert (act, code) == (True, "plan")
    assert reason.startswith(
        "spread 60.0 pp above threshold 15 pp for 1 of 1 observations (hastened by the budget "
        "left, 96 of 96: usage 100 % of the way to the last 30m); plan brings it to "
    )
    # 19 of 96 left: the usage a fifth of the way there (n1 at 48 %, n2 at 36 %, 12 pp).
    assert _decide(spending(max_migrations_per_day=96), spent=77)[1] == "balanced"
    # Spent: the default's decision again (the budget guard aside, nothing to spend).
    assert _decide(spending(max_migrations_per_day=96), spent=96)[1] == "balanced"


def test_half_the_budget_left_holds_half_as_long() -> None:
    config = spending(max_migrations_per_day=96)
    # 48 left of 96: the usage halfway (n1 60 %, n2 30 %, 30 pp), a hold of 3 of the 6.
    act, code, reason = _decide(config, spent=48)
    assert (act, code) == (False, "holding")
    assert reason == (
        "spread 30.0 pp above threshold 15 pp for 1 of 3 observations (hastened by the budget "
        "left, 48 of 96: usage 50 % of the way to the last 30m); waiting"
    )
    assert _decide(config, spent=48, hold=2)[:2] == (True, "plan")


def test_the_window_gives_the_plain_mean_over_the_hold() -> None:
    window = UsageWindow()
    for k, cores in enumerate((1.0, 1.0, 1.0, 4.0, 2.0)):
        window = window.add(NOW + 300 * k, _cluster((cores, 1.0, 1.0, 1.0)), 6 * 3600)
    cluster = _cluster((2.0, 1.0, 1.0, 1.0))
    # The last 600 s hold the last two samples, (300, 600] before the last: 4 and 2 cores.
    assert window.latest(cluster, 600).cpu[0] == pytest.approx(3.0)
    assert window.latest(cluster, 0).cpu[0] == pytest.approx(2.0)  # the last sample at least
    # The recent usage is the higher of that and the whole window's mean (9 / 5 cores).
    average, recent = window.usage(cluster, 600)
    assert (average.cpu[0], recent.cpu[0]) == (pytest.approx(1.8), pytest.approx(3.0))
    assert window.latest(cluster, 900).cpu[0] == pytest.approx(7 / 3)  # 1, 4 and 2
    assert UsageWindow().latest(cluster, 600).cpu[0] == 2.0  # empty: the observation's own
    with pytest.raises(ValueError, match="span"):
        window.latest(cluster, -1)
