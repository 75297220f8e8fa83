"""What the policy carries from one decision to the next (:class:`PolicyState`) and what the
controller's history tells it (:class:`PastMigrations`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opendrs.engine.strategies.base import Stop


def frozen_mapping(value: Mapping[Any, Any] | None) -> Mapping[Any, Any]:
    return MappingProxyType(dict(value or {}))


#: The migration budget's rolling window: a day, in seconds (a fractional budget's is longer:
#: :func:`budget_window`).
BUDGET_WINDOW = 24 * 3600


def budget_window(budget: float, window: int | None = None) -> int:
    """The rolling window, in seconds, of a budget of ``budget`` migrations per day: ``window``
    when the policy sets one (``migration_budget_window``); else a day for a whole number,
    ``1 / budget`` days (rounded to the second) for a fraction below 1."""
    if window is not None:
        return window
    return BUDGET_WINDOW if budget == 0 or budget >= 1 else round(BUDGET_WINDOW / budget)


def budget_allowance(budget: float, window: int | None = None) -> int:
    """How many budgeted migrations may start in any :func:`budget_window`: with ``window``,
    ``budget`` × the window in days, rounded down, at least one (none for a budget of 0);
    without, the budget itself when it is whole, one for a fraction below 1."""
    if window is not None:
        # The tolerance keeps 1/3 a day over 6 days at 2, not 1.999….
        return 0 if budget == 0 else max(int(budget * window / BUDGET_WINDOW + 1e-9), 1)
    return 1 if 0 < budget < 1 else int(budget)


@dataclass(frozen=True, slots=True)
class PastMigrations:
    """What the controller's history tells the policy (times on the clock ``decide`` gets)."""

    #: Guest id → the time until which it may not move again.
    cooldown_until: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: Guest id → (node it left, when), any order.
    departures: Mapping[str, tuple[tuple[str, float], ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: (guest id, node) → the time until which that target is avoided (a migration failed).
    avoid: Mapping[tuple[str, str], float] = field(default_factory=lambda: MappingProxyType({}))
    #: When each migration that counts against the migration budget started (balancing plans
    #: and repairs of nodes that only run hot), any order; the controller gives those of the
    #: last :func:`budget_window` seconds (the policy's
    #: ``migration_budget_window``, when set) when the policy has a budget.
    budget_spent: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget_spent", tuple(float(t) for t in self.budget_spent))
        object.__setattr__(self, "cooldown_until", frozen_mapping(self.cooldown_until))
        object.__setattr__(
            self,
            "departures",
            frozen_mapping({g: tuple(tuple(d) for d in v) for g, v in self.departures.items()}),
        )
        object.__setattr__(self, "avoid", frozen_mapping(self.avoid))


@dataclass(frozen=True, slots=True)
class FailoverCheck:
    """The failover headroom (``policy.keep_failover``) of one placement, as last checked: the
    placement's ``key`` (each guest's node, each node's state), when it was checked, how far it
    is from the headroom that moves could give back
    (:attr:`~opendrs.engine.headroom.Headroom.shortfall`), the operator's summary, and when
    (and why) a repair last found nothing."""

    key: tuple[object, ...]
    at: float
    failures: int
    shortfall: tuple[int, int]
    summary: str
    #: HA guests that cannot restart in the worst case, those no placement helps included.
    unrestartable: int = 0
    ha_guests: int = 0
    #: When a repair toward the headroom last found no move (None: not since it was lost).
    repair_tried: float | None = None
    #: Why that repair found no move (a ``failover_short`` stop: the guests, the failed nodes
    #: and what keeps the moves off), said by every decision while the headroom stays short.
    repair_blocked: Stop | None = None

    @property
    def ok(self) -> bool:
        """Every HA guest restarts in every case."""
        return self.unrestartable == 0

    def as_dict(self) -> dict[str, object]:
        return {
            "failures": self.failures,
            "ok": self.ok,
            "unrestartable": self.unrestartable,
            "ha_guests": self.ha_guests,
            "summary": self.summary,
            "repair_blocked": None
            if self.repair_blocked is None
            else self.repair_blocked.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy carries from one decision to the next; ``PolicyState()`` to start."""

    #: Observations in a row above the threshold since the last attempt.
    hold: int = 0
    #: When the strategy was last asked (acted on or not), and when a plan was last carried out.
    last_attempt: float | None = None
    last_action: float | None = None
    #: Guest id → the node it was on while that node was in maintenance: where it goes back to
    #: with ``maintenance_return`` (kept until it is back there, or gone).
    evacuated: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Node name → when it was last seen running hot (above the policy's ``hot`` level on the
    #: usage capacity is checked on), kept for the longer of ``smoothing`` and ``no_return``:
    #: no plan and no relief moves a guest there meanwhile — a node that ran hot may run hot
    #: again (loads taking turns) —, but a relief no other node has room for (its last resort,
    #: rather than a node left hot for the day). The controller keeps it in its history file
    #: across a restart.
    hot_seen: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: The failover headroom last checked (``policy.keep_failover``; None: not checked).
    failover: FailoverCheck | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "evacuated", frozen_mapping(self.evacuated))
        object.__setattr__(self, "hot_seen", frozen_mapping(self.hot_seen))
