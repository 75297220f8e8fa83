"""The ``optimal`` strategy as the registry lists it: its typed options (:class:`OptimalOptions`),
the weights of its objective (the balanciness level, balancing switched off below its gap
threshold or when no node exceeds a utilisation threshold) and :func:`propose_optimal`, which
reads the problem from the cycle's view and searches it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from opendrs.engine.objective import BALANCINESS, DEFAULT_WEIGHTS, USAGES
from opendrs.engine.usage import LoadModel
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster

from ..base import (
    Proposal,
    Request,
    Stop,
    Strategy,
    StrategyOptions,
    cluster_imbalance,
    constraints_for,
)
from .answer import STRATEGY, Outcome, solver_report
from .problem import build_problem, capacity_shortfall
from .search import Budget, References, search
from .terms import METHODS, initial_spread, thresholds_exceeded

DEFAULT_TIME_LIMIT = 10.0

#: The smart methods' term weights, in the order ``Proposal.options`` echoes them.
_TERM_WEIGHTS: tuple[str, ...] = (
    "w_cpu_usage",
    "w_cpu_psi",
    "w_mem_usage",
    "w_mem_psi",
    "w_io_usage",
    "w_io_psi",
    "w_global_mem",
    "w_global_cpu",
    "w_global_io",
)

#: The options echoed in ``Proposal.options`` before the smart methods' term weights, and after.
_ECHOED_FIRST = (
    "method",
    "balanciness",
    "w_balance",
    "w_stickiness",
    "cpu_threshold",
    "memory_threshold",
    "disk_threshold",
    "usage",
)
_ECHOED_LAST = ("time_limit", "workers", "seed", "strict", "hint")


@dataclass(frozen=True)
class OptimalOptions(StrategyOptions):
    """``optimal``'s options.

    * ``method``: ``balance`` (default) or one of proxlb-solver's methods (:data:`METHODS`).
    * ``balanciness``: 1 (conservative: only forced moves) to 5 (aggressive).
    * ``w_balance``, ``w_stickiness``: override the level's weights (whole numbers).
    * ``cpu_threshold``, ``memory_threshold``, ``disk_threshold``: utilisation in percent; when
      any is set, balancing happens only if some usable node exceeds one.
    * ``usage``: proxlb-solver's ``mode``: ``used`` (measured CPU), ``assigned`` (vCPUs) or
      ``psi``.
    * ``w_*``: term weights of the smart methods (defaults:
      :data:`~opendrs.engine.objective.DEFAULT_WEIGHTS`).
    * ``time_limit``: CP-SAT's budget in wall-clock seconds (with one worker, a fifth of it in
      deterministic time normally ends the search first, so that runs repeat).
    * ``workers``: CP-SAT search workers; more than one is faster but not deterministic.
    * ``seed``: CP-SAT's random seed.
    * ``strict``: proxlb-solver's semantics — contradictory rules, guests that cannot be placed
      anywhere allowed and fixed guests that break a hard rule make the problem infeasible.
    * ``hint``: the strategy whose answer warms the search (default: the default strategy);
      ``current`` starts from the current placement.
    """

    percents: ClassVar[frozenset[str]] = frozenset(
        {"cpu_threshold", "memory_threshold", "disk_threshold"}
    )

    method: str = "balance"
    balanciness: int = 3
    w_balance: int | None = None
    w_stickiness: int | None = None
    cpu_threshold: float | None = None
    memory_threshold: float | None = None
    disk_threshold: float | None = None
    usage: str = "used"
    w_cpu_usage: float | None = None
    w_cpu_psi: float | None = None
    w_mem_usage: float | None = None
    w_mem_psi: float | None = None
    w_io_usage: float | None = None
    w_io_psi: float | None = None
    w_global_mem: float | None = None
    w_global_cpu: float | None = None
    w_global_io: float | None = None
    time_limit: float = DEFAULT_TIME_LIMIT
    workers: int = 1
    seed: int = 0
    strict: bool = False
    hint: str | None = None

    def term_weights(self) -> dict[str, float]:
        """The smart methods' term weights: the defaults, overridden where set."""
        given = {key: getattr(self, key) for key in _TERM_WEIGHTS}
        chosen = {**DEFAULT_WEIGHTS, **{k: v for k, v in given.items() if v is not None}}
        return {k: float(v) for k, v in chosen.items()}

    def thresholds(self) -> dict[str, float | None]:
        """The utilisation thresholds (percent; None: not set), by resource."""
        return {
            "cpu": self.cpu_threshold,
            "memory": self.memory_threshold,
            "disk": self.disk_threshold,
        }

    def echoed(self, weights: Mapping[str, float]) -> dict[str, Any]:
        """The options a proposal echoes (``Proposal.options``), a smart method's term
        ``weights`` (:meth:`term_weights`) among them."""
        echoed = {key: getattr(self, key) for key in _ECHOED_FIRST}
        if self.method.endswith("_smart"):
            echoed.update({key: weights[key] for key in _TERM_WEIGHTS})
        echoed.update({key: getattr(self, key) for key in _ECHOED_LAST})
        return echoed

    def check(self) -> None:
        try:
            weights = self.term_weights()
        except (TypeError, ValueError):
            bad = next(k for k in _TERM_WEIGHTS if not _is_number(getattr(self, k)))
            raise ValueError(f"{bad}: expected a number ≥ 0, got {getattr(self, bad)!r}") from None
        _check_objective(self, weights)
        _check_search(self)


def _is_number(value: object) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, int | float))


def _check_objective(options: OptimalOptions, weights: Mapping[str, float]) -> None:
    """ValueError naming the first option of the objective that is refused: the method, the
    usage, the balanciness level, the weights (``weights``: the term weights)."""
    method, usage, balanciness = options.method, options.usage, options.balanciness
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r} (known: {', '.join(METHODS)})")
    if usage not in USAGES:
        raise ValueError(f"usage: expected one of {', '.join(USAGES)}, got {usage!r}")
    if isinstance(balanciness, bool) or balanciness not in BALANCINESS:
        raise ValueError(f"balanciness: expected 1 to 5, got {balanciness!r}")
    for key, value in (("w_balance", options.w_balance), ("w_stickiness", options.w_stickiness)):
        if value is not None and (
            isinstance(value, bool) or not float(value).is_integer() or value < 0
        ):
            raise ValueError(f"{key}: expected a whole number ≥ 0, got {value!r}")
    for key, value in weights.items():
        if isinstance(value, bool) or not math.isfinite(float(value)) or value < 0:
            raise ValueError(f"{key}: expected a number ≥ 0, got {value!r}")


def _check_search(options: OptimalOptions) -> None:
    """ValueError naming the first option of the search that is refused: the time limit, the
    workers, the thresholds, the seed, the warm start's strategy."""
    time_limit, workers, seed, hint = (
        options.time_limit,
        options.workers,
        options.seed,
        options.hint,
    )
    if not time_limit > 0 or not math.isfinite(time_limit):
        raise ValueError(f"time_limit: expected seconds > 0, got {time_limit!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a whole number ≥ 1, got {workers!r}")
    for key, value in options.thresholds().items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
        ):
            raise ValueError(f"{key}_threshold: expected a percentage ≥ 0, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed: expected a whole number from 0 to 2³¹ − 1, got {seed!r}")
    if hint is not None:
        # Imported here: the registry lists this strategy.
        from opendrs.engine.strategies import REGISTRY

        if hint != "current" and hint not in REGISTRY:
            known = ", ".join(["current", *sorted(REGISTRY)])
            raise ValueError(f"hint: unknown strategy {hint!r} (known: {known})")


def _objective_weights(
    cluster: Cluster, options: OptimalOptions, weights: Mapping[str, float], loads: LoadModel
) -> tuple[int, int, float, tuple[str, Stop] | None]:
    """``(w_balance, w_stickiness, initial spread, note)``: the weights of the balanciness level
    (with the given ``w_balance``, ``w_stickiness`` overrides), ``w_balance`` 0 — and a note why
    (a sentence and the stop it makes when nothing else moves) — below the level's gap
    threshold or when no node exceeds a utilisation threshold (``weights``: the term weights;
    ``loads``: the cluster's balance loads)."""
    balanciness, method, thresholds = options.balanciness, options.method, options.thresholds()
    level_wb, level_ws, gap_threshold = BALANCINESS[balanciness]
    wb = int(options.w_balance) if options.w_balance is not None else level_wb
    ws = int(options.w_stickiness) if options.w_stickiness is not None else level_ws
    start_spread = initial_spread(cluster, method, options.usage, weights, loads)
    balance_note: tuple[str, Stop] | None = None
    if wb and start_spread < gap_threshold:
        figures: dict[str, float | str] = {
            "measure": "spread",
            "unit": "%",
            "value": start_spread * 100,
        }
        figures["threshold"] = gap_threshold * 100
        balance_note = (
            f"balancing off: initial spread {start_spread:.1%} is below the level-{balanciness} "
            f"threshold {gap_threshold:.0%}",
            Stop("below_threshold", figures),
        )
        wb = 0
    if wb and any(v is not None for v in thresholds.values()):
        exceeded, _which = thresholds_exceeded(cluster, method, thresholds, loads)
        if not exceeded:
            set_ = ", ".join(f"{k} {v:g}%" for k, v in thresholds.items() if v is not None)
            balance_note = (
                f"balancing off: no usable node exceeds a threshold ({set_})",
                Stop("no_node_over_threshold", {"thresholds": set_}),
            )
            wb = 0
    return wb, ws, start_spread, balance_note


def propose_optimal(view: CycleView, request: Request, options: OptimalOptions) -> Proposal:
    """The placement of ``view``'s cluster that minimises the objective (see the package's
    docstring), with CP-SAT, on the view's constraints (capacity on the usage it checks, the
    placements ``request`` forbids refused) and balance loads; the warm start's strategy gets
    them too. ``options``: validated already (:meth:`OptimalOptions.parse`)."""
    cluster, loads = view.cluster, view.loads
    weights = options.term_weights()
    echoed = options.echoed(weights)
    forbidden = frozenset((str(g), str(n)) for g, n in request.forbidden)
    echoed["forbidden"] = len(forbidden)
    before = cluster_imbalance(cluster, loads=loads)
    wb, ws, start_spread, balance_note = _objective_weights(cluster, options, weights, loads)

    # Built once without the forbidden placements: the warm start's strategy refuses them too.
    constraints = view.constraints
    cons = constraints_for(cluster, forbidden, constraints)
    p = build_problem(cluster, cons, loads, options.method, options.usage, weights, options.strict)
    notes = list(p.notes)
    if balance_note:
        notes.append(balance_note[0])
    echoed["solver"] = solver_report(p, wb, ws, start_spread)
    out = Outcome(cluster, loads, before, echoed, notes, options.workers, options.seed)
    if p.infeasible:
        return out.infeasible(p.infeasible)
    shortfall = capacity_shortfall(p)
    if shortfall:
        return out.infeasible(shortfall)

    # Warm start and the two reference placements (never return worse than them).
    warm = CycleView.holding(cluster, constraints=constraints, loads=loads)
    refs = References.build(p, warm, forbidden, options.hint, out, (wb, ws))
    budget = Budget(options.time_limit, options.workers, options.seed)
    return search(p, refs, out, budget, (wb, ws), balance_note)


class Optimal:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = STRATEGY
    summary = (
        "Exact placement with CP-SAT: spread, migration cost and soft rules (proxlb-solver's model)"
    )
    Options = OptimalOptions

    def propose(self, view: CycleView, request: Request, options: OptimalOptions) -> Proposal:
        return propose_optimal(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (Optimal(),)

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "STRATEGIES",
    "Optimal",
    "OptimalOptions",
    "propose_optimal",
]
