"""Migration windows and blackouts (``policy.windows``, ``policy.blackouts``): the parser, the
schedule at times inside, outside, at the edges, across midnight and across a change of the
clocks, and :func:`decide` with its time passed in."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.policy import (
    DecisionCode,
    PastMigrations,
    PolicyConfig,
    PolicyState,
    decide,
    parse_policy,
)
from opendrs.engine.policy.windows import (
    Schedule,
    parse_blackout,
    parse_days,
    parse_weekly,
    schedule_now,
)
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.document import DocumentError, Reader
from opendrs.report.reasons import explain

GiB = 1024**3
BERLIN = ZoneInfo("Europe/Berlin")
#: Weeknights in Berlin.
NIGHTS = Schedule((parse_weekly("Mon-Fri 22:00-06:00"),), timezone="Europe/Berlin")


def at(text: str, zone: ZoneInfo = BERLIN) -> float:
    """A local time ``2026-11-30 22:00`` (a Monday) as a timestamp."""
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


# -- the parser ---------------------------------------------------------------------------------


def test_days_are_single_ranges_lists_and_daily() -> None:
    assert parse_days("Mon") == {0}
    assert parse_days("mon-fri") == {0, 1, 2, 3, 4}
    assert parse_days("Fri-Mon") == {4, 5, 6, 0}
    assert parse_days("Sat,Sun") == {5, 6}
    assert parse_days("daily") == set(range(7))
    assert parse_days("Mo-Fr") is None and parse_days("Mon-Tue-Wed") is None


def test_a_window_is_days_and_a_span_that_may_cross_midnight() -> None:
    window = parse_weekly("Mon-Fri  22:00-06:00")
    assert (window.text, window.start, window.end) == ("Mon-Fri 22:00-06:00", 22 * 60, 6 * 60)
    assert parse_weekly("Sat,Sun 00:00-24:00").end == 24 * 60


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Mon-Fri 22-06", "expected 'DAYS HH:MM-HH:MM'"),
        ("22:00-06:00", "expected 'DAYS HH:MM-HH:MM'"),
        ("Someday 22:00-06:00", "expected 'DAYS HH:MM-HH:MM'"),
        ("Mon 25:00-06:00", "expected times from 00:00 to 24:00"),
        ("Mon 22:60-06:00", "expected times from 00:00 to 24:00"),
        ("Mon 24:00-06:00", "expected times from 00:00 to 24:00"),
        ("Mon 22:00-22:00", "the start and the end are the same time"),
    ],
)
def test_a_bad_window_is_refused_with_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_weekly(text)


def test_a_blackout_is_weekly_or_dated() -> None:
    assert parse_blackout("Sun 01:00-04:00").text == "Sun 01:00-04:00"
    dated = parse_blackout("2026-12-24 00:00-2026-12-26 23:59")
    assert (dated.start, dated.end) == (datetime(2026, 12, 24), datetime(2026, 12, 26, 23, 59))
    assert parse_blackout("2026-12-24 08:00-12:00").end == datetime(2026, 12, 24, 12)
    with pytest.raises(ValueError, match="ends before it starts"):
        parse_blackout("2026-12-24 08:00-2026-12-23 12:00")
    with pytest.raises(ValueError, match="not a date and time"):
        parse_blackout("2026-02-30 08:00-12:00")
    with pytest.raises(ValueError, match="YYYY-MM-DD HH:MM"):
        parse_blackout("Christmas")


def _policy(section: dict[str, object]) -> PolicyConfig:
    return parse_policy(Reader("opendrs.yaml"), section, ("policy",))


def test_the_policy_section_reads_windows_with_one_line_per_problem() -> None:
    config = _policy(
        {
            "windows": ["Mon-Fri 22:00-06:00"],
            "blackouts": ["Sun 01:00-04:00"],
            "timezone": "Europe/Berlin",
            "windows_apply_to": ["balance", "maintenance"],
        }
    )
    schedule = config.schedule
    assert schedule.timezone == "Europe/Berlin"
    assert schedule.windows_apply_to == {"balance", "maintenance"}
    assert schedule.blackouts_apply_to == {"balance", "maintenance", "return"}
    refusals = {
        "opendrs.yaml: policy.windows[0]: 'Mon-Fri 22-06': expected 'DAYS HH:MM-HH:MM'": {
            "windows": ["Mon-Fri 22-06"],
            "timezone": "UTC",
        },
        "opendrs.yaml: policy.windows: needs timezone": {"windows": ["Mon 22:00-23:00"]},
        "opendrs.yaml: policy.timezone: unknown time zone 'Mars/Base'": {
            "windows": ["Mon 22:00-23:00"],
            "timezone": "Mars/Base",
        },
        "opendrs.yaml: policy.windows_apply_to[0]: ": {
            "windows": ["Mon 22:00-23:00"],
            "timezone": "UTC",
            "windows_apply_to": ["balancing"],
        },
        "opendrs.yaml: policy.windows: expected a list": {"windows": "Mon 22:00-23:00"},
    }
    for start, section in refusals.items():
        with pytest.raises(DocumentError) as caught:
            _policy(section)
        assert str(caught.value).startswith(start)
        assert "\n" not in str(caught.value)


# -- the schedule at a time ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local", "open_"),
    [
        ("2026-11-30 21:59", False),  # Monday, a minute before
        ("2026-11-30 22:00", True),  # the start is inside
        ("2026-12-01 03:00", True),  # after midnight: Monday's window still
        ("2026-12-01 05:59", True),
        ("2026-12-01 06:00", False),  # the end is outside
        ("2026-12-05 03:00", True),  # Saturday morning: Friday's window
        ("2026-12-06 03:00", False),  # Sunday morning: Saturday has none
        ("2026-11-30 03:00", False),  # Monday morning: Sunday has none
    ],
)
def test_inside_outside_at_the_edges_and_across_midnight(local: str, open_: bool) -> None:
    assert NIGHTS.open(at(local), "balance") is open_
    assert NIGHTS.open(at(local), "maintenance")  # windows apply to balancing only


def test_the_next_opening_is_the_next_start_and_a_blackout_pushes_it() -> None:
    sunday = at("2026-11-29 12:00")
    assert NIGHTS.next_open(sunday, "balance") == at("2026-11-30 22:00")
    # Monday night blacked out until 23:30: it opens when the blackout ends.
    blacked = replace(NIGHTS, blackouts=(parse_blackout("Mon 21:00-23:30"),))
    assert blacked.next_open(sunday, "balance") == at("2026-11-30 23:30")
    # Christmas: the first weeknight after it.
    xmas = replace(NIGHTS, blackouts=(parse_blackout("2026-12-24 00:00-2026-12-29 00:00"),))
    assert xmas.next_open(at("2026-12-23 23:00"), "balance") == at("2026-12-29 00:00")


def test_blackouts_keep_repairs_of_hard_rules_going_unless_told() -> None:
    backup = Schedule(blackouts=(parse_blackout("Sun 01:00-04:00"),), timezone="UTC")
    night = at("2026-11-29 02:00", ZoneInfo("UTC"))
    assert not backup.open(night, "balance") and not backup.open(night, "maintenance")
    assert backup.open(night, "repair")
    strict = replace(backup, blackouts_apply_to=frozenset({"balance", "repair"}))
    assert not strict.open(night, "repair") and strict.open(night, "maintenance")


def test_across_the_change_of_the_clocks() -> None:
    # 2026-03-29: Berlin goes from 02:00 CET to 03:00 CEST; 2026-10-25 back from 03:00 to 02:00.
    early = Schedule((parse_weekly("Sun 02:00-04:00"),), timezone="Europe/Berlin")
    utc = ZoneInfo("UTC")
    # Spring: 02:00-03:00 local does not exist; the window is open 03:00-04:00 CEST only.
    assert not early.open(at("2026-03-29 00:59", utc), "balance")  # 01:59 CET
    assert early.open(at("2026-03-29 01:00", utc), "balance")  # 03:00 CEST
    assert not early.open(at("2026-03-29 02:00", utc), "balance")  # 04:00 CEST
    # Autumn: 02:00-03:00 comes twice, and the window is open both times — three hours.
    inside = [
        h for h in range(24 * 4) if early.open(at("2026-10-24 22:00", utc) + h * 900, "balance")
    ]
    assert len(inside) == 3 * 4
    # A window of local times keeps them: Monday 22:00 is 21:00 UTC in winter, 20:00 in summer.
    assert NIGHTS.open(at("2026-03-30 20:00", utc), "balance")
    assert not NIGHTS.open(at("2026-01-05 20:00", utc), "balance")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=3 * 365 * 86400),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
)
def test_open_matches_local_clock_reading(offset: int, name: str) -> None:
    """Against a plain reading of the local clock: open when the local weekday and time are in
    a weeknight, or early on the morning after one."""
    now = at("2026-01-01 00:00", ZoneInfo("UTC")) + offset
    schedule = replace(NIGHTS, timezone=name)
    local = datetime.fromtimestamp(now, ZoneInfo(name))
    minute = local.hour * 60 + local.minute
    expected = (local.weekday() < 5 and minute >= 22 * 60) or (
        (local.weekday() - 1) % 7 < 5 and minute < 6 * 60
    )
    assert schedule.open(now, "balance") is expected
    opens = schedule.next_open(now, "balance")
    assert opens is not None and opens > now and schedule.open(opens, "balance")
    assert opens - now <= 3 * 86400
    if not expected:  # nothing open between now and the opening (checked every 15 minutes)
        probes = range(int(now) + 900 - int(now) % 900, int(opens), 900)
        assert not any(schedule.open(t, "balance") for t in probes)


# -- decide with its time passed in -------------------------------------------------------------


def _skewed() -> Cluster:
    nodes = tuple(Node(f"n{i}", 10, 100 * GiB) for i in (1, 2, 3))
    guests = tuple(
        Guest(g, "n1", cpu=2, memory=20 * GiB, uptime=86400) for g in ("a", "b", "c", "d")
    )
    return Cluster(nodes, guests, settings=Settings(mode="static"))


EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _decide(cluster: Cluster, config: PolicyConfig, now: float, state: PolicyState | None = None):
    return decide(cluster, now, config, state or PolicyState(), PastMigrations(), busy=False)


def test_decide_outside_the_window_has_its_code_and_a_plain_reason() -> None:
    config = replace(EAGER, schedule=NIGHTS)
    sunday = at("2026-11-29 12:00")
    closed = _decide(_skewed(), config, sunday)
    assert closed.code is DecisionCode.OUTSIDE_WINDOW and not closed.act and closed.plan is None
    assert explain(closed).endswith(
        "outside the migration window Mon-Fri 22:00-06:00 Europe/Berlin, no balancing migration "
        "starts; next opens Mon 22:00"
    )
    assert explain(closed).startswith("spread 80.0 pp above threshold 15 pp")
    # The hold counts on outside the window: the window opens on an imbalance that lasted.
    held = replace(config, hold=3)
    state = PolicyState()
    for _ in range(4):
        state = _decide(_skewed(), held, sunday, state).state
    assert state.hold == 3
    opened = _decide(_skewed(), held, at("2026-11-30 22:00"), state)
    assert opened.code is DecisionCode.PLAN and opened.activity == "balance"
    # Without windows nothing changes; the same time is a plan.
    assert _decide(_skewed(), EAGER, sunday).code is DecisionCode.PLAN


def test_a_blackout_stops_maintenance_but_not_a_repair_of_a_hard_rule() -> None:
    backup = Schedule(blackouts=(parse_blackout("Sun 01:00-04:00"),), timezone="Europe/Berlin")
    config = replace(EAGER, schedule=backup)
    night = at("2026-11-29 02:00")
    nodes = (Node("n1", 10, 100 * GiB, maintenance=True), Node("n2", 10, 100 * GiB))
    guest = Guest("a", "n1", cpu=2, memory=20 * GiB, uptime=86400)
    evacuation = Cluster(nodes, (guest,), settings=Settings(mode="static"))
    blacked = _decide(evacuation, config, night)
    assert blacked.code is DecisionCode.BLACKOUT and not blacked.act
    assert "maintenance evacuation needed (a is on n1, in maintenance)" in explain(blacked)
    assert "in the blackout Sun 01:00-04:00 Europe/Berlin" in explain(blacked)
    assert explain(blacked).endswith("next opens Sun 04:00")
    after = _decide(evacuation, config, at("2026-11-29 04:00"))
    assert after.code is DecisionCode.REPAIR and after.activity == "maintenance"
    # Over capacity: a repair, which blackouts leave alone unless they are told.
    full = (Node("n1", 10, 50 * GiB), Node("n2", 10, 100 * GiB))
    over = Cluster(
        full,
        (guest, replace(guest, id="b"), replace(guest, id="c")),
        settings=Settings(mode="static"),
    )
    repaired = _decide(over, config, night)
    assert repaired.code is DecisionCode.REPAIR and repaired.activity == "repair"
    strict = replace(config, schedule=replace(backup, blackouts_apply_to=frozenset({"repair"})))
    assert _decide(over, strict, night).code is DecisionCode.BLACKOUT


def test_decide_is_pure_in_its_time() -> None:
    config = replace(EAGER, schedule=NIGHTS)
    times = [at("2026-11-29 12:00") + k * 3600 * 7 for k in range(30)]
    first = [_decide(_skewed(), config, t).as_dict() for t in times]
    assert first == [_decide(_skewed(), config, t).as_dict() for t in times]
    codes = {d["code"] for d in first}
    assert codes == {"plan", "outside-window"}


def test_status_says_what_is_open_now_and_when_the_next_opens() -> None:
    now = schedule_now(NIGHTS, at("2026-11-29 12:00"))
    assert now is not None and list(now["now"]) == ["balance"]  # type: ignore[call-overload]
    balance = now["now"]["balance"]  # type: ignore[index]
    assert balance["open"] is False and balance["opens_text"] == "Mon 22:00"
    assert schedule_now(Schedule(), 0.0) is None


def test_a_late_opening_is_given_with_its_date() -> None:
    far = replace(NIGHTS, blackouts=(parse_blackout("2026-12-01 00:00-2026-12-20 00:00"),))
    decision = _decide(_skewed(), replace(EAGER, schedule=far), at("2026-12-02 12:00"))
    assert explain(decision).endswith("next opens 2026-12-21 22:00")
    assert far.next_open(at("2026-12-02 12:00"), "balance") == at("2026-12-21 22:00")
    assert timedelta(seconds=far.next_open(at("2026-12-02 12:00"), "balance") or 0) > timedelta(0)


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.integers(0, 6), min_size=1),
    st.integers(0, 24 * 60 - 1),
    st.integers(1, 24 * 60),
    st.integers(0, 7 * 24 * 60 - 1),
)
def test_any_window_written_reads_back_and_covers_what_it_says(
    days: set[int], start: int, end: int, minute_of_week: int
) -> None:
    """A window written from days and two times parses to them, and covers a local time when
    that time is after the start on one of its days, or (crossing midnight) before the end on
    the day after one."""
    if start == end:
        end = (end % (24 * 60)) + 1
    names = ",".join(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[d] for d in sorted(days))
    text = f"{names} {start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"
    window = parse_weekly(text)
    assert (window.days, window.start, window.end) == (days, start, end)
    # 2026-11-30 is a Monday.
    local = datetime(2026, 11, 30) + timedelta(minutes=minute_of_week)
    day, minute = local.weekday(), local.hour * 60 + local.minute
    if start < end:
        expected = day in days and start <= minute < end
    else:
        expected = (day in days and minute >= start) or ((day - 1) % 7 in days and minute < end)
    assert window.covers(local) is expected
