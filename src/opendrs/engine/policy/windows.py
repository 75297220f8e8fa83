"""Migration windows and blackouts (``policy.windows``, ``policy.blackouts``): when migrations
may start, in an explicit time zone — pure functions of the time they are given, no wall clock.

A *window* is ``DAYS HH:MM-HH:MM``: days ``Mon``, ``Mon-Fri``, ``Sat,Sun`` or ``daily``, and a
span of local time; an end at or before the start crosses midnight and belongs to the day it
starts (``Fri 22:00-06:00`` runs Friday night into Saturday morning). A *blackout* is a window's
syntax too (``Sun 01:00-04:00``), or dated: ``2026-12-24 00:00-2026-12-27 00:00`` (the end may
leave the date out when it is the same day). Ends are exclusive. Local times are read with
:mod:`zoneinfo`: on the night the clocks go forward a span of skipped local time is not there,
and on the night they go back the repeated hour is inside a span both times.

Which activities each applies to (:data:`ACTIVITIES`): windows to ``balance`` by default,
blackouts to all but ``repair`` (hard rules and capacity) — a backup's blackout keeps balancing,
maintenance evacuations and returns from maintenance off, but not the repair of a broken hard
rule or an overloaded node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

#: What a plan that acts does, as a window's ``*_apply_to`` names it: ``balance`` (a balancing
#: plan, or the relief of nodes that only run hot), ``maintenance`` (an evacuation of a node in
#: maintenance), ``return`` (guests back from maintenance), ``repair`` (a hard rule or a
#: capacity limit broken).
ACTIVITIES: tuple[str, ...] = ("balance", "maintenance", "return", "repair")

#: The activities windows apply to unless ``windows_apply_to`` says otherwise.
WINDOWS_APPLY_TO: frozenset[str] = frozenset({"balance"})
#: The activities blackouts apply to unless ``blackouts_apply_to`` says otherwise.
BLACKOUTS_APPLY_TO: frozenset[str] = frozenset({"balance", "maintenance", "return"})

DAY_NAMES: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

WEEKLY_SYNTAX = "expected 'DAYS HH:MM-HH:MM' (DAYS: Mon, Mon-Fri, Sat,Sun or daily)"
BLACKOUT_SYNTAX = f"{WEEKLY_SYNTAX[:-1]}, or 'YYYY-MM-DD HH:MM-YYYY-MM-DD HH:MM')"

_WEEKLY = re.compile(r"^\s*(\S+)\s+(\d{2}):(\d{2})\s*-\s*(\d{2}):(\d{2})\s*$")
_DATED = re.compile(
    r"^\s*(\d{4}-\d{2}-\d{2})\s+(\d{2}:\d{2})\s*-\s*(?:(\d{4}-\d{2}-\d{2})\s+)?(\d{2}:\d{2})\s*$"
)
#: How far ahead the next opening is looked for.
_HORIZON = timedelta(days=400)


@dataclass(frozen=True, slots=True)
class Weekly:
    """A span of local time on some days of the week: ``start`` and ``end`` in minutes after
    midnight (``end`` ≤ ``start``: it ends the next day), ``days`` 0 (Monday) to 6."""

    text: str
    days: frozenset[int]
    start: int
    end: int

    def covers(self, local: datetime) -> bool:
        minute = local.hour * 60 + local.minute
        day = local.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= minute < self.end
        return (day in self.days and minute >= self.start) or (
            (day - 1) % 7 in self.days and minute < self.end
        )

    def edges(self, day: date) -> tuple[datetime, ...]:
        """Where it starts and ends on ``day`` (naive local times)."""
        if day.weekday() not in self.days:
            return ()
        start = datetime.combine(day, time()) + timedelta(minutes=self.start)
        end = datetime.combine(day, time()) + timedelta(minutes=self.end)
        return (start, end if self.start < self.end else end + timedelta(days=1))


@dataclass(frozen=True, slots=True)
class Dated:
    """A span between two local date-times (naive, in the schedule's time zone)."""

    text: str
    start: datetime
    end: datetime

    def covers(self, local: datetime) -> bool:
        return self.start <= local.replace(tzinfo=None, second=0, microsecond=0) < self.end

    def edges(self, day: date) -> tuple[datetime, ...]:
        return tuple(t for t in (self.start, self.end) if t.date() == day)


Span = Weekly | Dated


@dataclass(frozen=True, slots=True)
class Schedule:
    """When migrations may start: ``windows`` (none: at any time) and ``blackouts``, read in
    ``timezone``, each applying to its activities (:data:`ACTIVITIES`)."""

    windows: tuple[Weekly, ...] = ()
    blackouts: tuple[Span, ...] = ()
    timezone: str = "UTC"
    windows_apply_to: frozenset[str] = WINDOWS_APPLY_TO
    blackouts_apply_to: frozenset[str] = BLACKOUTS_APPLY_TO

    def __post_init__(self) -> None:
        zone(self.timezone)
        for field_name in ("windows_apply_to", "blackouts_apply_to"):
            unknown = sorted(set(getattr(self, field_name)) - set(ACTIVITIES))
            if unknown:
                raise ValueError(
                    f"policy {field_name}: unknown {unknown[0]!r} (known: {', '.join(ACTIVITIES)})"
                )

    @property
    def empty(self) -> bool:
        return not (self.windows or self.blackouts)

    def local(self, now: float) -> datetime:
        return datetime.fromtimestamp(now, zone(self.timezone))

    def blackout_at(self, now: float, activity: str) -> Span | None:
        """The blackout ``activity`` is in at ``now``, or None."""
        if activity not in self.blackouts_apply_to:
            return None
        local = self.local(now)
        return next((b for b in self.blackouts if b.covers(local)), None)

    def outside_windows(self, now: float, activity: str) -> bool:
        """Whether windows apply to ``activity`` and ``now`` is in none of them."""
        if not self.windows or activity not in self.windows_apply_to:
            return False
        local = self.local(now)
        return not any(w.covers(local) for w in self.windows)

    def open(self, now: float, activity: str) -> bool:
        """Whether ``activity`` may start migrations at ``now``."""
        return not self.outside_windows(now, activity) and self.blackout_at(now, activity) is None

    def closed_reason(self, now: float, activity: str) -> str | None:
        """Why ``activity`` may start no migration at ``now``, in words, or None."""
        blackout = self.blackout_at(now, activity)
        if blackout is not None:
            return f"in the blackout {blackout.text} {self.timezone}"
        if self.outside_windows(now, activity):
            windows = ", ".join(w.text for w in self.windows)
            return f"outside the migration window {windows} {self.timezone}"
        return None

    def next_open(self, now: float, activity: str) -> float | None:
        """The first time after ``now`` at which ``activity`` may start migrations again (a
        window opens or a blackout ends), or None within :data:`_HORIZON`."""
        tz = zone(self.timezone)
        first = self.local(now).date() - timedelta(days=1)
        spans: tuple[Span, ...] = (*self.windows, *self.blackouts)
        for offset in range(_HORIZON.days):
            day = first + timedelta(days=offset)
            edges = sorted({e for s in spans for e in s.edges(day)})
            for edge in edges:
                at = edge.replace(tzinfo=tz).timestamp()
                if at > now and self.open(at, activity):
                    return at
        return None

    def summary(self) -> str:
        """In an operator's words: which activities start migrations only within which windows,
        and which none start in which blackouts (``at any time`` when there are none)."""
        parts = []
        if self.windows:
            parts.append(
                f"{_listed(self.windows_apply_to)} may start migrations only within "
                f"{', '.join(w.text for w in self.windows)}"
            )
        if self.blackouts:
            parts.append(
                f"{_listed(self.blackouts_apply_to)} start none in "
                f"{', '.join(b.text for b in self.blackouts)}"
            )
        if not parts:
            return "migrations start at any time"
        return f"{'; '.join(parts)} ({self.timezone})"


def schedule_now(schedule: Schedule | None, now: float) -> dict[str, object] | None:
    """Whether each activity a window or blackout applies to may start migrations at ``now``:
    ``open``, ``closed`` (why, None when open) and ``opens`` (when it next may, None when open
    or not within a year); None without windows and blackouts (``opendrs status``)."""
    if schedule is None or schedule.empty:
        return None
    applies = (schedule.windows_apply_to if schedule.windows else frozenset()) | (
        schedule.blackouts_apply_to if schedule.blackouts else frozenset()
    )
    activities: dict[str, object] = {}
    for activity in (a for a in ACTIVITIES if a in applies):
        closed = schedule.closed_reason(now, activity)
        opens = None if closed is None else schedule.next_open(now, activity)
        activities[activity] = {
            "open": closed is None,
            "closed": closed,
            "opens": opens,
            "opens_text": None if opens is None else format_opening(opens, now, schedule.timezone),
        }
    return {"summary": schedule.summary(), "timezone": schedule.timezone, "now": activities}


def _listed(activities: frozenset[str]) -> str:
    """``balance, maintenance``, in :data:`ACTIVITIES` order."""
    return ", ".join(a for a in ACTIVITIES if a in activities) or "nothing"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (ValueError, one line, when there is none)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"policy timezone: unknown time zone {name!r} (expected an IANA name such as "
            "Europe/Berlin or UTC)"
        ) from None


def parse_days(text: str) -> frozenset[int] | None:
    """``Mon``, ``Mon-Fri``, ``Fri-Mon`` (wrapping), ``Sat,Sun``, ``daily``: weekday numbers, or
    None when it is not that."""
    if text.lower() in ("daily", "*"):
        return frozenset(range(7))
    names = [n.capitalize() for n in DAY_NAMES]
    days: set[int] = set()
    for part in text.split(","):
        ends = part.split("-")
        if len(ends) > 2 or any(e.capitalize() not in names for e in ends):
            return None
        first, last = (names.index(e.capitalize()) for e in (ends[0], ends[-1]))
        days.update((first + i) % 7 for i in range((last - first) % 7 + 1))
    return frozenset(days)


def _minutes(hours: str, minutes: str) -> int | None:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and m):
        return None
    return h * 60 + m


def parse_weekly(text: str) -> Weekly:
    """A window ``DAYS HH:MM-HH:MM`` (ValueError with :data:`WEEKLY_SYNTAX` or the reason)."""
    found = _WEEKLY.match(text) if isinstance(text, str) else None
    days = parse_days(found.group(1)) if found else None
    if found is None or days is None:
        raise ValueError(WEEKLY_SYNTAX)
    start, end = _minutes(*found.group(2, 3)), _minutes(*found.group(4, 5))
    if start is None or end is None or start == 24 * 60:
        raise ValueError("expected times from 00:00 to 24:00 (an end of 24:00: midnight)")
    if start == end:
        raise ValueError("the start and the end are the same time: write 00:00-24:00 for a day")
    return Weekly(" ".join(text.split()), days, start, end)


def parse_blackout(text: str) -> Span:
    """A blackout: a window's syntax, or ``YYYY-MM-DD HH:MM-[YYYY-MM-DD ]HH:MM``."""
    found = _DATED.match(text) if isinstance(text, str) else None
    if found is None:
        try:
            return parse_weekly(text)
        except ValueError as exc:
            raise ValueError(BLACKOUT_SYNTAX if str(exc) == WEEKLY_SYNTAX else str(exc)) from None
    start_day, start_time, end_day, end_time = found.groups()
    try:
        start = datetime.fromisoformat(f"{start_day}T{start_time}")
        end = datetime.fromisoformat(f"{end_day or start_day}T{end_time}")
    except ValueError:
        raise ValueError(f"not a date and time: {BLACKOUT_SYNTAX}") from None
    if end <= start:
        raise ValueError("it ends before it starts")
    return Dated(" ".join(text.split()), start, end)


def format_opening(at: float, now: float, timezone: str) -> str:
    """When ``at`` is, for the operator: ``Mon 22:00`` within a week of ``now``, else its date
    (``2026-12-27 00:00``), in ``timezone``."""
    local = datetime.fromtimestamp(at, zone(timezone))
    if at - now < 6 * 86400:
        return f"{DAY_NAMES[local.weekday()]} {local:%H:%M}"
    return f"{local:%Y-%m-%d %H:%M}"
