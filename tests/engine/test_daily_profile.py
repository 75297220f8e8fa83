"""Demand per time of day (``policy.daily_profile``): the profile of usage per hour of the day,
and balancing on every hour at once — guests whose peaks do not coincide paired."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.constraints import Constraints
from opendrs.engine.planner import final_placement
from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, decide, parse_policy
from opendrs.engine.policy.dayplan import day_proposal
from opendrs.engine.policy.profile import (
    HOURS,
    DailyProfile,
    day_metric,
    hour_of_day,
    profile_samples,
    trailing_mean,
)
from opendrs.engine.strategies.base import Stop
from opendrs.engine.usage import LoadModel, MeasuredUsage
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.document import DocumentError, Reader
from opendrs.report.reasons import explain
from opendrs.report.words import decision_words

GiB = 1024**3
DAY = 86400
HOUR = 3600
#: Act on the first observation above the threshold, no other guard.
EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _cluster(cpu: dict[str, float | None], placement: dict[str, str] | None = None) -> Cluster:
    """Two 10-core nodes; guests a1, a2 on n1 and b1, b2 on n2 (or ``placement``), each using
    ``cpu[guest]`` cores (None: not measured)."""
    placement = placement or {"a1": "n1", "a2": "n1", "b1": "n2", "b2": "n2"}
    nodes = (Node("n1", 10, 100 * GiB), Node("n2", 10, 100 * GiB))
    guests = tuple(
        Guest(
            gid,
            node,
            cpu=4,
            memory=GiB,
            cpu_used=cpu.get(gid),
            memory_used=GiB // 2,
            uptime=DAY,
        )
        for gid, node in placement.items()
    )
    return Cluster(nodes, guests, settings=Settings(mode="dynamic"))


def _busy(hour: int) -> dict[str, float | None]:
    """a1 and a2 busy from 8 to 11, b1 and b2 from 20 to 23; idle otherwise."""
    a = 4.0 if 8 <= hour < 12 else 0.5
    b = 4.0 if 20 <= hour < 24 else 0.5
    return {"a1": a, "a2": a, "b1": b, "b2": b}


def _day_profile(placement: dict[str, str] | None = None) -> DailyProfile:
    profile = DailyProfile()
    for hour in range(HOURS):
        profile = profile.add(hour * HOUR, _cluster(_busy(hour), placement), samples=3)
    return profile


def test_hour_of_day_and_samples() -> None:
    assert [hour_of_day(t) for t in (0, 3599, 3600, DAY - 1, DAY, 5 * DAY + 7 * HOUR)] == [
        0,
        0,
        1,
        23,
        0,
        7,
    ]
    assert profile_samples(3 * DAY, 300) == 36  # 12 observations an hour, 3 days
    assert profile_samples(DAY, 7200) == 1  # at least one


def test_an_hour_is_a_plain_mean_then_an_exponential_one() -> None:
    profile = DailyProfile()
    at_nine = 9 * HOUR
    for day, used in enumerate((1.0, 2.0, 3.0)):
        profile = profile.add(day * DAY + at_nine, _cluster({"a1": used}), samples=3)
    assert profile.cpu[0, 9] == pytest.approx(2.0)  # the mean of 1, 2, 3
    assert profile.guest_seen[0, 9] == 3 and profile.guest_seen[0, 10] == 0
    profile = profile.add(3 * DAY + at_nine, _cluster({"a1": 5.0}), samples=3)
    assert profile.cpu[0, 9] == pytest.approx(2.0 + (5.0 - 2.0) / 3)  # weighted 1 / samples
    # Not measured: nothing counted; memory is kept apart.
    unmeasured = profile.add(4 * DAY + at_nine, _cluster({"a1": None}))
    assert unmeasured.cpu[0, 9] == profile.cpu[0, 9] and unmeasured.guest_seen[0, 9] == 4
    assert unmeasured.memory_seen[0, 9] == 5
    assert profile.since == at_nine and not profile.covers_day(at_nine + 22 * HOUR)
    assert profile.covers_day(at_nine + 23 * HOUR)


def test_guests_come_and_go() -> None:
    profile = DailyProfile().add(0, _cluster({"a1": 1.0}), samples=2)
    fewer = _cluster({"b1": 3.0}, {"b1": "n2"})
    later = profile.add(HOUR, fewer)
    assert later.guest_ids == ("b1",) and later.samples == 2
    assert later.guest_seen[0].tolist() == [0, 1] + [0] * 22
    with pytest.raises(ValueError, match="samples must be"):
        profile.add(HOUR, fewer, samples=0)


def test_hours_fill_unseen_hours_from_the_fallback_and_average_the_width() -> None:
    cluster = _cluster(_busy(9))
    profile = DailyProfile().add(9 * HOUR, cluster, samples=1)
    fallback = MeasuredUsage.of(_cluster(dict.fromkeys(("a1", "a2", "b1", "b2"), 2.0)))
    hours = profile.hours(cluster, fallback)
    assert len(hours) == HOURS
    assert hours[9].cpu.tolist() == [4.0, 4.0, 0.5, 0.5]
    assert hours[10].cpu.tolist() == [2.0] * 4
    # Hour 10 with a width of 2: the mean of hours 9 and 10.
    assert profile.hours(cluster, fallback, 2)[10].cpu.tolist() == [3.0, 3.0, 1.25, 1.25]
    with pytest.raises(ValueError, match="width"):
        profile.hours(cluster, fallback, 25)
    with pytest.raises(ValueError, match="another cluster"):
        profile.hours(cluster, MeasuredUsage.of(_cluster({}, {"a1": "n1"})))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0, 100), min_size=HOURS, max_size=HOURS),
    st.integers(1, HOURS),
)
def test_a_trailing_mean_keeps_the_days_mean_and_wraps_round(
    values: list[float], width: int
) -> None:
    row = np.array([values])
    out = trailing_mean(row, width)
    assert out.mean() == pytest.approx(row.mean(), abs=1e-9)
    assert out[0, 0] == pytest.approx(np.mean([values[-k] for k in range(width)]), abs=1e-9)
    if width == HOURS:
        assert np.allclose(out, row.mean())


def _decide_at(hour: int, daily: tuple[MeasuredUsage, ...] | None) -> object:
    cluster = _cluster(_busy(hour))
    config = replace(EAGER, daily_profile=3 * DAY, target=0.12)
    return decide(
        cluster,
        float(hour * HOUR),
        config,
        PolicyState(),
        PastMigrations(),
        busy=False,
        daily=daily,
    )


def test_guests_whose_peaks_do_not_coincide_are_paired() -> None:
    cluster = _cluster(_busy(9))
    daily = _day_profile().hours(cluster, MeasuredUsage.of(cluster))
    # On the usage of 9:00 alone one migration balances n1's busy guests against n2's idle ones
    # to the target (4 + 0.5 cores against 4 + 0.5 + 0.5), and leaves n2 with three guests, two
    # of them busy together at 21:00.
    now_only = _decide_at(9, None)
    assert now_only.act and now_only.plan is not None  # type: ignore[attr-defined]
    assert len(now_only.plan.moves) == 1  # type: ignore[attr-defined]
    # On the whole day: one guest of each kind on each node, balanced at every hour.
    whole_day = _decide_at(9, daily)
    assert whole_day.act and whole_day.plan is not None  # type: ignore[attr-defined]
    placed = {g.id: g.node for g in cluster.guests} | final_placement(whole_day.plan.moves)  # type: ignore[attr-defined]
    assert sorted(placed[g] for g in ("a1", "a2")) == ["n1", "n2"]
    assert sorted(placed[g] for g in ("b1", "b2")) == ["n1", "n2"]
    assert whole_day.predicted == pytest.approx(0.0)  # type: ignore[attr-defined]
    assert "of the daily profile" in explain(whole_day)  # type: ignore[attr-defined]
    # Where the day search stopped: a code, said in words at the edge (the daemon's log).
    assert whole_day.stop == Stop("day_balanced", {"metric": "spread"})  # type: ignore[attr-defined]
    assert decision_words(whole_day).endswith(  # type: ignore[arg-type]
        "with 2 migrations (every hour of the day has its spread at or below the target)"
    )


def test_a_paired_placement_is_left_alone() -> None:
    paired = {"a1": "n1", "b1": "n1", "a2": "n2", "b2": "n2"}
    cluster = _cluster(_busy(9), paired)
    daily = _day_profile(paired).hours(cluster, MeasuredUsage.of(cluster))
    decision = decide(
        cluster,
        9.0 * HOUR,
        replace(EAGER, daily_profile=3 * DAY),
        PolicyState(),
        PastMigrations(),
        busy=False,
        daily=daily,
    )
    assert not decision.act and decision.code == "balanced"


@st.composite
def _days(draw: st.DrawFn) -> tuple[Cluster, tuple[MeasuredUsage, ...], int]:
    cluster = draw(clusters(max_nodes=5, max_guests=14))
    cluster = replace(cluster, settings=replace(cluster.settings, mode="dynamic"))
    shapes = draw(
        st.lists(
            st.lists(st.floats(0.05, 1.0), min_size=4, max_size=4),
            min_size=len(cluster.guests),
            max_size=len(cluster.guests),
        )
    )
    hours = []
    for hour in range(HOURS):
        guests = tuple(
            replace(g, cpu_used=g.cpu * shape[hour // 6], memory_used=g.memory // 2)
            for g, shape in zip(cluster.guests, shapes, strict=True)
        )
        hours.append(MeasuredUsage.of(replace(cluster, guests=guests)))
    return cluster, tuple(hours), draw(st.integers(1, 6))


@settings(max_examples=60, deadline=None)
@given(_days())
def test_the_day_search_is_safe_and_never_worse(
    case: tuple[Cluster, tuple[MeasuredUsage, ...], int],
) -> None:
    cluster, hours, most = case
    loads = LoadModel.build(cluster)
    cons = Constraints.build(cluster)
    proposal = day_proposal(cluster, loads, cons, hours, metric="spread", target=0.0, most=most)
    moved = [m.guest for m in proposal.moves]
    assert len(moved) == len(set(moved)) <= most
    assert_moves_safe(cluster, proposal.moves)
    before = day_metric(cluster, "spread", loads, hours)
    for move in proposal.moves:
        assert move.before == pytest.approx(before)
        before = move.after
    again = day_proposal(cluster, loads, cons, hours, metric="spread", target=0.0, most=most)
    assert again == proposal


def test_the_day_search_keeps_off_forbidden_placements() -> None:
    cluster = _cluster(_busy(9))
    daily = _day_profile().hours(cluster, MeasuredUsage.of(cluster))
    cons = Constraints.build(cluster, forbidden={("b1", "n1"), ("b2", "n1")})
    proposal = day_proposal(
        cluster, LoadModel.build(cluster), cons, daily, metric="spread", target=0.08, most=None
    )
    assert proposal.moves and all(m.guest.startswith("a") for m in proposal.moves)


def test_the_option_reads_whole_days() -> None:
    reader = Reader("policy.yaml")
    assert parse_policy(reader, {"daily_profile": "3d"}, ("policy",)).daily_profile == 3 * DAY
    assert PolicyConfig().daily_profile == 0
    with pytest.raises(DocumentError, match="daily_profile: expected whole days"):
        parse_policy(reader, {"daily_profile": "12h"}, ("policy",))
    with pytest.raises(DocumentError, match="daily_profile"):
        parse_policy(reader, {"daily_profile": "31d"}, ("policy",))
    window = parse_policy(reader, {"daily_profile_window": "1h"}, ("policy",))
    assert window.daily_profile_window == HOUR and PolicyConfig().daily_profile_window == 6 * HOUR
    with pytest.raises(DocumentError, match="daily_profile_window: expected whole hours"):
        parse_policy(reader, {"daily_profile_window": "90m"}, ("policy",))
    with pytest.raises(DocumentError, match="daily_profile_window"):
        parse_policy(reader, {"daily_profile_window": "2d"}, ("policy",))


def test_the_option_is_refused_in_one_line_naming_the_key() -> None:
    reader = Reader("policy.yaml")
    cases = [
        ({"daily_profile": "36h"}, "policy.daily_profile: expected whole days such as 3d"),
        ({"daily_profile_window": "90m"}, "policy.daily_profile_window: expected whole hours"),
        ({"daily_profile": "3d", "metric": "none"}, "daily_profile and metric none do not go"),
    ]
    for written, message in cases:
        with pytest.raises(DocumentError) as refused:
            parse_policy(reader, written, ("policy",))
        assert message in str(refused.value) and "\n" not in str(refused.value)
        assert "policy: policy" not in str(refused.value)
    with pytest.raises(ValueError, match="daily_profile: needs a metric"):
        PolicyConfig(daily_profile=3 * DAY, metric="none")
