"""The policy configuration: :class:`PolicyConfig`, the peers' presets, what a policy asks of its
strategy, and the checks of a migration budget (one-line reasons)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from opendrs.engine.policy.state import PastMigrations, frozen_mapping
from opendrs.engine.strategies import REGISTRY
from opendrs.engine.strategies.base import Request, StrategyOptions
from opendrs.model.document import describe
from opendrs.model.units import format_duration

if TYPE_CHECKING:
    from opendrs.engine.policy.windows import Schedule

Metric = Literal["spread", "cv", "pve-imbalance", "memory-spread", "none"]

METRICS: tuple[str, ...] = ("spread", "cv", "pve-imbalance", "memory-spread", "none")


def metric_text(value: float, metric: str) -> str:
    """A value of ``metric`` (a fraction) for an operator: points of load (``15 pp``) for a
    spread, a percentage (``30 %``) for a ratio. A target is a spread whatever the metric."""
    return f"{value * 100:g} {'pp' if metric.endswith('spread') else '%'}"


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
    #: it on the recent usage (or the last observation's, where higher) runs hot and is relieved
    #: at once like an overload (within the cooldown and no-return guards), as is one whose
    #: steady rise is forecast above it one interval ahead (:mod:`.trend`); no plan fills a node
    #: beyond it, nor moves a guest onto a node seen running hot lately (only a relief with no
    #: other target, as its last resort). 0.85 by default, the
    #: simulator's hot level (the emulated peers have none); None: only the capacity counts.
    hot: float | None = 0.85
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
    #: When migrations may start (``windows``, ``blackouts``, their ``timezone`` and what each
    #: applies to: :mod:`.windows`). None (the default): at any time — and :mod:`.windows`
    #: is not imported by a command that reads no windows.
    schedule: Schedule | None = None
    #: Keep the failover headroom for this many nodes failing at once (:mod:`.failover`): every
    #: HA guest restarts on the nodes left. A balancing plan that would lose it is refused, a
    #: cluster without it is repaired toward it. 0 (the default): off.
    keep_failover: int = 0
    #: How the headroom restarts the HA guests of the failed nodes (:data:`FAILOVER_RECOVERIES`):
    #: ``best-fit`` — the placement engine's best node with room, biggest first; ``pve-basic``,
    #: ``pve-static`` — as Proxmox VE's HA manager in that scheduler mode; ``auto`` (the default)
    #: — the mode a Proxmox cluster's ``crs`` option sets (a snapshot's ``ha_scheduler``), else
    #: ``best-fit``.
    failover_recovery: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", frozen_mapping(self.options))
        for check in _FIELD_CHECKS:
            check(self)
        budget = self.max_migrations_per_day
        if isinstance(budget, float) and budget.is_integer():
            object.__setattr__(self, "max_migrations_per_day", int(budget))

    @property
    def strategy_options(self) -> StrategyOptions:
        """``options`` as the strategy's typed options (ValueError when it refuses them)."""
        return REGISTRY[self.strategy].options.parse(self.strategy, self.options)


#: The values of ``failover_recovery``.
#: ``auto`` and :data:`opendrs.engine.headroom.RECOVERIES` (written out: `opendrs plan` does not
#: import the headroom; a test keeps the two in step).
FAILOVER_RECOVERIES: tuple[str, ...] = ("auto", "best-fit", "pve-basic", "pve-static")

#: The fields of :class:`PolicyConfig` that are on or off.
FLAGS: tuple[str, ...] = ("maintenance_return", "spend_budget", "wait_for_motions")

#: The fields of :class:`PolicyConfig` that are fractions or factors (a number ≥ 0).
NUMBERS: tuple[str, ...] = ("threshold", "target", "margin")

#: The fields of :class:`PolicyConfig` that are whole numbers ≥ 0: durations and counts.
WHOLE_NUMBERS: tuple[str, ...] = (
    "interval",
    "hold",
    "cooldown",
    "no_return",
    "batch",
    "min_uptime",
    "smoothing",
    "avoid_after_failure",
    "daily_profile",
    "keep_failover",
)

#: The executor limits a policy may set: a whole number ≥ 1, or None.
LIMITS: tuple[str, ...] = ("max_parallel", "max_node_inflow")


def _check_flags(config: PolicyConfig) -> None:
    """The :data:`FLAGS` are booleans, and ``spend_budget`` has a budget to spend."""
    for flag in FLAGS:
        got = getattr(config, flag)
        if not isinstance(got, bool):
            raise ValueError(f"policy {flag}: expected true or false, got {got!r}")
    if config.spend_budget and config.max_migrations_per_day is None:
        raise ValueError("policy spend_budget: needs max_migrations_per_day, the budget it spends")


def _check_name_and_metric(config: PolicyConfig) -> None:
    """A non-empty name, a metric of :data:`METRICS`, and ``hot`` a fraction in (0, 1] or None."""
    if not config.name or not isinstance(config.name, str):
        raise ValueError(f"policy name: expected a non-empty name, got {config.name!r}")
    if config.metric not in METRICS:
        raise ValueError(
            f"policy metric: expected one of {', '.join(METRICS)}, got {config.metric!r}"
        )
    if config.failover_recovery not in FAILOVER_RECOVERIES:
        raise ValueError(
            f"policy failover_recovery: expected one of {', '.join(FAILOVER_RECOVERIES)}, "
            f"got {config.failover_recovery!r}"
        )
    hot = config.hot
    if hot is not None and (
        isinstance(hot, bool) or not isinstance(hot, int | float) or not 0 < hot <= 1
    ):
        raise ValueError(
            f"policy hot: expected a fraction above 0 and at most 1, or none, got {hot!r}"
        )


def _check_numbers(config: PolicyConfig) -> None:
    """The :data:`NUMBERS` are finite numbers ≥ 0, the :data:`WHOLE_NUMBERS` whole numbers ≥ 0,
    and the interval at least a second."""
    for key in NUMBERS:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"policy {key}: expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"policy {key}: expected a finite number ≥ 0, got {value!r}")
    for key in WHOLE_NUMBERS:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"policy {key}: expected a whole number ≥ 0, got {value!r}")
    if config.interval < 1:
        raise ValueError(f"policy interval: must be at least 1 second, got {config.interval}")


def _check_daily_profile(config: PolicyConfig) -> None:
    """``daily_profile`` in whole days and not with ``metric: none``; its window in whole hours
    from 1 to 24."""
    if config.daily_profile % 86400:
        raise ValueError(
            f"policy daily_profile: expected whole days (0: off), got {config.daily_profile} s"
        )
    if config.daily_profile and config.metric == "none":
        raise ValueError(
            "policy daily_profile: needs a metric (with metric none no hour is ever above "
            "the target, so the day's plan would never move a guest)"
        )
    span = config.daily_profile_window
    if (
        isinstance(span, bool)
        or not isinstance(span, int)
        or span % 3600
        or not (3600 <= span <= 86400)
    ):
        raise ValueError(
            f"policy daily_profile_window: expected whole hours from 1h to 24h, got {span!r}"
        )


def _check_budget(config: PolicyConfig) -> None:
    """The migration budget (:func:`budget_problem`) and its window
    (:func:`budget_window_problem`)."""
    budget = config.max_migrations_per_day
    if budget is not None and budget_problem(budget):
        raise ValueError(f"policy max_migrations_per_day: {budget_problem(budget)}")
    window = config.migration_budget_window
    if window is not None and budget_window_problem(budget, window):
        raise ValueError(f"policy migration_budget_window: {budget_window_problem(budget, window)}")


def _check_limits(config: PolicyConfig) -> None:
    """The :data:`LIMITS` are whole numbers ≥ 1 or None."""
    for key in LIMITS:
        value = getattr(config, key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"policy {key}: expected a whole number ≥ 1 or none, got {value!r}")


def _check_strategy(config: PolicyConfig) -> None:
    """A strategy of the registry, that takes the ``options`` (its typed options parse)."""
    if config.strategy not in REGISTRY:
        raise ValueError(
            f"policy strategy: unknown strategy {config.strategy!r} "
            f"(known: {', '.join(sorted(REGISTRY))})"
        )
    try:
        config.strategy_options  # noqa: B018  (parsed here to refuse bad options at once)
    except ValueError as exc:
        raise ValueError(f"policy {config.name}: {exc}") from None


#: The checks of a new :class:`PolicyConfig`, in order: the first refusal is the one raised.
_FIELD_CHECKS: tuple[Callable[[PolicyConfig], None], ...] = (
    _check_flags,
    _check_name_and_metric,
    _check_numbers,
    _check_daily_profile,
    _check_budget,
    _check_limits,
    _check_strategy,
)


def _presets() -> dict[str, PolicyConfig]:
    """The emulated peers (see the package docstring), and opendrs's own defaults."""
    return {
        "opendrs": PolicyConfig(),
        # Proxmox VE 9.1+ (pve-ha-manager 5.2.0, proxmox-resource-scheduling 2.1.0): the
        # normalised imbalance against 30 %, held for 3 CRM rounds of about 10 s — within one
        # observation of a minute —, one move at a time, none while any guest moves.
        "proxmox": PolicyConfig(
            name="proxmox",
            hot=None,
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
            hot=None,
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
            hot=None,
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


class _Presets(Mapping[str, PolicyConfig]):
    """:data:`PRESETS`, made when first read: checking a preset imports its strategy's module,
    which ``opendrs plan`` with another strategy has no use for."""

    @cached_property
    def _made(self) -> Mapping[str, PolicyConfig]:
        return MappingProxyType(_presets())

    def __getitem__(self, name: str) -> PolicyConfig:
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)

    def __repr__(self) -> str:
        return f"PRESETS({dict(self._made)!r})"


#: The emulated peers (see the package docstring), and opendrs's own defaults, by name.
PRESETS: Mapping[str, PolicyConfig] = _Presets()


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


#: The most a count may be: a ``batch``, an executor limit, a whole migration budget.
MAX_COUNT = 100_000

#: The smallest fractional migration budget: one migration in any 100 days.
MIN_BUDGET_FRACTION = 0.01


def budget_problem(value: object, written: object = None) -> str | None:
    """Why ``value`` is no migration budget (None: it is one): a whole number from 0 to
    :data:`MAX_COUNT`, or a fraction above 0 and below 1 (one migration in ``1 / value``
    days), at least :data:`MIN_BUDGET_FRACTION`. The reason quotes ``written`` (what the
    operator wrote) when given, else ``value``."""
    expected = (
        f"expected a whole number from 0 to {MAX_COUNT}, or a fraction from "
        f"{MIN_BUDGET_FRACTION:g} to below 1 such as 0.5 or 1/3 (one migration in any 2 or 3 "
        f"days), got {describe(value if written is None else written)}"
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return expected
    if isinstance(value, int) or (math.isfinite(value) and value >= 1 and value.is_integer()):
        return None if 0 <= value <= MAX_COUNT else expected
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
