"""The policy configuration: :class:`PolicyConfig`, the peers' presets, reading a policy section
of a configuration file (one-line errors), and a strategy's options checked when they are read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from opendrs.engine.policy.state import PastMigrations, frozen_mapping
from opendrs.engine.strategies import REGISTRY
from opendrs.engine.strategies.base import Request, StrategyOptions, typed_option
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.document import Path, Reader, describe
from opendrs.model.units import format_duration

Metric = Literal["spread", "cv", "pve-imbalance", "memory-spread", "none"]

METRICS: tuple[str, ...] = ("spread", "cv", "pve-imbalance", "memory-spread", "none")

#: Proxmox's CRM round in seconds (pve-ha-manager ``CRM.pm`` line 363): its hold is counted in
#: these rounds.
PVE_CRM_ROUND = 10
#: Proxmox's hold, in CRM rounds (``ha-auto-rebalance-hold-duration``, default 3).
PVE_HOLD_ROUNDS = 3
#: The ``proxmox`` preset's observation interval in seconds.
PVE_PRESET_INTERVAL = 60


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """When to act; see the package docstring for each guard. Durations are in seconds."""

    name: str = "opendrs"
    #: Seconds between observations and decisions (the controller loop's period).
    interval: int = 300
    metric: Metric = "spread"
    #: Act only when the metric is above this (spreads are fractions: 0.15 = 15 pp).
    threshold: float = 0.15
    #: Balance to this spread (asked of the strategy as ``target_spread``; ``balance`` reads it).
    target: float = 0.08
    #: Observations in a row above the threshold before acting (0 acts like 1).
    hold: int = 6
    #: Least relative improvement of the metric a plan must bring; 0: no check.
    margin: float = 0.25
    cooldown: int = 6 * 3600
    no_return: int = 24 * 3600
    #: Most migrations per decision; 0: no limit.
    batch: int = 30
    min_uptime: int = 600
    #: Moving-average window over measured usage; 0: off. Long on purpose: it is each guest's
    #: demand the plan is made for, and only a lasting imbalance is worth a migration (placement
    #: changes are seen at once — it is usage that is averaged, not node loads).
    smoothing: int = 6 * 3600
    avoid_after_failure: int = 3600
    strategy: str = "balance"
    #: Extra strategy options (they win over what the policy fills in).
    options: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: Executor limits this policy implies (None: the cluster's settings).
    max_parallel: int | None = None
    max_node_inflow: int | None = None
    #: Move guests evacuated for maintenance back to their node when it leaves maintenance
    #: (Proxmox HA's ``maintenance_node``, ``incus cluster restore``); off: the balance decides.
    maintenance_return: bool = False
    #: Decide nothing while any guest of the cluster is moving — by opendrs or not (an HA
    #: migrate or relocate, a manual move) —, the hold standing still, as Proxmox's own
    #: rebalancer waits (``Manager.pm`` ``any_resource_motion_queued_or_running``).
    wait_for_motions: bool = False
    #: In dynamic mode, the share of a node's capacity its measured usage may fill: a node above
    #: it on the recent usage runs hot and, while the metric on the average usage is above the
    #: threshold, is relieved like an overload (within the cooldown and no-return guards); no
    #: plan fills a node beyond it. None (the default): only the capacity itself counts.
    hot: float | None = None
    #: Most migrations that balance (plans, and repairs of nodes that only run hot) over a
    #: rolling 24 hours — or, a fraction below 1 such as 0.5, one over a rolling ``1 / budget``
    #: days (48 hours); repairs of maintenance, failures and hard rules, and returns from
    #: maintenance, are exempt. None (the default): no budget.
    max_migrations_per_day: int | float | None = None
    #: The budget's rolling window, in seconds: at most ``max_migrations_per_day`` × the window
    #: in days (rounded down) balancing migrations start in any such window, free to be spent
    #: together. None (the default): 24 hours for a whole budget, ``1 / budget`` days for a
    #: fraction (:func:`budget_window`).
    migration_budget_window: int | None = None
    #: With ``max_migrations_per_day``, spend what the budget leaves on a faster reaction
    #: (:mod:`.spending`: usage closer to the recent demand, a shorter hold, while much of it is
    #: left). False (the default): the budget only caps.
    spend_budget: bool = False
    #: Demand per time of day: when above 0, each guest's usage is kept per hour of the day over
    #: about this many seconds (whole days) and balancing decides on the hour the placement
    #: balances worst, a plan's margin judged on every hour (:mod:`.profile`). 0 (the default):
    #: off, balancing decides on the ``smoothing`` average.
    daily_profile: int = 0
    #: With ``daily_profile``, each hour's usage is the profile's mean over this many seconds
    #: (whole hours, 1 to 24) up to it — 6 hours, as the ``smoothing`` average at that time of
    #: day; 1 hour balances every hour on its own (more migrations, more balance).
    daily_profile_window: int = 6 * 3600

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", frozen_mapping(self.options))
        for flag in ("maintenance_return", "spend_budget", "wait_for_motions"):
            got = getattr(self, flag)
            if not isinstance(got, bool):
                raise ValueError(f"policy {flag}: expected true or false, got {got!r}")
        if self.spend_budget and self.max_migrations_per_day is None:
            raise ValueError(
                "policy spend_budget: needs max_migrations_per_day, the budget it spends"
            )
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"policy name: expected a non-empty name, got {self.name!r}")
        if self.metric not in METRICS:
            raise ValueError(
                f"policy metric: expected one of {', '.join(METRICS)}, got {self.metric!r}"
            )
        if self.hot is not None and (
            isinstance(self.hot, bool)
            or not isinstance(self.hot, int | float)
            or not 0 < self.hot <= 1
        ):
            raise ValueError(
                f"policy hot: expected a fraction above 0 and at most 1, or none, got {self.hot!r}"
            )
        for key in ("threshold", "target", "margin"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"policy {key}: expected a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"policy {key}: expected a finite number ≥ 0, got {value!r}")
        for key in (
            "interval",
            "hold",
            "cooldown",
            "no_return",
            "batch",
            "min_uptime",
            "smoothing",
            "avoid_after_failure",
            "daily_profile",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"policy {key}: expected a whole number ≥ 0, got {value!r}")
        if self.interval < 1:
            raise ValueError(f"policy interval: must be at least 1 second, got {self.interval}")
        if self.daily_profile % 86400:
            raise ValueError(
                f"policy daily_profile: expected whole days (0: off), got {self.daily_profile} s"
            )
        if self.daily_profile and self.metric == "none":
            raise ValueError(
                "policy daily_profile: needs a metric (with metric none no hour is ever above "
                "the target, so the day's plan would never move a guest)"
            )
        span = self.daily_profile_window
        if (
            isinstance(span, bool)
            or not isinstance(span, int)
            or span % 3600
            or not (3600 <= span <= 86400)
        ):
            raise ValueError(
                f"policy daily_profile_window: expected whole hours from 1h to 24h, got {span!r}"
            )
        budget = self.max_migrations_per_day
        if budget is not None and budget_problem(budget):
            raise ValueError(f"policy max_migrations_per_day: {budget_problem(budget)}")
        if isinstance(budget, float) and budget.is_integer():
            object.__setattr__(self, "max_migrations_per_day", int(budget))
        window = self.migration_budget_window
        if window is not None and budget_window_problem(budget, window):
            raise ValueError(
                f"policy migration_budget_window: {budget_window_problem(budget, window)}"
            )
        for key in ("max_parallel", "max_node_inflow"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"policy {key}: expected a whole number ≥ 1 or none, got {value!r}"
                )
        if self.strategy not in REGISTRY:
            raise ValueError(
                f"policy strategy: unknown strategy {self.strategy!r} "
                f"(known: {', '.join(sorted(REGISTRY))})"
            )
        try:
            self.strategy_options  # noqa: B018  (parsed here to refuse bad options at once)
        except ValueError as exc:
            raise ValueError(f"policy {self.name}: {exc}") from None

    @property
    def strategy_options(self) -> StrategyOptions:
        """``options`` as the strategy's typed options (ValueError when it refuses them)."""
        return REGISTRY[self.strategy].options.parse(self.strategy, self.options)


#: The emulated peers (see the package docstring), and opendrs's own defaults.
PRESETS: Mapping[str, PolicyConfig] = MappingProxyType(
    {
        "opendrs": PolicyConfig(),
        # Proxmox VE 9.1+ (pve-ha-manager 5.2.0, proxmox-resource-scheduling 2.1.0): the
        # normalised imbalance against 30 %, held for 3 CRM rounds of about 10 s — within one
        # observation of a minute —, one move at a time, none while any guest moves.
        "proxmox": PolicyConfig(
            name="proxmox",
            interval=PVE_PRESET_INTERVAL,
            metric="pve-imbalance",
            threshold=0.3,
            hold=math.ceil(PVE_HOLD_ROUNDS * PVE_CRM_ROUND / PVE_PRESET_INTERVAL),
            margin=0.1,
            cooldown=0,
            no_return=0,
            batch=1,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="pve-bruteforce",
            max_parallel=1,
            maintenance_return=True,
            wait_for_motions=True,
        ),
        "incus": PolicyConfig(
            name="incus",
            interval=15 * 60,
            metric="none",
            threshold=0.0,
            hold=1,
            margin=0.0,
            cooldown=6 * 3600,
            no_return=0,
            batch=1,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="incus",
            max_parallel=1,
            maintenance_return=True,
        ),
        "proxlb": PolicyConfig(
            name="proxlb",
            interval=12 * 3600,
            metric="memory-spread",
            threshold=0.10,
            hold=1,
            margin=0.0,
            cooldown=0,
            no_return=0,
            batch=0,
            min_uptime=0,
            smoothing=0,
            avoid_after_failure=0,
            strategy="proxlb-greedy",
            max_parallel=5,
            max_node_inflow=5,
        ),
    }
)


def strategy_request(
    config: PolicyConfig,
    past: PastMigrations,
    now: float,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
    left: int | None = None,
) -> Request:
    """What the policy asks of its strategy: the placements it forbids, the most migrations —
    its batch (none with ``batch`` 0), or ``left`` of the migration budget when that is less —,
    its target spread, and the cooldowns at ``now``. The strategy's options, set explicitly, win
    over it (:meth:`StrategyOptions.pick`)."""
    return Request(
        forbidden=forbidden,
        max_moves=most_moves(config.batch, left),
        target_spread=config.target,
        now=now,
        cooldown_until=dict(past.cooldown_until),
    )


def most_moves(batch: int, left: int | None) -> int | None:
    """The most migrations one decision may make: the ``batch`` (0: no limit) and what is
    ``left`` of the migration budget (None: no budget), whichever is less; None: no limit."""
    limits = [n for n in (batch if batch > 0 else None, left) if n is not None]
    return min(limits) if limits else None


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


#: Each fraction's largest value: a spread or CV threshold and target (100 = 10000 %), and the
#: relative improvement a plan must bring (at most all of it).
_FRACTIONS: Mapping[str, float] = MappingProxyType(
    {"threshold": 100.0, "target": 100.0, "margin": 1.0}
)


_MAX_COUNT = 100_000


_MAX_HOLD = 10_000

#: The smallest fractional migration budget: one migration in any 100 days.
MIN_BUDGET_FRACTION = 0.01


def budget_problem(value: object, written: object = None) -> str | None:
    """Why ``value`` is no migration budget (None: it is one): a whole number from 0 to
    :data:`_MAX_COUNT`, or a fraction above 0 and below 1 (one migration in ``1 / value``
    days), at least :data:`MIN_BUDGET_FRACTION`. The reason quotes ``written`` (what the
    operator wrote) when given, else ``value``."""
    expected = (
        f"expected a whole number from 0 to {_MAX_COUNT}, or a fraction from "
        f"{MIN_BUDGET_FRACTION:g} to below 1 such as 0.5 or 1/3 (one migration in any 2 or 3 "
        f"days), got {describe(value if written is None else written)}"
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return expected
    if isinstance(value, int) or (math.isfinite(value) and value >= 1 and value.is_integer()):
        return None if 0 <= value <= _MAX_COUNT else expected
    return None if MIN_BUDGET_FRACTION <= value < 1 else expected


#: The shortest and longest migration budget window, in seconds: an hour, a year.
BUDGET_WINDOW_RANGE: tuple[int, int] = (3600, 365 * 86400)


def budget_window_problem(budget: float | None, window: object) -> str | None:
    """Why ``window`` (seconds) is no window for a budget of ``budget`` migrations a day (None:
    it is one): a whole number of seconds from an hour to a year, set with a budget, and long
    enough to hold one migration of a fractional budget."""
    shortest, longest = BUDGET_WINDOW_RANGE
    if isinstance(window, bool) or not isinstance(window, int):
        return f"expected a duration such as 7d, got {describe(window)}"
    if not shortest <= window <= longest:
        return (
            f"must be from {format_duration(shortest)} to {format_duration(longest)}, "
            f"got {format_duration(window)}"
        )
    if budget is None:
        return "needs max_migrations_per_day: a window without a budget limits nothing"
    if 0 < budget * window < 86400 * (1 - 1e-9):
        return (
            f"{format_duration(window)} is too short for {budget:g} migrations a day: it must "
            f"hold one, at least {format_duration(math.ceil(86400 / budget))}"
        )
    return None


def parse_budget(value: object) -> object:
    """A migration budget as written: a number, or a string ``N``, ``0.5`` or ``1/N`` made a
    number (anything else is returned as it is, for :func:`budget_problem` to refuse)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    one, slash, days = text.partition("/")
    try:
        if slash:
            return 1 / int(days) if one.strip() == "1" and int(days) > 0 else value
        return int(text) if text.isdigit() else float(text)
    except ValueError:
        return value


#: Most observations the smoothing window keeps (``smoothing / interval``): the window is
#: memory, and it is copied at every observation.
_MAX_SAMPLES = 10_000


def _fraction(reader: Reader, value: object, path: Path, maximum: float) -> float:
    """A number from 0 to ``maximum``, or a percentage written ``15%`` (0.15)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1].strip()
        try:
            number = float(text)
        except ValueError:
            reader.fail(path, f"cannot read {describe(value)} as a percentage (example: 15%)")
        if not math.isfinite(number) or number < 0:
            reader.fail(path, f"must be a finite percentage ≥ 0, got {describe(value)}")
        if number / 100 > maximum:
            reader.fail(path, f"must not be more than {maximum * 100:g}%, got {describe(value)}")
        return number / 100
    return reader.number(value, path, maximum=maximum)


def _option_value(reader: Reader, value: object, path: Path, default: object) -> object:
    """A strategy option checked against the type of its default, as ``opendrs plan -o`` does."""
    try:
        value = typed_option(value, default, describe(value))
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
    fields: dict[str, Any] = {}
    if "name" in mapping:
        # The history keeps this name: no blanks around it, no control characters.
        fields["name"] = reader.plain_name(mapping["name"], (*path, "name"))
    for key, (shortest, longest) in _DURATIONS.items():
        if key in mapping:
            fields[key] = reader.duration(
                mapping[key], (*path, key), minimum=shortest, maximum=longest
            )
    if fields.get("interval") == 0:
        reader.fail((*path, "interval"), "must be at least 1 second")
    if "metric" in mapping:
        fields["metric"] = reader.choice(mapping["metric"], (*path, "metric"), METRICS)
    for key, largest in _FRACTIONS.items():
        if key in mapping:
            fields[key] = _fraction(reader, mapping[key], (*path, key), largest)
    for key, most in (("hold", _MAX_HOLD), ("batch", _MAX_COUNT)):
        if key in mapping:
            fields[key] = reader.integer(mapping[key], (*path, key), minimum=0, maximum=most)
    for key in ("max_parallel", "max_node_inflow"):
        if key in mapping:
            item = mapping[key]
            fields[key] = (
                None
                if item is None
                else reader.integer(item, (*path, key), minimum=1, maximum=_MAX_COUNT)
            )
    if "hot" in mapping:
        item = mapping["hot"]
        hpath = (*path, "hot")
        fields["hot"] = None if item is None else _fraction(reader, item, hpath, 1.0)
        if fields["hot"] == 0:
            reader.fail(hpath, "must be above 0 (write null to turn it off)")
    if "max_migrations_per_day" in mapping:
        item = mapping["max_migrations_per_day"]
        bpath = (*path, "max_migrations_per_day")
        budget = None if item is None else parse_budget(item)
        problem = None if budget is None else budget_problem(budget, item)
        if problem:
            reader.fail(bpath, problem)
        fields["max_migrations_per_day"] = budget
    if "migration_budget_window" in mapping:
        item = mapping["migration_budget_window"]
        wpath = (*path, "migration_budget_window")
        window = None if item is None else reader.duration(item, wpath)
        budget = fields.get("max_migrations_per_day", start.max_migrations_per_day)
        problem = None if window is None else budget_window_problem(budget, window)
        if problem:
            reader.fail(wpath, problem)
        fields["migration_budget_window"] = window
    for flag in ("maintenance_return", "spend_budget", "wait_for_motions"):
        if flag in mapping:
            fields[flag] = reader.boolean(mapping[flag], (*path, flag))
    strategy = start.strategy
    if "strategy" in mapping:
        spath = (*path, "strategy")
        strategy = reader.text(mapping["strategy"], spath)
        if strategy not in REGISTRY:
            known = ", ".join(sorted(REGISTRY))
            reader.fail(spath, f"unknown strategy {describe(strategy)} (known: {known})")
        fields["strategy"] = strategy
    options: Mapping[str, object] = start.options
    if strategy != start.strategy:
        options = {}
    kind = REGISTRY[strategy].options
    defaults = kind.defaults()
    if "options" in mapping:
        opath = (*path, "options")
        given = reader.mapping(mapping["options"], opath)
        reader.check_keys(given, opath, tuple(sorted(defaults)), f" for strategy {strategy}")
        options = {
            key: _option_value(reader, item, (*opath, key), defaults[key])
            for key, item in given.items()
        }
    _check_spending(reader, mapping, path, fields, start)
    _check_daily_profile(reader, mapping, path, fields, start)
    try:  # the options are checked below, where a refusal can name the option
        config = replace(start, **fields, options={})
    except ValueError as exc:
        reader.fail(path, str(exc))
    samples = config.smoothing // config.interval
    if samples > _MAX_SAMPLES:
        where = next((k for k in ("smoothing", "interval") if k in mapping), None)
        reader.fail(
            (*path, where) if where else path,
            f"a smoothing of {format_duration(config.smoothing)} at an interval of "
            f"{format_duration(config.interval)} keeps {samples} observations, at most "
            f"{_MAX_SAMPLES}: shorten the smoothing or lengthen the interval",
        )
    if options:
        request = strategy_request(config, PastMigrations(), 0.0)
        refused = strategy_problem(config.strategy, options, request)
        if refused is not None:
            key, problem = refused
            where: Path = path
            if "options" in mapping:
                where = (*path, "options", key) if key in options else (*path, "options")
            reader.fail(where, f"strategy {config.strategy}: {problem}")
    return replace(config, options=options)


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
