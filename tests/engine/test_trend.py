"""Relief on the trend: a node whose load rises steadily is forecast one interval ahead; a load
that jumps and stays, wobbles, rises slowly or falls is not; the forecast never makes a node over
its capacity, and a node forecast above the hot level is relieved before it gets there."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, UsageWindow, decide
from opendrs.engine.policy.trend import node_trend, with_trend
from opendrs.engine.usage import MeasuredUsage
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.report.reasons import explain

GiB = 2**30
DAY = 86_400
STEP = 300


def _cluster(busy: float, quiet: float = 1.0) -> Cluster:
    """n1 (10 cores) with a guest using ``busy`` cores and one using ``quiet``; n2 and n3 with
    one guest using a core each."""
    nodes = tuple(Node(f"n{k}", 10, 64 * GiB) for k in (1, 2, 3))

    def g(gid: str, node: str, used: float) -> Guest:
        return Guest(gid, node, cpu=10, memory=4 * GiB, cpu_used=used, memory_used=GiB, uptime=DAY)

    guests = (g("job", "n1", busy), g("web", "n1", quiet), g("b", "n2", 1.0), g("c", "n3", 1.0))
    return Cluster(nodes, guests, settings=Settings(mode="dynamic"))


def _window(loads: list[float]) -> tuple[UsageWindow, Cluster]:
    """The window after observations ``STEP`` apart with the busy guest at each of ``loads``."""
    window = UsageWindow(smoothing=6 * 3600)
    cluster = _cluster(loads[0])
    for k, busy in enumerate(loads):
        cluster = _cluster(busy)
        window = window.add(k * STEP, cluster)
    return window, cluster


def test_a_steady_rise_is_carried_on_one_interval_along_its_line() -> None:
    # n1 rises by 0.5 core (5 % of it) every 5 minutes for 15 minutes, all of it the busy
    # guest's: 0.5 more at the next observation, the busy guest's.
    window, cluster = _window([3.0, 3.5, 4.0, 4.5])
    trend = node_trend(window, cluster, STEP)
    assert trend.rising == (0,)
    assert trend.total[0, 0] == pytest.approx(0.5) and trend.total[0, 1] == 0.0
    assert trend.guests[0, 0] == pytest.approx(0.5) and np.all(trend.guests[1:] == 0.0)
    assert np.all(trend.total[1:] == 0.0) and np.all(trend.own == 0.0)


@pytest.mark.parametrize(
    "loads",
    [
        [3.0, 3.0, 7.0, 7.0],  # a turn: it jumps at once, then stays
        [3.0, 3.5, 3.4, 4.5],  # a wobble: one step down
        [3.0, 3.05, 3.1, 3.15],  # slower than 12 % an hour: a time of day's swing
        [4.5, 4.0, 3.5, 3.0],  # falling
        [3.0, 3.5, 4.0],  # too short a rise: 10 minutes
    ],
)
def test_what_is_no_steady_rise_is_forecast_nothing(loads: list[float]) -> None:
    window, cluster = _window(loads)
    assert node_trend(window, cluster, STEP).rising == ()


RAMP = [3.0, 3.5, 4.0, 4.5]


@pytest.mark.parametrize(
    ("after", "rising"),
    [
        ([4.5, 4.55, 4.6], True),  # a pause: creeping up too slowly to count, not fallen
        ([4.5] * 12, True),  # flat for an hour (TREND_RECALL) after the rise
        ([4.5] * 13, False),  # flat for longer: the rise is over
        ([4.5, 4.3], False),  # fallen by more than one step's least rise (0.1 core)
        ([4.5, 4.45], True),  # fallen by less
    ],
)
def test_a_steady_rise_that_pauses_is_still_forecast_for_an_hour(
    after: list[float], rising: bool
) -> None:
    # n1 rose 0.5 core every 5 minutes for 15 minutes, then paused: while its load has not
    # fallen, within TREND_RECALL of the rise's last step, the rise is carried on along its line
    # over the steady stretch (0.5 core an interval), from where the load is now.
    window, cluster = _window(RAMP + after)
    trend = node_trend(window, cluster, STEP)
    assert trend.rising == ((0,) if rising else ())
    if rising:
        assert trend.total[0, 0] == pytest.approx(0.5)
        assert trend.guests[0, 0] == pytest.approx(0.5)


def test_a_rise_that_has_fallen_from_its_peak_is_over_whatever_came_before() -> None:
    # A steady rise to 6 cores, then down to 4.6: the rise is over, though the load is still
    # above where an earlier stretch of the same rise ended (4.5).
    window, cluster = _window([3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 4.6])
    assert node_trend(window, cluster, STEP).rising == ()


def test_a_fall_a_guest_showed_is_not_forgotten_when_its_last_sample_is_unknown() -> None:
    # The rise to 6 cores fell to 3.5; then the busy guest's usage is not measured once: the
    # stretch and what came after it are judged on the same guests, so the old rise stays over.
    window = UsageWindow(smoothing=6 * 3600)
    for k, busy in enumerate([3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 3.5]):
        window = window.add(k * STEP, _cluster(busy))
    cluster = _cluster(3.5)
    unmeasured = replace(cluster.guests[0], cpu_used=None)
    cluster = replace(cluster, guests=(unmeasured, *cluster.guests[1:]))
    window = window.add(8 * STEP, cluster)
    assert node_trend(window, cluster, STEP).rising == ()


def test_a_guest_unknown_before_its_rise_still_makes_one() -> None:
    # The busy guest was not there (started since) for the first observations of the hour,
    # then rose steadily: its rise is judged on the observations it was known at.
    window = UsageWindow(smoothing=6 * 3600)
    cluster = _cluster(1.0)
    quiet = replace(cluster, guests=cluster.guests[1:])
    for k in range(5):
        window = window.add(k * STEP, quiet)
    for k, busy in enumerate([3.0, 3.5, 4.0, 4.5], start=5):
        cluster = _cluster(busy)
        window = window.add(k * STEP, cluster)
    trend = node_trend(window, cluster, STEP)
    assert trend.rising == (0,) and trend.guests[0, 0] == pytest.approx(0.5)


def test_the_latest_steady_rise_is_the_one_carried_on() -> None:
    # A fast rise, a pause, then a slower steady one: the slower, the latest, is forecast.
    window, cluster = _window([3.0, 4.0, 5.0, 6.0, 6.0, 6.2, 6.4, 6.6])
    trend = node_trend(window, cluster, STEP)
    assert trend.rising == (0,) and trend.total[0, 0] == pytest.approx(0.2)


def test_a_forecast_never_makes_a_node_over_its_capacity_and_names_it() -> None:
    # n1 at 9.5 of 10 cores, rising 1 core every 5 minutes: raised to 99 % of it, not beyond;
    # above the hot level already, it runs hot: not named as forecast to.
    window, cluster = _window([6.5, 7.0, 7.75, 8.5])
    trend = node_trend(window, cluster, STEP)
    recent = MeasuredUsage.of(cluster)
    raised = with_trend(recent, cluster, trend, 0.85)
    assert raised.forecast == frozenset()
    assert raised.cpu[0] == pytest.approx(9.9 - 1.0)
    assert list(raised.cpu[1:]) == list(recent.cpu[1:])
    assert list(raised.base_cpu) == list(recent.base_cpu)


def test_a_node_forecast_above_the_hot_level_is_relieved_before_it_gets_there() -> None:
    # n1 at 8.0 of 10 cores (80 %), rising 6 % every 5 minutes: 86 % at the next observation.
    # No balancing (threshold 100 %): only the relief may move a guest.
    config = PolicyConfig(
        threshold=1.0, hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0
    )
    window, cluster = _window([5.2, 5.8, 6.4, 7.0])
    now = 3 * STEP
    plain = decide(cluster, now, config, PolicyState(), PastMigrations(), busy=False)
    assert not plain.act
    trend = node_trend(window, cluster, STEP)
    recent = with_trend(MeasuredUsage.of(cluster), cluster, trend, 0.85)
    decision = decide(
        cluster, now, config, PolicyState(), PastMigrations(), busy=False, recent=recent
    )
    assert decision.act and decision.code == "repair" and decision.plan is not None
    assert explain(decision).startswith(
        "repair: n1 is forecast to run hot (cpu_used rising above 85 %); 1 migration"
    )
    # The rising guest takes its rise along (7.6 cores): no node has room for it, web moves.
    assert {m.guest for m in decision.plan.moves} == {"web"}
    assert recent.forecast == frozenset({"n1"})
    assert dict(decision.state.hot_seen) == {"n1": now}
    # Without a hot level nothing is forecast in the controller, and nothing is relieved.
    off = decide(
        cluster, now, replace(config, hot=None), PolicyState(), PastMigrations(), busy=False
    )
    assert not off.act
