"""The strategy interface: ``propose(view, request, options) -> Proposal``.

A strategy decides a target placement for the cluster of a :class:`~opendrs.engine.view.CycleView`
(the decision's view of the cluster), asked by a
:class:`Request` (forbidden placements, the policy's batch and target) and configured by its own
typed :class:`StrategyOptions`, validated when a configuration or a command line is read. Each
move carries its reason (the metric before and after it, its cost); a proposal also carries the
predicted cluster metrics before and after.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol, Self

import numpy as np

from opendrs.engine import blas
from opendrs.engine.constraints import Constraints
from opendrs.engine.imbalance import Imbalance, summarise
from opendrs.engine.placement import PlacementState
from opendrs.engine.planner.plan import final_placement
from opendrs.engine.usage import RESOURCES, LoadModel, arch_groups
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Move, Settings
from opendrs.model.units import Share, UnitError, parse_fraction


def migration_cost(guest: Guest, settings: Settings | None = None) -> int:
    """``max(1, ⌊RAM/unit⌋) + factor·⌊local disk/unit⌋`` (proxlb-solver: 256 MiB and 4)."""
    settings = settings or Settings()
    unit = settings.cost_unit
    disk = int(settings.cost_disk_factor * (guest.local_disk_bytes // unit))
    return max(1, guest.memory // unit) + disk


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a strategy stopped, as a code and its figures (the commands word it for the operator;
    :attr:`Proposal.stopped` is the engine's own sentence). ``parts``: the stops of the parts it
    stopped in one by one (each CPU architecture's, for ``by_arch``), or the stop a later step
    cut short (for ``batch_cut``). The codes and their details are listed in :data:`STOP_CODES`.
    """

    code: str
    details: Mapping[str, float | str] = field(default_factory=dict)
    parts: tuple[Stop, ...] = ()

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"code": self.code, **self.details}
        if self.parts:
            data["parts"] = [part.as_dict() for part in self.parts]
        return data


#: Every stop code, with the details it carries (a part of ``by_arch`` has its ``arch`` too;
#: ``bound`` is there when the search was not proven optimal, ``strategy`` for the repairs
#: ``plan`` shows before the strategy's plan). ``unit``: ``%``, ``pp``
#: (percentage points) or ``""`` (a ratio) for ``value``, ``after`` and ``threshold``.
STOP_CODES: Mapping[str, tuple[str, ...]] = {
    # balance ("balanced" also gives "cpu_commit_spread" where the vCPU commitments' goal is
    # looser, and "cpu_commit_asked" and "cpu_commit_moves" where a plan leaving them no wider
    # than they started was proposed because reaching the goal asked took that many migrations;
    # "no_move_pays" the same two where moving them towards it took that many; and
    # "cpu_commit_limit" where the move limit stopped that plan there)
    "balanced": ("target_spread", "cpu_spread", "memory_spread"),
    "no_move_pays": ("margin",),
    "move_limit": ("max_moves",),
    # several strategies
    "below_threshold": ("measure", "unit", "value", "threshold"),
    "no_movable_guest": (),
    "basic_mode": (),
    # pve-bruteforce, pve-topsis
    "no_allowed_target": ("scope",),
    "gain_below_margin": ("measure", "unit", "value", "after", "margin", "guest", "target"),
    # static-greedy
    "passes_done": ("passes",),
    "pass_moved_nothing": ("pass", "keep"),
    # incus: one part per CPU architecture
    "by_arch": (),
    "no_usable_node": (),
    "too_few_nodes": ("arch",),
    "idle": ("arch", "node"),
    "no_fitting_move": ("arch", "node"),
    # drs-pressure
    "no_bad_guest": ("cpu_pressure",),
    "nothing_relieves": ("bad", "guests"),
    # proxlb-greedy
    "every_group_visited": (),
    # optimal
    "solved": ("proven", "migrations", "objective_before", "objective_after"),
    "current_best": ("proven", "objective"),
    "no_node_over_threshold": ("thresholds",),
    "no_feasible_placement": ("time_limit",),
    "infeasible": ("reasons",),
    # the policy's own proposals
    "returned": ("migrations",),
    "failover_closer": ("migrations",),
    # no move gives the failover headroom back: the HA guests and nodes of the worst failure,
    # and (its part) what keeps the moves that would give it back off
    "failover_short": ("guests", "failed"),
    "hot_level": ("nodes", "hot"),
    "no_helping_move": (),
    "day_balanced": ("metric",),
    "no_day_move_pays": (),
    "repairs_only": (),
    "batch_cut": ("kept", "proposed", "limit", "batch"),
}


@dataclass(frozen=True, slots=True)
class ProposedMove:
    """One move of a proposal, with why it was chosen."""

    guest: str
    source: str
    target: str
    #: The strategy's metric before and after this move (in proposal order).
    metric: str
    before: float
    after: float
    cost: int
    reason: str = ""

    @property
    def move(self) -> Move:
        return Move(self.guest, self.source, self.target)

    def as_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest,
            "source": self.source,
            "target": self.target,
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "cost": self.cost,
            "reason": self.reason,
        }


def bundle_moves(
    cluster: Cluster,
    members: Iterable[int],
    leader: str,
    source: str,
    target: str,
    *,
    metric: str,
    before: float,
    after: float,
    reason: str,
) -> list[ProposedMove]:
    """One move per member of a bundle (guest indices), each saying who leads it."""
    guests = cluster.guests
    return [
        ProposedMove(
            guest=guests[m].id,
            source=source,
            target=target,
            metric=metric,
            before=before,
            after=after,
            cost=migration_cost(guests[m], cluster.settings),
            reason=reason + (f" (with {leader})" if guests[m].id != leader else ""),
        )
        for m in members
    ]


@dataclass(frozen=True)
class Proposal:
    """A target placement and how it was reached."""

    strategy: str
    moves: tuple[ProposedMove, ...]
    before: Imbalance
    after: Imbalance
    #: Why the strategy stopped (threshold reached, no move improves enough, move limit, …).
    stopped: str
    notes: tuple[str, ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)
    #: ``stopped`` as a code with its figures, where the strategy gives one.
    stop: Stop | None = None

    @property
    def placement(self) -> dict[str, str]:
        """Final node of every guest the proposal moves (its last move wins)."""
        return final_placement(self.moves)

    def net_moves(self) -> tuple[Move, ...]:
        """One move per guest that ends elsewhere: from its first source to its last target."""
        first: dict[str, str] = {}
        for m in self.moves:
            first.setdefault(m.guest, m.source)
        return tuple(
            Move(guest, first[guest], target)
            for guest, target in self.placement.items()
            if target != first[guest]
        )

    @property
    def total_cost(self) -> int:
        """Cost of the net moves (a guest moved twice pays once, from where it was)."""
        last = {m.guest: m.cost for m in self.moves}
        return sum(last[m.guest] for m in self.net_moves())

    def as_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "options": dict(self.options),
            "moves": [m.as_dict() for m in self.moves],
            "migrations": len(self.net_moves()),
            "cost": self.total_cost,
            "stopped": self.stopped,
            "stop": None if self.stop is None else self.stop.as_dict(),
            "notes": list(self.notes),
            "metrics": {"before": self.before.as_dict(), "after": self.after.as_dict()},
        }


def cluster_imbalance(
    cluster: Cluster, assign: np.ndarray | None = None, loads: LoadModel | None = None
) -> Imbalance:
    """Imbalance figures of the usable nodes, for the current placement or ``assign``
    (``loads``: the cluster's :class:`LoadModel`, when it is built already)."""
    loads = loads if loads is not None else LoadModel.build(cluster)
    fractions = loads.fractions(assign)
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    settings = cluster.settings
    return summarise(fractions[usable], RESOURCES, [settings.weight_cpu, settings.weight_memory])


def constraints_for(
    cluster: Cluster,
    forbidden: Iterable[tuple[str, str]] = (),
    constraints: Constraints | None = None,
) -> Constraints:
    """The constraints a strategy holds its placements to: ``constraints`` — a cycle view's,
    capacity on the usage the view checks — with the placements ``forbidden`` refused as well;
    without them, ``cluster``'s own, built with ``forbidden`` (the same when the view checks
    ``cluster``'s usage)."""
    if constraints is None:
        return Constraints.build(cluster, forbidden)
    return constraints.forbidding(forbidden)


def usable_nodes(state: PlacementState) -> np.ndarray:
    """(N,) the nodes that may hold guests and have capacity in every resource of the state's
    balance loads: the nodes a strategy balances."""
    return state.constraints.usable & np.all(state.loads.capacity > 0, axis=1)


@dataclass(frozen=True)
class Start:
    """Where a strategy that moves guests on a :class:`PlacementState` starts, on one cycle's
    view: the observation (``cluster``), the placement ``state`` (the view's constraints with the
    request's forbidden placements refused, its balance loads or the loads given), the imbalance
    ``before`` anything moves and the constraints' problems as ``notes``. Built by :func:`start`.
    """

    cluster: Cluster
    state: PlacementState
    before: Imbalance
    notes: tuple[str, ...]

    @property
    def usable(self) -> np.ndarray:
        """(N,) the nodes a strategy balances (:func:`usable_nodes` of the state)."""
        return usable_nodes(self.state)

    def imbalance(self) -> Imbalance:
        """The imbalance of the state's placement now (after the moves committed to it)."""
        return cluster_imbalance(self.cluster, self.state.assign, self.state.loads)


def start(
    view: CycleView, forbidden: Iterable[tuple[str, str]] = (), loads: LoadModel | None = None
) -> Start:
    """The preamble of a strategy's run on ``view``: its constraints with the placements
    ``forbidden`` refused as well, a :class:`PlacementState` on them and on ``loads`` (default:
    the view's balance loads), the imbalance before and the constraints' problems."""
    cons = view.constraints.forbidding(forbidden)
    loads = view.loads if loads is None else loads
    state = PlacementState.build(view.observed, cons, loads=loads)
    before = cluster_imbalance(view.observed, loads=loads)
    return Start(view.observed, state, before, tuple(str(p) for p in cons.problems))


def imbalance_by_arch(cluster: Cluster, assign: np.ndarray | None = None) -> dict[str, Imbalance]:
    """Imbalance figures of each CPU architecture's usable nodes — empty when the usable nodes
    share one: guests cannot move between architectures, so each is balanced on its own."""
    usable = np.array([n.usable for n in cluster.nodes], dtype=bool)
    arches, group = arch_groups(cluster, usable)
    if len(arches) < 2:
        return {}
    fractions = LoadModel.build(cluster).fractions(assign)
    weights = [cluster.settings.weight_cpu, cluster.settings.weight_memory]
    return {
        arch: summarise(fractions[group == g], RESOURCES, weights) for g, arch in enumerate(arches)
    }


def worst_spreads(overall: Imbalance, by_arch: Mapping[str, Imbalance]) -> dict[str, float]:
    """Per resource (and ``combined``), the largest spread of any architecture group — the
    overall spread when the usable nodes share one architecture."""
    groups = list(by_arch.values()) or [overall]
    out = {r: max(g.resources[r].spread for g in groups) for r in overall.resources}
    out["combined"] = max(g.combined.spread for g in groups)
    return out


@dataclass(frozen=True)
class Request:
    """What the caller asks of a strategy for one decision, beside its options.

    ``forbidden``: (guest, node) placements that must not be chosen; ``max_moves``: most
    migrations (the policy's batch; None: the strategy's own limit); ``target_spread``: the spread
    to balance to (the policy's target; None: the strategy's own); ``now`` and
    ``cooldown_until``: the time and each guest's cooldown end, for a strategy that keeps its own
    cooldown. A strategy reads what it means and ignores the rest.
    """

    forbidden: frozenset[tuple[str, str]] = frozenset()
    max_moves: int | None = None
    target_spread: float | None = None
    now: float | None = None
    cooldown_until: Mapping[str, float] | None = None


_NO_OPTIONS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StrategyOptions:
    """A strategy's options: a frozen dataclass whose fields, with their defaults, are the
    options (``opendrs plan -o NAME=VALUE``, a policy's ``options``).

    :meth:`parse` reads them from a mapping — names, types and the strategy's own checks
    (:meth:`check`) — with one-line errors naming the strategy and the option. ``given`` lists
    the options set explicitly: they win over what the :class:`Request` asks for.
    """

    given: frozenset[str] = field(default=_NO_OPTIONS, repr=False, compare=False)
    #: The options that are shares of a whole: written as a fraction (``0.15``) or a percentage
    #: (``"15%"``); a bare number above 1 is refused with the percentage it probably meant.
    fractions: ClassVar[frozenset[str]] = frozenset()
    #: The options counted in percent (``20`` is 20 %), which take ``"20%"`` as well.
    percents: ClassVar[frozenset[str]] = frozenset()

    def check(self) -> None:
        """Raise ValueError (``"NAME: …"``) for a value the strategy refuses."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options, in their declared order."""
        return tuple(f.name for f in fields(cls) if f.name != "given")

    @classmethod
    def defaults(cls) -> dict[str, object]:
        """Each option's default value."""
        return {f.name: getattr(cls(), f.name) for f in fields(cls) if f.name != "given"}

    @classmethod
    def parse(cls, strategy: str, given: Mapping[str, object]) -> Self:
        """The options in ``given`` (the others at their defaults); ValueError naming the
        strategy and the option for an unknown name, a value of the wrong type, or one the
        strategy refuses."""
        defaults = cls.defaults()
        values: dict[str, object] = {}
        for name, value in given.items():
            if name not in defaults:
                known = ", ".join(sorted(defaults))
                raise ValueError(f"strategy {strategy} has no option {name!r} (options: {known})")
            values[name] = _typed(strategy, cls, name, value)
        options = cls(given=frozenset(values), **values)
        try:
            options.check()
        except ValueError as exc:
            raise ValueError(f"strategy {strategy}: {exc}") from None
        return options

    def values(self) -> dict[str, object]:
        """Each option's value, by name."""
        return {name: getattr(self, name) for name in self.names()}

    def pick(self, name: str, asked: object) -> Any:
        """Option ``name`` when set explicitly, else ``asked`` (the request's), when given."""
        if name in self.given or asked is None:
            return getattr(self, name)
        return asked


#: The largest whole number and the largest number a strategy option may take.
MAX_OPTION_INT = 2**31 - 1
MAX_OPTION_NUMBER = 1e15


def typed_option(value: object, default: object, shown: str | None = None) -> object:
    """``value`` checked against the type of the option's ``default`` — true or false, a whole
    number, a number (returned as a float), text — and any number against the largest an option
    may take. ValueError with the reason, the value written as ``shown`` (default: its repr).
    The one check behind a policy's ``options``, ``opendrs plan -o`` and
    :meth:`StrategyOptions.parse`."""
    got = repr(value) if shown is None else shown
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {got}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number, got {got}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {got}")
        value = float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ValueError(f"expected text, got {got}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {got}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        largest = str(MAX_OPTION_INT) if isinstance(value, int) else f"{MAX_OPTION_NUMBER:g}"
        if value > float(largest):
            raise ValueError(f"must be at most {largest}, got {got}")
        if value < -float(largest):
            raise ValueError(f"must be at least -{largest}, got {got}")
    return value


#: The largest share an option may be written as, as a percentage (10000 %): a strategy's own
#: check says what is too much for it (a normalised imbalance is at most 1).
_LARGEST_SHARE = 100.0


def option_value(
    options: type[StrategyOptions], name: str, value: object, shown: str | None = None
) -> object:
    """``value`` of option ``name`` of ``options``: a share read as a fraction (``"15%"``:
    0.15; a bare number above 1 refused, a percentage up to 10000 %), a percentage's ``%``
    dropped (``"20%"``: 20), then checked by :func:`typed_option` against the type of the
    option's default. ValueError with the reason. What a policy's ``options``, ``opendrs plan
    -O`` and :meth:`StrategyOptions.parse` read an option with."""
    if name in options.fractions and value is not None:
        try:
            value = parse_fraction(value, _LARGEST_SHARE)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
    elif name in options.percents and isinstance(value, str) and value.strip().endswith("%"):
        try:
            value = float(value.strip()[:-1])
        except ValueError:
            raise ValueError(f"cannot read {value!r} as a percentage (example: 20%)") from None
    typed = typed_option(value, options.defaults()[name], shown)
    # A share stays one once read: the strategy reads the options again and takes it as it is.
    return Share(typed) if isinstance(value, Share) and isinstance(typed, float) else typed


def _typed(strategy: str, options: type[StrategyOptions], name: str, value: object) -> object:
    try:
        return option_value(options, name, value)
    except ValueError as exc:
        raise ValueError(f"strategy {strategy} option {name}: {exc}") from None


class Strategy(Protocol):
    """A rebalancing strategy, as the registry (:mod:`.registry`) lists it.

    ``name`` is what a policy's ``strategy`` and ``opendrs plan --strategy`` say, ``summary`` one
    line about it, ``Options`` its typed options (a :class:`StrategyOptions`), and
    :meth:`propose` decides a target placement for the decision's view, asked by ``request``
    and configured by ``options`` (an instance of ``Options``, already validated).
    """

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...

    @property
    def Options(self) -> type[StrategyOptions]: ...

    def propose(self, view: CycleView, request: Request, options: Any) -> Proposal: ...


@dataclass(frozen=True)
class StrategyInfo:
    """A registered strategy, with the conveniences callers share: a bare cluster makes its own
    view, options given as a mapping are parsed first, and BLAS runs on one thread."""

    strategy: Strategy

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def summary(self) -> str:
        return self.strategy.summary

    @property
    def options(self) -> type[StrategyOptions]:
        return self.strategy.Options

    def propose(
        self,
        view: CycleView | Cluster,
        request: Request | None = None,
        options: StrategyOptions | Mapping[str, object] | None = None,
    ) -> Proposal:
        """Ask the strategy about ``view`` (a bare cluster makes its own view): ``options``
        typed, or a mapping parsed first (ValueError naming the strategy and the option)."""
        if isinstance(view, Cluster):
            view = CycleView(view)
        if options is None or isinstance(options, Mapping):
            options = self.options.parse(self.name, options or {})
        with blas.one_thread():
            return self.strategy.propose(view, request or Request(), options)
