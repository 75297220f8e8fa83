"""Reading a policy section of a configuration file into a :class:`PolicyConfig` (one-line
errors naming the key), and a strategy's options checked when they are read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from opendrs.engine.policy.config import (
    FAILOVER_RECOVERIES,
    FLAGS,
    LIMITS,
    MAX_COUNT,
    METRICS,
    PRESETS,
    PolicyConfig,
    budget_problem,
    budget_window_problem,
    parse_budget,
    strategy_request,
)
from opendrs.engine.policy.state import PastMigrations
from opendrs.engine.strategies import REGISTRY
from opendrs.engine.strategies.base import Request, StrategyOptions, option_value
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.document import Path, Reader, describe
from opendrs.model.units import UnitError, format_duration, parse_fraction

if TYPE_CHECKING:
    from opendrs.engine.policy.windows import Schedule

#: The keys of a policy section.
POLICY_KEYS: tuple[str, ...] = (
    "preset",
    "name",
    "interval",
    "metric",
    "threshold",
    "target",
    "hold",
    "margin",
    "cooldown",
    "no_return",
    "batch",
    "min_uptime",
    "smoothing",
    "avoid_after_failure",
    "strategy",
    "options",
    "max_parallel",
    "max_node_inflow",
    "maintenance_return",
    "wait_for_motions",
    "hot",
    "max_migrations_per_day",
    "migration_budget_window",
    "spend_budget",
    "daily_profile",
    "daily_profile_window",
    "windows",
    "blackouts",
    "timezone",
    "windows_apply_to",
    "blackouts_apply_to",
    "keep_failover",
    "failover_recovery",
)


#: Each duration's range in seconds, (shortest, longest): configuration that validates runs.
_DURATIONS: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "interval": (0, 7 * 86400),  # 0 is refused with its own message
        "cooldown": (0, 365 * 86400),
        "no_return": (0, 365 * 86400),
        "min_uptime": (0, 365 * 86400),
        "smoothing": (0, 30 * 86400),
        "avoid_after_failure": (0, 365 * 86400),
        "daily_profile": (0, 30 * 86400),
        "daily_profile_window": (3600, 86400),
    }
)


#: Each fraction's largest value: a threshold (a bare number at most 1, a percentage up to
#: 10000 %: a CV may be above 100 %), the target spread (at most 100 points) and the relative
#: improvement a plan must bring (at most all).
_FRACTIONS: Mapping[str, float] = MappingProxyType(
    {"threshold": 100.0, "target": 1.0, "margin": 1.0}
)

#: The metrics that never exceed 1 (100 %): a threshold above it would never be reached.
_BOUNDED_METRICS = ("spread", "memory-spread", "pve-imbalance")


#: The most nodes ``keep_failover`` keeps the headroom for.
_MAX_FAILOVER = 8


#: The longest hold, in observations.
_MAX_HOLD = 10_000


#: Most observations the smoothing window keeps (``smoothing / interval``): the window is
#: memory, and it is copied at every observation.
_MAX_SAMPLES = 10_000


def _fraction(reader: Reader, value: object, path: Path, maximum: float) -> float:
    """A fraction from 0 to 1 (``0.15``), or a percentage up to ``maximum`` (``15%``: 0.15); a
    bare number above 1 is refused with the percentage it probably meant
    (:func:`parse_fraction`)."""
    try:
        return parse_fraction(value, maximum)
    except UnitError as exc:
        reader.fail(path, str(exc))


def _option_value(
    reader: Reader, options: type[StrategyOptions], name: str, value: object, path: Path
) -> object:
    """A strategy option read as ``opendrs plan -O`` reads it (:func:`option_value`): a share as
    a fraction or a percentage, then the type of its default."""
    try:
        value = option_value(options, name, value, describe(value))
    except ValueError as exc:
        reader.fail(path, str(exc))
    return tuple(value) if isinstance(value, list) else value


def _check_spending(
    reader: Reader,
    mapping: Mapping[str, object],
    path: Path,
    fields: Mapping[str, Any],
    start: PolicyConfig,
) -> None:
    """``spend_budget`` needs a budget to spend: refused, naming the key written, without one."""
    spend = fields.get("spend_budget", start.spend_budget)
    if spend and fields.get("max_migrations_per_day", start.max_migrations_per_day) is None:
        if "spend_budget" in mapping:
            reader.fail(
                (*path, "spend_budget"), "needs max_migrations_per_day, the budget it spends"
            )
        reader.fail((*path, "max_migrations_per_day"), "spend_budget is on: it needs a budget")


def _check_daily_profile(
    reader: Reader,
    mapping: Mapping[str, object],
    path: Path,
    fields: Mapping[str, Any],
    start: PolicyConfig,
) -> None:
    """``daily_profile`` in whole days, its window in whole hours, and not with ``metric: none``:
    refused naming the key written, with what was written."""
    days = fields.get("daily_profile", start.daily_profile)
    if "daily_profile" in mapping and days % 86400:
        got = describe(mapping["daily_profile"])
        reader.fail((*path, "daily_profile"), f"expected whole days such as 3d (0: off), got {got}")
    window = fields.get("daily_profile_window", start.daily_profile_window)
    if "daily_profile_window" in mapping and window % 3600:
        got = describe(mapping["daily_profile_window"])
        reader.fail((*path, "daily_profile_window"), f"expected whole hours such as 6h, got {got}")
    if days and fields.get("metric", start.metric) == "none":
        key = "daily_profile" if "daily_profile" in mapping else "metric"
        reader.fail(
            (*path, key),
            "daily_profile and metric none do not go together: with no metric no hour is ever "
            "above the target, so the day's plan would never move a guest",
        )


def parse_policy(
    reader: Reader, value: object, path: Path, base: PolicyConfig | None = None
) -> PolicyConfig:
    """A :class:`PolicyConfig` from a configuration mapping (YAML or JSON) at ``path``.

    Keys are the fields of :class:`PolicyConfig`, plus ``preset`` (a name in :data:`PRESETS`) to
    start from instead of ``base`` (default :class:`PolicyConfig()`). Durations are seconds or
    strings such as ``5m``, ``6h``, ``1d 6h``; ``threshold``, ``target`` and ``margin`` are
    fractions (``0.15``) or percentages (``15%``); ``max_parallel``, ``max_node_inflow``,
    ``max_migrations_per_day`` and ``migration_budget_window`` may be null. ``options`` are
    checked against the strategy's options class (names, types, the strategy's own checks) and
    tried on a small cluster (:func:`strategy_problem`). A new ``strategy`` without ``options``
    starts with none. Errors are :class:`DocumentError` (one line naming the key).
    """
    start = base if base is not None else PolicyConfig()
    mapping = reader.mapping(value, path)
    reader.check_keys(mapping, path, POLICY_KEYS)
    if "preset" in mapping:
        start = PRESETS[reader.choice(mapping["preset"], (*path, "preset"), tuple(PRESETS))]
    fields = _read_fields(reader, mapping, path, start)
    options = _read_options(reader, mapping, path, start, fields.get("strategy", start.strategy))
    _check_spending(reader, mapping, path, fields, start)
    _check_daily_profile(reader, mapping, path, fields, start)
    try:  # the options are checked below, where a refusal can name the option
        config = replace(start, **fields, options={})
    except ValueError as exc:
        reader.fail(path, str(exc))
    _check_samples(reader, mapping, path, config)
    _check_reachable(reader, mapping, path, config)
    _check_strategy_takes(reader, mapping, path, config, options)
    return replace(config, options=options)


def _read_fields(
    reader: Reader, mapping: Mapping[str, object], path: Path, start: PolicyConfig
) -> dict[str, Any]:
    """The fields written in ``mapping`` (all but ``preset`` and ``options``), each checked on
    its own; the first refusal, in this order, is the one reported."""
    fields: dict[str, Any] = {}
    if "name" in mapping:
        # The history keeps this name: no blanks around it, no control characters.
        fields["name"] = reader.plain_name(mapping["name"], (*path, "name"))
    fields |= _read_durations(reader, mapping, path)
    if "metric" in mapping:
        fields["metric"] = reader.choice(mapping["metric"], (*path, "metric"), METRICS)
    if "failover_recovery" in mapping:
        key = (*path, "failover_recovery")
        fields["failover_recovery"] = reader.choice(
            mapping["failover_recovery"], key, FAILOVER_RECOVERIES
        )
    fields |= _read_thresholds(reader, mapping, path)
    fields |= _read_limits(reader, mapping, path)
    fields |= _read_budget(reader, mapping, path, start)
    for flag in FLAGS:
        if flag in mapping:
            fields[flag] = reader.boolean(mapping[flag], (*path, flag))
    if "strategy" in mapping:
        fields["strategy"] = _read_strategy(reader, mapping["strategy"], (*path, "strategy"))
    if any(key in mapping for key in _SCHEDULE_KEYS):
        fields["schedule"] = _read_schedule(reader, mapping, path, start.schedule)
    return fields


_Span = TypeVar("_Span")

#: The keys of a policy section that make its :class:`Schedule`.
_SCHEDULE_KEYS = ("windows", "blackouts", "timezone", "windows_apply_to", "blackouts_apply_to")


def _read_schedule(
    reader: Reader, mapping: Mapping[str, object], path: Path, start: Schedule | None
) -> Schedule:
    """The migration windows and blackouts written (``start``'s where not), each entry parsed
    (:func:`parse_weekly`, :func:`parse_blackout`); a time zone is required with either."""
    from opendrs.engine.policy.windows import Schedule, parse_blackout, parse_weekly, zone

    start = start or Schedule()
    windows, blackouts = start.windows, start.blackouts
    if "windows" in mapping:
        windows = tuple(_read_spans(reader, mapping["windows"], (*path, "windows"), parse_weekly))
    if "blackouts" in mapping:
        blackouts = tuple(
            _read_spans(reader, mapping["blackouts"], (*path, "blackouts"), parse_blackout)
        )
    timezone = start.timezone
    if "timezone" in mapping:
        timezone = reader.text(mapping["timezone"], (*path, "timezone"))
        try:
            zone(timezone)
        except ValueError:
            reader.fail(
                (*path, "timezone"),
                f"unknown time zone {describe(timezone)} (an IANA name such as Europe/Berlin, "
                "or UTC)",
            )
    elif windows or blackouts:
        key = "windows" if "windows" in mapping else "blackouts"
        if key in mapping:
            reader.fail(
                (*path, key),
                "needs timezone, the time zone its times are in (such as Europe/Berlin or UTC)",
            )
    return Schedule(windows, blackouts, timezone, **_read_applies(reader, mapping, path, start))


def _read_applies(
    reader: Reader, mapping: Mapping[str, object], path: Path, start: Schedule
) -> dict[str, frozenset[str]]:
    """``windows_apply_to`` and ``blackouts_apply_to``: each written one a list, not empty, of
    :data:`ACTIVITIES` (``start``'s where not written)."""
    from opendrs.engine.policy.windows import ACTIVITIES

    applies = {}
    for key in ("windows_apply_to", "blackouts_apply_to"):
        applies[key] = getattr(start, key)
        if key in mapping:
            kinds = reader.text_list(mapping[key], (*path, key))
            if not kinds:
                reader.fail(
                    (*path, key),
                    f"an empty list holds nothing back: name what the {key.split('_')[0]} "
                    f"apply to ({', '.join(ACTIVITIES)}), or remove them",
                )
            for index, kind in enumerate(kinds):
                reader.choice(kind, (*path, key, index), ACTIVITIES)
            applies[key] = frozenset(kinds)
    return applies


def _read_spans(
    reader: Reader, value: object, path: Path, parse: Callable[[str], _Span]
) -> list[_Span]:
    """Each entry of the list at ``path`` parsed by ``parse``: refused naming the entry, what
    was written and why."""
    spans = []
    for index, item in enumerate(reader.sequence(value, path)):
        try:
            spans.append(parse(item))
        except (ValueError, TypeError) as exc:
            reader.fail((*path, index), f"{describe(item)}: {exc}")
    return spans


def _read_durations(reader: Reader, mapping: Mapping[str, object], path: Path) -> dict[str, int]:
    """The :data:`_DURATIONS` written, in seconds within their ranges; an interval of at least a
    second."""
    durations: dict[str, int] = {}
    for key, (shortest, longest) in _DURATIONS.items():
        if key in mapping:
            durations[key] = reader.duration(
                mapping[key], (*path, key), minimum=shortest, maximum=longest
            )
    if durations.get("interval") == 0:
        reader.fail((*path, "interval"), "must be at least 1 second")
    return durations


def _read_thresholds(
    reader: Reader, mapping: Mapping[str, object], path: Path
) -> dict[str, float | int]:
    """The :data:`_FRACTIONS` written (a number or a percentage), then ``hold``, ``batch`` and
    ``keep_failover`` (whole numbers from 0)."""
    values: dict[str, float | int] = {}
    for key, largest in _FRACTIONS.items():
        if key in mapping:
            values[key] = _fraction(reader, mapping[key], (*path, key), largest)
    for key, most in (("hold", _MAX_HOLD), ("batch", MAX_COUNT), ("keep_failover", _MAX_FAILOVER)):
        if key in mapping:
            values[key] = reader.integer(mapping[key], (*path, key), minimum=0, maximum=most)
    return values


def _read_limits(
    reader: Reader, mapping: Mapping[str, object], path: Path
) -> dict[str, float | int | None]:
    """The executor :data:`LIMITS` written (whole numbers from 1, or null), then ``hot`` (a
    fraction above 0 and at most 1, or null)."""
    limits: dict[str, float | int | None] = {}
    for key in LIMITS:
        if key in mapping:
            item = mapping[key]
            limits[key] = (
                None
                if item is None
                else reader.integer(item, (*path, key), minimum=1, maximum=MAX_COUNT)
            )
    if "hot" in mapping:
        item = mapping["hot"]
        hpath = (*path, "hot")
        limits["hot"] = None if item is None else _fraction(reader, item, hpath, 1.0)
        if limits["hot"] == 0:
            reader.fail(hpath, "must be above 0 (write null to turn it off)")
    return limits


def _read_budget(
    reader: Reader, mapping: Mapping[str, object], path: Path, start: PolicyConfig
) -> dict[str, Any]:
    """``max_migrations_per_day`` written (:func:`parse_budget`, :func:`budget_problem`), then
    ``migration_budget_window``, checked against the budget written or ``start``'s; null turns
    either off."""
    budget_fields: dict[str, Any] = {}
    if "max_migrations_per_day" in mapping:
        item = mapping["max_migrations_per_day"]
        budget = None if item is None else parse_budget(item)
        problem = None if budget is None else budget_problem(budget, item)
        if problem:
            reader.fail((*path, "max_migrations_per_day"), problem)
        budget_fields["max_migrations_per_day"] = budget
    if "migration_budget_window" in mapping:
        item = mapping["migration_budget_window"]
        wpath = (*path, "migration_budget_window")
        window = None if item is None else reader.duration(item, wpath)
        budget = budget_fields.get("max_migrations_per_day", start.max_migrations_per_day)
        problem = None if window is None else budget_window_problem(budget, window)
        if problem:
            reader.fail(wpath, problem)
        budget_fields["migration_budget_window"] = window
    return budget_fields


def _read_strategy(reader: Reader, value: object, path: Path) -> str:
    """A strategy's name, known to the registry."""
    strategy = reader.text(value, path)
    if strategy not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        reader.fail(path, f"unknown strategy {describe(strategy)} (known: {known})")
    return strategy


def _read_options(
    reader: Reader,
    mapping: Mapping[str, object],
    path: Path,
    start: PolicyConfig,
    strategy: str,
) -> Mapping[str, object]:
    """The ``options`` written, each named by ``strategy``'s options and of its default's type;
    without them, ``start``'s options, or none for a new strategy."""
    if "options" not in mapping:
        return start.options if strategy == start.strategy else {}
    options = REGISTRY[strategy].options
    opath = (*path, "options")
    given = reader.mapping(mapping["options"], opath)
    reader.check_keys(given, opath, tuple(sorted(options.defaults())), f" for strategy {strategy}")
    return {
        key: _option_value(reader, options, key, item, (*opath, key)) for key, item in given.items()
    }


def _check_samples(
    reader: Reader, mapping: Mapping[str, object], path: Path, config: PolicyConfig
) -> None:
    """The smoothing window keeps at most :data:`_MAX_SAMPLES` observations: refused naming the
    ``smoothing`` or ``interval`` written, else the section."""
    samples = config.smoothing // config.interval
    if samples > _MAX_SAMPLES:
        where = next((k for k in ("smoothing", "interval") if k in mapping), None)
        reader.fail(
            (*path, where) if where else path,
            f"a smoothing of {format_duration(config.smoothing)} at an interval of "
            f"{format_duration(config.interval)} keeps {samples} observations, at most "
            f"{_MAX_SAMPLES}: shorten the smoothing or lengthen the interval",
        )


def _check_reachable(
    reader: Reader, mapping: Mapping[str, object], path: Path, config: PolicyConfig
) -> None:
    """A threshold the metric can reach (at most 100 % for :data:`_BOUNDED_METRICS`), and, with
    the spread as metric, a target not above the threshold (the plan asked for when the spread
    is between them would move nothing): refused naming the key written, else the section."""
    threshold, target = config.threshold, config.target
    if config.metric in _BOUNDED_METRICS and threshold > 1:
        reader.fail(
            (*path, "threshold") if "threshold" in mapping else path,
            f"{threshold * 100:g} % is more than the {config.metric} can be (100 %): balancing "
            "would never start",
        )
    if config.metric == "spread" and target > threshold:
        where = next((k for k in ("target", "threshold") if k in mapping), None)
        reader.fail(
            (*path, where) if where else path,
            f"the target ({target * 100:g} %) is above the threshold ({threshold * 100:g} %): "
            "a spread between them starts balancing that moves nothing; write a target below "
            "the threshold",
        )


def _check_strategy_takes(
    reader: Reader,
    mapping: Mapping[str, object],
    path: Path,
    config: PolicyConfig,
    options: Mapping[str, object],
) -> None:
    """The strategy takes the ``options`` when tried (:func:`strategy_problem`): refused naming
    the option refused on its own, else ``options``, else the section."""
    if not options:
        return
    request = strategy_request(config, PastMigrations(), 0.0)
    refused = strategy_problem(config.strategy, options, request)
    if refused is not None:
        key, problem = refused
        where: Path = path
        if "options" in mapping:
            where = (*path, "options", key) if key in options else (*path, "options")
        reader.fail(where, f"strategy {config.strategy}: {problem}")


def _trial_cluster() -> Cluster:
    """Two nodes, two guests on the first: a cluster every strategy has work to do on."""
    gib = 1024**3
    nodes = (Node("a", 8.0, 16 * gib), Node("b", 8.0, 16 * gib))
    guests = tuple(
        Guest(str(i), "a", cpu=2.0, memory=2 * gib, cpu_used=1.0, memory_used=gib, uptime=86400)
        for i in (1, 2)
    )
    return Cluster(nodes, guests)


def strategy_problem(
    strategy: str, options: Mapping[str, Any], request: Request | None = None
) -> tuple[str, str] | None:
    """Why ``strategy`` refuses ``options`` (asked with ``request``): ``(option, one line)``, or
    ``None`` when it takes them. ``option`` is the option refused on its own, or ``""`` when no
    single one is.

    The options are parsed (:meth:`StrategyOptions.parse`: names, types, the strategy's own
    checks), then the strategy is tried on a small cluster, so that a configuration (or a command
    line) with options a strategy refuses together is refused when it is read, not when the
    daemon decides. A strategy that fails on that cluster whatever the options is not the
    options' fault: its error propagates.
    """
    info = REGISTRY[strategy]
    asked = request or Request()

    def refuses(given: Mapping[str, Any]) -> str | None:
        try:
            info.propose(_trial_cluster(), asked, info.options.parse(strategy, given))
        except Exception as exc:  # the options' fault, if the defaults run (below)
            return _without_prefix(" ".join(str(exc).split()), strategy) or type(exc).__name__
        return None

    problem = refuses(options)
    if problem is None:
        return None
    if options:
        info.propose(_trial_cluster(), asked)  # a broken strategy
    for key, value in options.items():
        alone = refuses({key: value})
        if alone is not None:
            return key, alone
    return "", problem


def _without_prefix(text: str, strategy: str) -> str:
    """A strategy's message without the ``strategy NAME:`` its option checks put first (the
    callers name the strategy themselves)."""
    return text.removeprefix(f"strategy {strategy}: ")
