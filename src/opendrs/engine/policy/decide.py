""":func:`decide`: whether to act on one observation, as a short sequence of guards — busy,
repair, back from maintenance, threshold, hold, migration budget, then the strategy's plan and the
margin — each returning a :class:`Decision` or passing to the next."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from opendrs.engine.constraints import RuleCheck, movability
from opendrs.engine.planner import Plan, final_placement, plan_moves
from opendrs.engine.policy.config import PolicyConfig, most_moves, strategy_request
from opendrs.engine.policy.dayplan import day_proposal
from opendrs.engine.policy.decision import (
    Balanced,
    BelowMargin,
    BudgetSpent,
    Busy,
    Closed,
    Decision,
    DecisionCode,
    Facts,
    FailoverLost,
    FailoverShort,
    Holding,
    HotUnmovable,
    InBlackout,
    Measurement,
    NoProposal,
    OutsideWindow,
    OverBudget,
    Planned,
    RepairBlocked,
    Repaired,
    RepairNote,
    Returned,
    Stranded,
    Trigger,
    Unordered,
)
from opendrs.engine.policy.failover import (
    REPAIR_RETRY,
    check_failover,
    failover_after,
    failover_blocked,
    failover_repair,
    recovery_for,
)
from opendrs.engine.policy.guards import failed_targets, forbidden_placements, hot_targets
from opendrs.engine.policy.maintenance import (
    planned_proposal,
    returns_from_maintenance,
    track_evacuations,
)
from opendrs.engine.policy.metrics import measure, measure_by_arch
from opendrs.engine.policy.needs import FailoverNeeded, GoingBack, Need, TowardFailover
from opendrs.engine.policy.planning import plan_within, truncate
from opendrs.engine.policy.profile import day_metric, worst_hour
from opendrs.engine.policy.repair import (
    Repair,
    left_in_maintenance,
    may_need_repair,
    only_hot,
    repair_activity,
    repair_kept_off,
    repair_within_guards,
)
from opendrs.engine.policy.smoothing import hot_nodes, overloads, with_last
from opendrs.engine.policy.spending import Hastening, react
from opendrs.engine.policy.state import (
    FailoverCheck,
    PastMigrations,
    PolicyState,
    budget_allowance,
    budget_window,
)
from opendrs.engine.policy.trend import with_margin
from opendrs.engine.policy.why import why_not
from opendrs.engine.strategies import get_strategy
from opendrs.engine.strategies.base import Proposal, Stop
from opendrs.engine.strategies.exact_repair import repair_deadline
from opendrs.engine.usage import MeasuredUsage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest


def decide(
    cluster: Cluster,
    now: float,
    config: PolicyConfig,
    state: PolicyState,
    past: PastMigrations,
    *,
    busy: bool,
    average: MeasuredUsage | None = None,
    recent: MeasuredUsage | None = None,
    latest: MeasuredUsage | None = None,
    daily: Sequence[MeasuredUsage] | None = None,
    rule_check: RuleCheck | None = None,
) -> Decision:
    """Whether to act on ``cluster`` at ``now``, and with which plan (see the package docstring).

    ``cluster`` is the observation to decide on; ``busy`` says that a plan is still executing.
    ``average``, when given, is the usage balancing decides on (:meth:`UsageWindow.average`):
    the metric and the strategy see it. ``recent``, when given, is the usage capacity is checked
    on (:meth:`UsageWindow.recent`, over the hold: :func:`overload_span`): repairs are found and
    made with it, and every plan is ordered against it. Without them the cluster's own usage
    stands. ``latest``, when given, is the plain mean over the hold (:meth:`UsageWindow.latest`):
    with a migration budget whose spending is on (``policy.spend_budget``), what its unspent part
    moves balancing towards (:func:`react`; the hold shrinks alike). ``daily``, when given, is the
    usage of each hour of the day (:meth:`DailyProfile.hours`, ``policy.daily_profile``):
    balancing then decides on the hour the placement balances worst, and a plan is predicted on
    every hour. ``rule_check``, when given, is :func:`~opendrs.engine.constraints.check_rules` of
    ``cluster``, made already by the caller: the rules are checked once per decision. Pure and
    deterministic. Raises ValueError for a usage made for another cluster (the strategy's options
    were checked when ``config`` was made).
    """
    usages = (average, recent, latest)
    round_ = _observe(cluster, now, config, state, past, usages, busy, daily, rule_check)
    decision = _busy(round_)
    if decision is not None:
        return decision
    with repair_deadline():  # every exact repair of the decision shares one deadline
        return _decide_guarded(round_.guarded())


def _decide_guarded(round_: _Round) -> Decision:
    """The decision of a round the policy's guards were applied to (:func:`decide`'s steps after
    the busy check)."""
    found = _repair(round_)
    if isinstance(found, Decision):
        return found
    round_ = replace(round_, stuck=found[0], note=found[1])
    decision = _back_from_maintenance(round_)
    if decision is not None:
        return decision
    round_, decision = _failover(round_)
    if decision is not None:
        return decision
    decision = _balanced(round_)
    if decision is not None:
        return decision
    trigger = round_.trigger()
    for held in (_outside_window, _holding, _budget):
        decision = held(round_, trigger)
        if decision is not None:
            return decision
    return _balance(round_, trigger)


@dataclass(frozen=True)
class _Budget:
    """The migration budget at the decision: its rolling ``window`` (seconds), how many budgeted
    migrations it ``allowed``, when those ``spent`` within it started (oldest first), and how
    many more may start (``left``; None: no budget)."""

    window: int
    allowed: int
    spent: tuple[float, ...]
    left: int | None

    @classmethod
    def count(cls, config: PolicyConfig, past: PastMigrations, now: float) -> _Budget:
        budget, window = config.max_migrations_per_day, config.migration_budget_window
        seconds = budget_window(budget or 0, window)
        allowed = budget_allowance(budget or 0, window)
        spent = tuple(sorted(t for t in past.budget_spent if now - t < seconds))
        left = None if budget is None else max(allowed - len(spent), 0)
        return cls(seconds, allowed, spent, left)

    def stops(self, moves: int) -> bool:
        """Whether a plan of ``moves`` migrations is more than the budget leaves."""
        return self.left is not None and moves > self.left

    def facts(self, now: float, needed: int | None = None) -> BudgetSpent:
        """Why the budget stops a plan of ``needed`` migrations (None: it is all spent)."""
        frees = max(self.spent[0] + self.window - now, 1.0) if self.spent else None
        return BudgetSpent(
            len(self.spent), self.allowed, self.window, self.left or 0, needed, frees
        )


@dataclass(frozen=True)
class _Round:
    """One decision in the making: its inputs, the cycle's view, the metric measured on it, and
    — past the repair guard — what the repair leaves stuck and the note every later decision
    carries."""

    now: float
    past: PastMigrations
    recent: MeasuredUsage | None
    busy: bool
    #: The usage of each hour of the day (None: balance on the average).
    daily: Sequence[MeasuredUsage] | None
    #: The policy as the budget left lets it react (unchanged without a budget).
    config: PolicyConfig
    view: CycleView
    budget: _Budget
    hastened: Hastening | None
    measured: Measurement
    state: PolicyState
    #: The nodes (indexes) above the hot level on the usage capacity is checked on (the recent
    #: usage, else the average, else the observation's): found once, when the round is made.
    running_hot: tuple[int, ...] = ()
    stuck: tuple[tuple[str, str], ...] = ()
    note: RepairNote = field(default_factory=RepairNote)

    @property
    def cluster(self) -> Cluster:
        """The observation: placement, rules and settings (its usage is read from the view's
        models, never from it)."""
        return self.view.observed

    @property
    def metric(self) -> float:
        return max((v for _arch, v in self.measured.by_arch), default=0.0)

    def guarded(self) -> _Round:
        """From here on the decision may plan: the guards' forbidden placements — and no guest
        onto a node seen running hot lately (:func:`hot_targets`, :func:`hot_memory`) —, and
        capacity checked on the recent usage."""
        forbidden = forbidden_placements(self.cluster, self.now, self.config, self.past)
        forbidden |= hot_targets(self.cluster, self.state.hot_seen)
        return replace(self, view=self.view.guarding(self.recent, forbidden))

    def trigger(self) -> Trigger:
        """Where the threshold and the hold stand, counting this observation."""
        config = self.config
        need = max(config.hold, 1)
        count = min(self.state.hold + 1, need)
        return Trigger(self.measured, config.threshold, count, need, config.strategy, self.hastened)

    def attempted(self) -> PolicyState:
        return replace(self.state, hold=0, last_attempt=self.now)

    def acted(self) -> PolicyState:
        return replace(self.attempted(), last_action=self.now)

    def predicted(self, plan: Plan) -> float:
        """The metric once ``plan`` has run (its guests are not migrating now: they may move)."""
        assign = self.view.assign.copy()
        guests, nodes = self.cluster.guest_index, self.cluster.node_index
        for guest, target in final_placement(plan.moves).items():
            assign[guests[guest]] = nodes[target]
        if self.daily:
            return day_metric(self.cluster, self.config.metric, self.view.loads, self.daily, assign)
        return measure(self.cluster, self.config.metric, self.view.loads, assign)

    def decision(
        self,
        facts: Facts,
        state: PolicyState,
        *,
        predicted: float | None = None,
        proposal: Proposal | None = None,
        plan: Plan | None = None,
        forbidden: frozenset[tuple[str, str]] | None = None,
        budgeted: bool = False,
        activity: str | None = None,
    ) -> Decision:
        if facts.code is DecisionCode.PLAN:
            activity = "balance"
        elif facts.code is DecisionCode.RETURN:
            activity = "return"
        return Decision(
            facts,
            self.metric,
            predicted,
            proposal,
            plan,
            self.view.forbidden if forbidden is None else forbidden,
            state,
            self.stuck,
            budgeted or facts.code is DecisionCode.PLAN,
            self.note,
            activity if facts.code.acts else None,
        )

    def closed(
        self, activity: str, needed: Need | None = None, trigger: Trigger | None = None
    ) -> Closed | None:
        """Why ``activity`` may start no migration now (``policy.windows``, ``blackouts``), or
        None when it may."""
        schedule = self.config.schedule
        if schedule is None or schedule.empty:
            return None
        blackout = schedule.blackout_at(self.now, activity)
        if blackout is None and not schedule.outside_windows(self.now, activity):
            return None
        kind = OutsideWindow if blackout is None else InBlackout
        return kind(
            activity,
            tuple(w.text for w in schedule.windows),
            None if blackout is None else blackout.text,
            schedule.timezone,
            self.now,
            schedule.next_open(self.now, activity),
            needed,
            trigger,
        )


def _observe(
    cluster: Cluster,
    now: float,
    config: PolicyConfig,
    state: PolicyState,
    past: PastMigrations,
    usages: tuple[MeasuredUsage | None, MeasuredUsage | None, MeasuredUsage | None],
    busy: bool,
    daily: Sequence[MeasuredUsage] | None,
    rule_check: RuleCheck | None = None,
) -> _Round:
    """The round's inputs, its view (on the hour the placement balances worst, with a daily
    profile) and the metric measured on it."""
    average, recent, latest = usages
    if config.hot is not None and recent is not None:
        recent = with_last(recent, cluster)
    budget = _Budget.count(config, past, now)
    reaction = react(config, budget.left, average, latest)
    config = reaction.config
    view = CycleView(cluster, reaction.average, hot=config.hot).with_rule_check(rule_check)
    hour = None
    if daily:
        hour = worst_hour(cluster, config.metric, view.loads, daily)
        view = CycleView(cluster, daily[hour], hot=config.hot).with_rule_check(rule_check)
    by_arch = measure_by_arch(cluster, config.metric, view.loads)
    measured = Measurement(config.metric, tuple(by_arch.items()), hour)
    tracked = track_evacuations(cluster, state.evacuated) if config.maintenance_return else {}
    state = state if tracked == state.evacuated else replace(state, evacuated=tracked)
    running_hot = _running_hot(config, view, recent)
    state = _seen_hot(state, now, config, view.observed, running_hot)
    return _Round(
        now,
        past,
        recent,
        busy,
        daily,
        config,
        view,
        budget,
        reaction.hastened,
        measured,
        state,
        running_hot,
    )


def _running_hot(
    config: PolicyConfig, view: CycleView, recent: MeasuredUsage | None
) -> tuple[int, ...]:
    """The nodes (indexes) above the hot level on ``recent``, else on the usage balancing reads
    — the usage the guarded view checks capacity on —; none without a hot level."""
    if config.hot is None:
        return ()
    usage = recent if recent is not None else view.balancing_usage
    return hot_nodes(view.usage_loads, usage, config.hot)


def _seen_hot(
    state: PolicyState,
    now: float,
    config: PolicyConfig,
    cluster: Cluster,
    running_hot: tuple[int, ...],
) -> PolicyState:
    """``state`` with the nodes seen running hot within :func:`hot_memory`, those ``running_hot``
    now included (:attr:`PolicyState.hot_seen`)."""
    if config.hot is None:
        return state
    seen = {n: t for n, t in state.hot_seen.items() if now - t < hot_memory(config)}
    for n in running_hot:
        seen[cluster.nodes[n].name] = now
    return state if seen == dict(state.hot_seen) else replace(state, hot_seen=seen)


def hot_memory(config: PolicyConfig) -> int:
    """How long, in seconds, a node seen running hot stays no target of any plan but a relief
    that has no other (:func:`_last_resort_relief`): the
    ``smoothing`` window or the ``no_return`` window, whichever is longer — a node relieved of
    a turn is not refilled on the average of its turns before a day has shown it cool."""
    return max(config.smoothing, config.no_return)


def _busy(r: _Round) -> Decision | None:
    """While a plan executes — or, with ``wait_for_motions``, while any guest moves — nothing is
    decided, and the hold count stands still."""
    moving = moving_guest(r.cluster) if r.config.wait_for_motions else None
    if not r.busy and moving is None:
        return None
    measured = None if r.config.metric == "none" else r.measured
    return r.decision(Busy(None if r.busy else moving, measured), r.state)


def moving_guest(cluster: Cluster) -> str | None:
    """The first guest (by id) that is moving — a migration in progress, or an HA migrate or
    relocate under way — as the operator reads it; None when none is."""
    moving = [g for g in cluster.guests if g.migrating_to is not None or g.ha_state in _HA_MOTIONS]
    return min(moving, key=lambda g: g.id).label if moving else None


#: The HA states of a guest being moved (``Manager.pm``: ``migrate``, ``relocate``).
_HA_MOTIONS = frozenset({"migrate", "relocate"})


def _repair(r: _Round) -> Decision | tuple[tuple[tuple[str, str], ...], RepairNote]:
    """What breaks a hard constraint is repaired at once, bypassing threshold, hold and margin;
    so is a node whose recent measured load — the last observation's, when higher — is above
    the hot level (``config.hot``), at once, bypassing hold and margin, never onto a node seen
    running hot lately (:func:`hot_memory`: where loads take turns, each turn's relief goes to
    a node that stays cool, so none is undone, and no plan refills a relieved node) unless no
    other relief can be made (:func:`_last_resort_relief`). Without
    a repair made: what every later decision names — the guests stuck, and the repair that
    could not be made."""
    view, config = r.view, r.config
    limit = 1.0 if config.hot is None else config.hot
    screen = may_need_repair(r.cluster, view.usage_loads, config.hot) or (
        r.recent is not None and overloads(view.usage_loads, r.recent, limit)
    )
    if not screen:
        return (), RepairNote()
    # Guests left on a node in maintenance that may not move: named whatever comes next.
    left = left_in_maintenance(r.cluster)
    stranded = _stranded(r.cluster, left)
    hot_only = only_hot(r.cluster, view.constraints)
    failed = failed_targets(r.cluster, r.now, r.past)
    returns = _no_return(r)
    made, kept_off = repair_within_guards(
        view.checked, view.constraints, config, view.forbidden, failed, returns
    )
    needed = made.needed
    if config.hot is not None and hot_only and needed:
        made, kept_off = _deeper_relief(view, config, (made, kept_off))
        if made.stuck:
            made, kept_off = _last_resort_relief(r, failed, (made, kept_off))
    plan = made.plan
    unmovable = _hot_unmovable(r)
    if not needed or made.proposal is None or plan is None:
        return made.stuck, RepairNote(stranded, unmovable=unmovable)
    if not plan.moves:
        blocked = RepairBlocked(needed[0], len(needed) - 1)
        return made.stuck, RepairNote(stranded, blocked, unmovable=unmovable)
    if hot_only and r.budget.stops(len(plan.moves)):
        budget = r.budget.facts(r.now, len(plan.moves))
        blocked = RepairBlocked(needed[0], len(needed) - 1, budget)
        return made.stuck, RepairNote(stranded, blocked, unmovable=unmovable)
    activity = "balance" if hot_only else repair_activity(r.cluster, view.constraints)
    made_round = replace(r, stuck=made.stuck, note=RepairNote())
    closed = r.closed(activity, needed=needed[0])
    if closed is not None:
        return made_round.decision(closed, r.state, proposal=made.proposal, plan=plan)
    facts = Repaired(
        needed[0],
        len(needed) - 1,
        len(plan.moves),
        hot_only,
        _in_cooldown(r, plan) if hot_only else kept_off != view.forbidden,
        # On the moves decided (the batch's), a parking move to a spare not a return.
        no_return_kept=not {(m.guest, m.target) for m in plan.moves if not m.parking} & returns,
        # A relief goes there only as its last resort (:func:`_last_resort_relief`).
        onto_hot=_onto_hot(r, plan) if hot_only else (),
    )
    return made_round.decision(
        facts,
        r.acted(),
        activity=activity,
        predicted=r.predicted(plan),
        proposal=made.proposal,
        plan=plan,
        forbidden=kept_off,
        budgeted=hot_only,
    )


def _onto_hot(r: _Round, plan: Plan) -> tuple[str, ...]:
    """The nodes seen running hot lately that ``plan`` moves guests to, by name."""
    return tuple(sorted({m.target for m in plan.moves} & set(r.state.hot_seen)))


def _in_cooldown(r: _Round, plan: Plan) -> bool:
    """Whether ``plan`` moves a guest still in its cooldown (a relief's last resort may)."""
    cooling = r.past.cooldown_until
    return any(cooling.get(m.guest, r.now) > r.now for m in plan.moves)


def _hot_unmovable(r: _Round) -> HotUnmovable | None:
    """The nodes running hot (:attr:`_Round.running_hot`) with no guest on them that may move —
    none free to (ignored, locked, …: :func:`movability`) or let by the hard rules
    (:meth:`Constraints.kept_in_place`: pinned, held by a strict node affinity to that node) —
    so that no relief reaches them: a pinned job's node, with an ignored guest the HA manager
    restarted there. Said by every decision while they run hot; None when there are none (or
    no hot level)."""
    hot = r.config.hot
    if hot is None or not r.running_hot:
        return None
    cluster, constraints = r.cluster, r.view.constraints
    index = cluster.guest_index

    def may_move(guest: Guest) -> bool:
        return movability(guest, cluster, "balance") is None and not constraints.kept_in_place(
            index[guest.id]
        )

    nodes = tuple(
        node.name
        for node in (cluster.nodes[n] for n in r.running_hot)
        if not any(may_move(g) for g in cluster.guests_on(node.name))
    )
    return HotUnmovable(nodes, hot) if nodes else None


#: How far under the hot level a relief brings a node when it can: a load still rising is not
#: hot again at the next observation.
RELIEF_MARGIN = 0.1
#: The margins a relief tries, deepest first: a node whose unmovable guests keep it above one
#: is brought under the next (a pinned job near the hot level relieved of all it can be).
RELIEF_MARGINS = (RELIEF_MARGIN, RELIEF_MARGIN / 2, RELIEF_MARGIN / 4)


def _last_resort_relief(
    r: _Round,
    failed: frozenset[tuple[str, str]],
    made: tuple[Repair, frozenset[tuple[str, str]]],
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """The relief of nodes that only run hot with the guards lifted in turn, each step taken
    only when it leaves fewer guests stuck than the one before: first the cooldown (a guest a
    plan has just moved onto a node whose load then rises may leave it again), then the memory
    of nodes seen running hot, with the cooldown kept and then lifted too (on a busy day whose
    every node with room ran hot an hour ago, a hot node is relieved onto one of them rather
    than left hot for the day; the relief keeps each target under the hot level, its forecast
    included). Where lifting the cooldown is enough, no guest goes to a node seen running hot —
    where loads take turns, that node is the next to run hot. The other guards hold — no
    return to a node a guest left, the minimum uptime, the failed targets —, so no guest goes
    back and forth."""
    past = replace(r.past, cooldown_until={})
    cooled = forbidden_placements(r.cluster, r.now, r.config, past)
    guarded = forbidden_placements(r.cluster, r.now, r.config, r.past)
    hot = hot_targets(r.cluster, r.state.hot_seen)
    tried = {r.view.forbidden, made[1]}
    for lifted in (cooled | hot, guarded, cooled):
        if made[0].stuck and lifted not in tried:
            tried.add(lifted)
            made = _relief_within(r, failed, made, lifted)
    return made


def _relief_within(
    r: _Round,
    failed: frozenset[tuple[str, str]],
    made: tuple[Repair, frozenset[tuple[str, str]]],
    lifted: frozenset[tuple[str, str]],
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """The relief kept off only ``lifted`` (and ``failed``), when it leaves fewer guests stuck
    than ``made``; else ``made``."""
    view, config = r.view, r.config
    found = repair_within_guards(view.checked, view.constraints, config, lifted, failed)
    if found[0].needed:
        found = _deeper_relief(view, config, found, lifted)
    plan = found[0].plan
    if plan is None or not plan.moves or len(found[0].stuck) >= len(made[0].stuck):
        return made
    return found


def _no_return(r: _Round) -> frozenset[tuple[str, str]]:
    """The placements the no-return alone rules out: each guest onto a node it left within
    ``no_return``."""
    no_cooldown = replace(r.past, cooldown_until={}, avoid={})
    return forbidden_placements(r.cluster, r.now, replace(r.config, min_uptime=0), no_cooldown)


def _deeper_relief(
    view: CycleView,
    config: PolicyConfig,
    made: tuple[Repair, frozenset[tuple[str, str]]],
    forbidden: frozenset[tuple[str, str]] | None = None,
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """The relief of nodes that only run hot, made as far under the hot level as it goes, up to
    :data:`RELIEF_MARGIN` — each margin of :data:`RELIEF_MARGINS` tried in turn, the nodes
    running hot brought that far under the hot level, the targets under the hot level — with
    the first that is a plan leaving no more guests stuck than ``made``, the relief to the hot
    level, and bringing every node it takes guests from under its margin (a node whose
    unmovable guests alone load it more would be emptied for nothing); else ``made``.
    ``forbidden``: the placements kept off (None: the view's)."""
    assert config.hot is not None
    kept_off = view.forbidden if forbidden is None else forbidden
    usage = view.checked_usage or MeasuredUsage.of(view.observed)
    running_hot = hot_nodes(view.usage_loads, usage, config.hot)
    for share in RELIEF_MARGINS:
        level = max(config.hot - share, 0.0)
        margin = with_margin(usage, view.observed, running_hot, config.hot - level)
        deeper = CycleView(view.observed, view.average, margin, kept_off, config.hot)
        # The guards kept, never lifted: the nodes checked past their capacity are not broken.
        found = (repair_kept_off(deeper.checked, deeper.constraints, config, kept_off), kept_off)
        plan = found[0].plan
        if plan is None or not plan.moves or len(found[0].stuck) > len(made[0].stuck):
            continue
        assign = view.assign.copy()
        guests, nodes = view.observed.guest_index, view.observed.node_index
        for guest, target in final_placement(plan.moves).items():
            assign[guests[guest]] = nodes[target]
        sources = {nodes[m.source] for m in plan.moves}
        if not sources & set(hot_nodes(view.usage_loads, usage, level, assign)):
            return found
    return made


def _stranded(cluster: Cluster, left: tuple[tuple[str, str], ...]) -> Stranded | None:
    """The guests ``left`` on nodes in maintenance (each a WARNING), and those nodes."""
    if not left:
        return None
    guests, index = cluster.guests, cluster.guest_index
    return Stranded(len(left), tuple(sorted({guests[index[g]].node for g, _why in left})))


def _back_from_maintenance(r: _Round) -> Decision | None:
    """Guests evacuated for maintenance go back at once when their node leaves it."""
    if not (r.config.maintenance_return and r.state.evacuated):
        return None
    back = returns_from_maintenance(r.view, r.state.evacuated, r.now, r.config, r.past, r.metric)
    if back is None:
        return None
    proposal, plan, predicted = back
    nodes = tuple(sorted({m.target for m in plan.moves}))
    closed = r.closed("return", needed=GoingBack(len(plan.moves), nodes))
    if closed is not None:
        return r.decision(closed, r.state, proposal=proposal, plan=plan)
    return r.decision(
        Returned(len(plan.moves), nodes, proposal.stop),
        r.acted(),
        predicted=predicted,
        proposal=proposal,
        plan=plan,
    )


def _failover(r: _Round) -> tuple[_Round, Decision | None]:
    """With ``keep_failover``, the failover headroom checked (kept in the state), and a cluster
    short of it repaired toward it where moves give some back (bypassing threshold, hold and
    margin, within the guards and balancing's windows; not counted against the budget). After
    a repair that found nothing, none is tried for :data:`REPAIR_RETRY` seconds."""
    failures = r.config.keep_failover
    if failures <= 0:
        return r, None
    recovery = recovery_for(r.config.failover_recovery, r.cluster)
    check = check_failover(r.cluster, failures, r.now, r.state.failover, recovery)
    r = replace(r, state=replace(r.state, failover=check))
    if check is None or check.shortfall == (0, 0):
        return r, None
    if check.repair_tried is not None and r.now - check.repair_tried < REPAIR_RETRY:
        return _failover_short(r, check), None
    found = failover_repair(r.view, failures, r.now, r.config.batch, recovery)
    plan = None if found is None else _failover_plan(r, found[0])
    reached = None if plan is None else failover_after(r.cluster, plan, failures, r.now, recovery)
    if plan is None or reached is None or reached.shortfall >= check.shortfall:
        # Only a search that found no move says what keeps the moves off; moves found but not
        # ordered safely, or not bringing it closer, are none that help.
        blocked = failover_blocked(r.view, failures, r.now, recovery, lifted=found is None)
        tried = replace(check, repair_tried=r.now, repair_blocked=blocked)
        return _failover_short(replace(r, state=replace(r.state, failover=tried)), tried), None
    said = ("failover", "failover headroom", "closer to the failover headroom")
    stop = Stop("failover_closer", {"migrations": len(plan.moves)})
    proposal, predicted = planned_proposal(r.view, plan, r.config.metric, r.metric, said, stop)
    # Not urgent as a broken rule is: it starts within balancing's windows.
    closed = r.closed("balance", needed=TowardFailover(len(plan.moves)))
    if closed is not None:
        return r, r.decision(closed, r.state, proposal=proposal, plan=plan)
    facts = Repaired(FailoverNeeded(check.summary), 0, len(plan.moves), False, False, proposal.stop)
    decision = r.decision(
        facts, r.acted(), predicted=predicted, proposal=proposal, plan=plan, activity="balance"
    )
    return r, decision


def _failover_short(r: _Round, check: FailoverCheck) -> _Round:
    """The round whose every later decision says the headroom is short and why no move gives
    it back (when the repair that found none said why)."""
    if check.repair_blocked is None:
        return r
    short = FailoverShort(check.summary, check.repair_blocked)
    return replace(r, note=replace(r.note, failover=short))


def _failover_plan(r: _Round, targets: dict[str, str]) -> Plan | None:
    """The repair's ``targets`` ordered by the planner, off the guards' placements."""
    plan = plan_moves(
        r.cluster,
        targets,
        max_parallel=r.config.max_parallel,
        max_node_inflow=r.config.max_node_inflow,
        constraints=r.view.constraints.forbidding(r.view.forbidden),
    )
    return plan if plan.moves else None


def _kept_failover(
    r: _Round, trigger: Trigger, plan: Plan, proposal: Proposal, predicted: float | None
) -> Decision | None:
    """With ``keep_failover``, a balancing plan that would take the cluster further from the
    failover headroom is refused."""
    before = r.state.failover
    if r.config.keep_failover <= 0 or before is None:
        return None
    recovery = recovery_for(r.config.failover_recovery, r.cluster)
    after = failover_after(r.cluster, plan, r.config.keep_failover, r.now, recovery)
    if after.shortfall <= before.shortfall:
        return None
    facts = FailoverLost(trigger, len(plan.moves), before.summary, after.summary)
    return r.decision(facts, r.attempted(), predicted=predicted, proposal=proposal, plan=plan)


def _balanced(r: _Round) -> Decision | None:
    """Nothing happens while the metric is at or below the threshold."""
    config = r.config
    if config.metric == "none" or r.metric > config.threshold:
        return None
    return r.decision(Balanced(r.measured, config.threshold), replace(r.state, hold=0))


def _outside_window(r: _Round, trigger: Trigger) -> Decision | None:
    """Outside the migration windows, or in a blackout, balancing is not asked for: the hold
    counts on (reached, it stays reached), so that a lasting imbalance is acted on when the
    window opens."""
    closed = r.closed("balance", trigger=trigger)
    if closed is None:
        return None
    return r.decision(closed, replace(r.state, hold=min(r.state.hold + 1, trigger.need)))


def _holding(r: _Round, trigger: Trigger) -> Decision | None:
    """The metric must stay above the threshold for the hold before the strategy is asked."""
    count = r.state.hold + 1
    if count >= trigger.need:
        return None
    return r.decision(Holding(trigger), replace(r.state, hold=count))


def _budget(r: _Round, trigger: Trigger) -> Decision | None:
    """With the migration budget spent, the strategy is not asked (the hold stays reached)."""
    if r.budget.left is None or r.budget.left > 0:
        return None
    state = replace(r.state, hold=min(r.state.hold + 1, trigger.need))
    return r.decision(OverBudget(trigger, r.budget.facts(r.now)), state)


def _balance(r: _Round, trigger: Trigger) -> Decision:
    """Ask the strategy, order its proposal, and act if the plan clears the margin (and, with a
    migration budget, fits in what is left: :func:`_within_budget`)."""
    config, view = r.config, r.view
    propose = _proposer(r, config.batch)
    proposal, plan = plan_within(r.cluster, propose, view.forbidden, config, view.constraints)
    if not proposal.net_moves():
        why = why_not(r.cluster, r.now, config, r.past, view.constraints)
        # All excluded: that is the reason, whatever the strategy says.
        said = why.movable or not why.candidates
        stopped, stop = (proposal.stopped, proposal.stop) if said else (None, None)
        facts: Facts = NoProposal(trigger, stopped, why, stop)
        return r.decision(facts, r.attempted(), proposal=proposal, plan=plan)
    if not plan.moves:
        problem = plan.problems[0] if plan.problems else "no safe order"
        return r.decision(Unordered(trigger, problem), r.attempted(), proposal=proposal, plan=plan)
    moves = len(plan.moves)
    if config.metric == "none":
        if r.budget.stops(moves):
            return _within_budget(r, trigger, moves)
        refused = _kept_failover(r, trigger, plan, proposal, None)
        if refused is not None:
            return refused
        facts = Planned(trigger, moves, None, proposal.stopped, stop=proposal.stop)
        return r.decision(facts, r.acted(), proposal=proposal, plan=plan)
    predicted = r.predicted(plan)
    gain = (r.metric - predicted) / r.metric if r.metric > 0 else 0.0
    if config.margin > 0 and gain < config.margin - 1e-12:
        facts = BelowMargin(trigger, predicted, moves, gain, config.margin)
        return r.decision(facts, r.attempted(), predicted=predicted, proposal=proposal, plan=plan)
    if r.budget.stops(moves):
        return _within_budget(r, trigger, moves)
    refused = _kept_failover(r, trigger, plan, proposal, predicted)
    if refused is not None:
        return refused
    facts = Planned(trigger, moves, predicted, proposal.stopped, stop=proposal.stop)
    return r.decision(facts, r.acted(), predicted=predicted, proposal=proposal, plan=plan)


def _within_budget(r: _Round, trigger: Trigger, whole: int) -> Decision:
    """The plan of ``whole`` migrations cleared the margin but the budget leaves fewer: the
    strategy is asked again for at most what is left — the moves that buy the most balance for
    a strategy that takes ``max_moves`` — and that part is made if it does not make the metric
    worse (the margin was the whole plan's to clear)."""
    config, view = r.config, r.view
    left = r.budget.left or 0
    propose = _proposer(r, most_moves(config.batch, left) or 0)
    proposal, plan = plan_within(r.cluster, propose, view.forbidden, config, view.constraints)
    predicted = r.predicted(plan) if plan.moves and config.metric != "none" else None
    if not plan.moves or len(plan.moves) > left or (predicted or 0.0) > r.metric + 1e-12:
        facts: Facts = OverBudget(trigger, r.budget.facts(r.now, whole))
        return r.decision(facts, r.attempted(), proposal=proposal, plan=plan)
    refused = _kept_failover(r, trigger, plan, proposal, predicted)
    if refused is not None:
        return refused
    facts = Planned(trigger, len(plan.moves), predicted, proposal.stopped, whole, proposal.stop)
    return r.decision(facts, r.acted(), predicted=predicted, proposal=proposal, plan=plan)


def _proposer(r: _Round, most: int) -> Callable[[frozenset[tuple[str, str]]], Proposal]:
    """The strategy, asked what the policy asks and with its options — at most ``most``
    migrations (0: no limit) —, its proposal cut to that."""
    config, view = r.config, r.view
    info = get_strategy(config.strategy)
    options = config.strategy_options
    left = None if most == config.batch else most

    def propose(forbidden: frozenset[tuple[str, str]]) -> Proposal:
        if r.daily:
            cons = view.constraints.forbidding(forbidden)
            return day_proposal(
                r.cluster,
                view.loads,
                cons,
                r.daily,
                metric=config.metric,
                target=config.target,
                most=most_moves(config.batch, left),
            )
        request = strategy_request(config, r.past, r.now, forbidden, left)
        found = info.propose(view, request, options)
        limit = "batch" if left is None else "budget"
        return truncate(r.cluster, found, most, view.constraints, view.loads, limit)

    return propose
