""":func:`decide`: whether to act on one observation, as a short sequence of guards — busy,
repair, back from maintenance, threshold, hold, migration budget, then the strategy's plan and the
margin — each returning a :class:`Decision` or passing to the next."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from opendrs.engine.planner import Plan, final_placement
from opendrs.engine.policy.config import PolicyConfig, most_moves, strategy_request
from opendrs.engine.policy.dayplan import day_proposal
from opendrs.engine.policy.guards import failed_targets, forbidden_placements
from opendrs.engine.policy.maintenance import returns_from_maintenance, track_evacuations
from opendrs.engine.policy.metrics import (
    format_by_arch,
    format_metric,
    format_threshold,
    measure,
    measure_by_arch,
    metric_label,
)
from opendrs.engine.policy.planning import plan_within, truncate
from opendrs.engine.policy.profile import day_metric, worst_hour
from opendrs.engine.policy.repair import (
    Repair,
    left_in_maintenance,
    may_need_repair,
    only_hot,
    repair_within_guards,
)
from opendrs.engine.policy.smoothing import overloads
from opendrs.engine.policy.spending import react
from opendrs.engine.policy.state import (
    BUDGET_WINDOW,
    PastMigrations,
    PolicyState,
    budget_allowance,
    budget_window,
)
from opendrs.engine.policy.why import why_not
from opendrs.engine.strategies import get_strategy
from opendrs.engine.strategies.base import Proposal
from opendrs.engine.usage import MeasuredUsage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster
from opendrs.model.units import format_duration

DecisionKind = Literal["none", "plan", "repair"]
#: What a decision is, for code (the reason is for the operator):
#:
#: * ``busy`` — a plan is still executing; nothing decided;
#: * ``repair`` — a plan that repairs a broken hard constraint (acts);
#: * ``return`` — evacuated guests back to their node out of maintenance (acts);
#: * ``balanced`` — the metric at or below the threshold;
#: * ``holding`` — above the threshold for fewer observations than the hold;
#: * ``budget`` — the migration budget is spent (or too little is left for the plan);
#: * ``no-proposal`` — the strategy proposes no migration;
#: * ``unordered`` — no proposed migration can be ordered safely;
#: * ``below-margin`` — the plan improves the metric by less than the margin;
#: * ``plan`` — a balancing plan (acts).
DecisionCode = Literal[
    "busy",
    "repair",
    "return",
    "balanced",
    "holding",
    "budget",
    "no-proposal",
    "unordered",
    "below-margin",
    "plan",
]
_ACTING: frozenset[str] = frozenset({"repair", "return", "plan"})


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one observation."""

    act: bool
    kind: DecisionKind
    #: One sentence for the operator.
    reason: str
    #: The metric now, and predicted after the plan (None when no plan was made).
    metric: float
    predicted: float | None
    proposal: Proposal | None
    plan: Plan | None
    #: The (guest, node) placements ruled out (cooldown, no-return, avoid, minimum uptime).
    forbidden: frozenset[tuple[str, str]]
    state: PolicyState
    #: Guests a repair leaves breaking a hard constraint, each with what stops it (logged at
    #: WARNING when decided; see :func:`repair`).
    stuck: tuple[tuple[str, str], ...] = ()
    #: What the decision is (:data:`DecisionCode`).
    code: DecisionCode = "balanced"
    #: Whether its migrations count against the migration budget: a balancing plan, or a repair
    #: of nodes that only run hot (the history keeps it; see ``max_migrations_per_day``).
    budgeted: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "act": self.act,
            "kind": self.kind,
            "code": self.code,
            "reason": self.reason,
            "metric": self.metric,
            "predicted": self.predicted,
            "proposal": self.proposal.as_dict() if self.proposal is not None else None,
            "plan": self.plan.as_dict() if self.plan is not None else None,
            "forbidden": [list(p) for p in sorted(self.forbidden)],
            "stuck": [list(s) for s in self.stuck],
            "state": {
                "hold": self.state.hold,
                "last_attempt": self.state.last_attempt,
                "last_action": self.state.last_action,
                "evacuated": dict(sorted(self.state.evacuated.items())),
            },
        }


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
    every hour. Pure and deterministic. Raises ValueError for a usage made for another cluster
    (the strategy's options were checked when ``config`` was made).
    """
    usages = (average, recent, latest)
    round_ = _Round(cluster, now, config, state, past, usages, busy, daily)
    for guard in (_busy, _repair, _back_from_maintenance, _balanced, _holding, _budget):
        decision = guard(round_)
        if decision is not None:
            return decision
    return _balance(round_)


class _Round:
    """One decision in the making: its inputs, the cycle's view, what earlier guards found."""

    def __init__(
        self,
        cluster: Cluster,
        now: float,
        config: PolicyConfig,
        state: PolicyState,
        past: PastMigrations,
        usages: tuple[MeasuredUsage | None, MeasuredUsage | None, MeasuredUsage | None],
        busy: bool,
        daily: Sequence[MeasuredUsage] | None = None,
    ) -> None:
        average, recent, latest = usages
        self.now, self.past, self.recent, self.busy = now, past, recent, busy
        self._count_budget(config)
        #: The policy as the budget left lets it react (unchanged without a budget).
        reaction = react(config, self.left, average, latest)
        self.config = config = reaction.config
        #: What the trigger adds while the budget left hastens the decision.
        self.hastened = reaction.note
        self.view = CycleView(cluster, reaction.average, hot=config.hot)
        #: The usage of each hour of the day (None: balance on ``average``).
        self.daily = daily
        hour = None
        if daily:
            hour = worst_hour(cluster, config.metric, self.view.loads, daily)
            self.view = CycleView(cluster, daily[hour], hot=config.hot)
        by_arch = measure_by_arch(cluster, config.metric, self.view.loads)
        self.metric = max(by_arch.values(), default=0.0)
        self.label = metric_label(config.metric)
        self.shown = format_by_arch(config.metric, by_arch)
        if hour is not None:
            self.shown += f" at {hour:02d}:00 of the daily profile"
        self.limit = format_threshold(config.metric, config.threshold)
        tracked = track_evacuations(cluster, state.evacuated) if config.maintenance_return else {}
        self.state = state if tracked == state.evacuated else replace(state, evacuated=tracked)
        #: The repair, once made: every later decision names what it leaves stuck.
        self.repair = Repair(())
        #: What a repair that could not be made adds to every later decision's reason.
        self.repair_note = ""
        #: Where the threshold and the hold stand, as the reason's first words.
        self.trigger = ""

    def _count_budget(self, config: PolicyConfig) -> None:
        """The budgeted migrations started within the window, oldest first, and how many more
        may start now (``left``; None: no budget)."""
        budget, window = config.max_migrations_per_day, config.migration_budget_window
        self.window = budget_window(budget or 0, window)
        #: How many budgeted migrations the window holds.
        self.allowed = budget_allowance(budget or 0, window)
        self.spent = sorted(t for t in self.past.budget_spent if self.now - t < self.window)
        self.left = None if budget is None else max(self.allowed - len(self.spent), 0)

    @property
    def cluster(self) -> Cluster:
        """The observation: placement, rules and settings (its usage is read from the view's
        models, never from it)."""
        return self.view.observed

    def guard(self) -> None:
        """From here on the decision may plan: the guards' forbidden placements, and capacity
        checked on the recent usage."""
        forbidden = forbidden_placements(self.cluster, self.now, self.config, self.past)
        self.view = self.view.guarding(self.recent, forbidden)

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
        code: DecisionCode,
        reason: str,
        state: PolicyState,
        *,
        predicted: float | None = None,
        proposal: Proposal | None = None,
        plan: Plan | None = None,
        forbidden: frozenset[tuple[str, str]] | None = None,
        budgeted: bool = False,
    ) -> Decision:
        act = code in _ACTING
        kind: DecisionKind = "plan" if code == "plan" else "repair" if act else "none"
        if forbidden is None:
            forbidden = self.view.forbidden
        return Decision(
            act,
            kind,
            reason,
            self.metric,
            predicted,
            proposal,
            plan,
            forbidden,
            state,
            self.repair.stuck,
            code,
            budgeted or code == "plan",
        )

    def budget_spent(self, needed: int | None = None) -> str:
        """Why the budget stops a plan: all spent, or fewer left than ``needed``; and when the
        oldest budgeted migration of the window leaves it."""
        last = "24 h" if self.window == BUDGET_WINDOW else format_duration(self.window)
        spent = f"{len(self.spent)} of {self.allowed} in the last {last}"
        if needed is None or not self.left:
            what = f"the migration budget is spent: {spent}"
        else:
            what = f"the plan needs {_migrations(needed)}, more than the budget leaves ({spent})"
        if not self.spent:
            return what
        frees = self.spent[0] + self.window - self.now
        return f"{what}; the next is free in {format_duration(max(frees, 1.0))}"


def _migrations(n: int) -> str:
    return f"{n} migration{'s' if n != 1 else ''}"


def _busy(r: _Round) -> Decision | None:
    """While a plan executes — or, with ``wait_for_motions``, while any guest moves — nothing is
    decided, and the hold count stands still."""
    moving = moving_guest(r.cluster) if r.config.wait_for_motions else None
    if not r.busy and moving is None:
        r.guard()
        return None
    what = "" if r.config.metric == "none" else f" ({r.label} {r.shown})"
    if r.busy:
        return r.decision("busy", f"a plan is still executing: no new decision{what}", r.state)
    return r.decision("busy", f"{moving} is moving: no new decision until it ends{what}", r.state)


def moving_guest(cluster: Cluster) -> str | None:
    """The first guest (by id) that is moving — a migration in progress, or an HA migrate or
    relocate under way — as the operator reads it; None when none is."""
    moving = [g for g in cluster.guests if g.migrating_to is not None or g.ha_state in _HA_MOTIONS]
    return min(moving, key=lambda g: g.id).label if moving else None


#: The HA states of a guest being moved (``Manager.pm``: ``migrate``, ``relocate``).
_HA_MOTIONS = frozenset({"migrate", "relocate"})


def _repair(r: _Round) -> Decision | None:
    """What breaks a hard constraint is repaired at once, bypassing threshold, hold and margin;
    so is a node whose recent measured load is above the hot level (``config.hot``) while the
    metric on the average usage is above the threshold — a lasting hot spot, bypassing hold and
    margin (hot on the recent usage alone, balanced on the average, is loads taking turns:
    relieving one turn only makes room for the next elsewhere). A repair that cannot be made is
    noted on every later decision."""
    view, config = r.view, r.config
    limit = 1.0 if config.hot is None else config.hot
    screen = may_need_repair(r.cluster, view.usage_loads, config.hot) or (
        r.recent is not None and overloads(view.usage_loads, r.recent, limit)
    )
    if not screen:
        return None
    # Guests left on a node in maintenance that may not move: named whatever comes next.
    r.repair = Repair((), stuck=left_in_maintenance(r.cluster))
    r.repair_note = _left_note(r.cluster, r.repair.stuck)
    hot_only = only_hot(r.cluster, view.constraints)
    lasting = config.metric == "none" or r.metric > config.threshold
    if config.hot is not None and hot_only and not lasting:
        return None
    failed = failed_targets(r.cluster, r.now, r.past)
    r.repair, kept_off = repair_within_guards(
        view.checked, view.constraints, config, view.forbidden, failed
    )
    needed = r.repair.needed
    if not needed or r.repair.proposal is None or r.repair.plan is None:
        return None
    what = needed[0] + (f" (and {len(needed) - 1} more)" if len(needed) > 1 else "")
    plan = r.repair.plan
    if not plan.moves:
        r.repair_note += f"; repair needed ({what}) but no allowed migration reaches it"
        return None
    if hot_only and r.left is not None and len(plan.moves) > r.left:
        r.repair_note += f"; repair needed ({what}) but {r.budget_spent(len(plan.moves))}"
        return None
    overridden = (
        ""
        if kept_off == view.forbidden
        else " and the cooldown, minimum uptime and no-return it could not keep"
    )
    return r.decision(
        "repair",
        f"repair: {what}; {_migrations(len(plan.moves))}, "
        f"bypassing {'hold' if hot_only else 'threshold, hold'} and margin{overridden}",
        r.acted(),
        predicted=r.predicted(plan),
        proposal=r.repair.proposal,
        plan=plan,
        forbidden=kept_off,
        budgeted=hot_only,
    )


def _left_note(cluster: Cluster, left: tuple[tuple[str, str], ...]) -> str:
    """What the reason adds for the guests ``left`` on nodes in maintenance (each a WARNING)."""
    if not left:
        return ""
    guests, index = cluster.guests, cluster.guest_index
    nodes = ", ".join(sorted({guests[index[g]].node for g, _why in left}))
    n = len(left)
    return f"; {n} guest{'s' if n != 1 else ''} may not leave {nodes}, in maintenance"


def _back_from_maintenance(r: _Round) -> Decision | None:
    """Guests evacuated for maintenance go back at once when their node leaves it."""
    if not (r.config.maintenance_return and r.state.evacuated):
        return None
    back = returns_from_maintenance(r.view, r.state.evacuated, r.now, r.config, r.past, r.metric)
    if back is None:
        return None
    proposal, plan, predicted = back
    nodes = ", ".join(sorted({m.target for m in plan.moves}))
    n = len(plan.moves)
    return r.decision(
        "return",
        f"{n} guest{'s' if n != 1 else ''} back to {nodes}, out of maintenance, "
        f"bypassing threshold, hold and margin{r.repair_note}",
        r.acted(),
        predicted=predicted,
        proposal=proposal,
        plan=plan,
    )


def _balanced(r: _Round) -> Decision | None:
    """Nothing happens while the metric is at or below the threshold."""
    config = r.config
    if config.metric == "none" or r.metric > config.threshold:
        return None
    return r.decision(
        "balanced",
        f"{r.label} {r.shown} at or below threshold {r.limit}: nothing to do{r.repair_note}",
        replace(r.state, hold=0),
    )


def _holding(r: _Round) -> Decision | None:
    """The metric must stay above the threshold for the hold before the strategy is asked."""
    config = r.config
    need = max(config.hold, 1)
    count = r.state.hold + 1
    if config.metric == "none":
        r.trigger = f"no policy metric: strategy {config.strategy}'s own trigger decides"
    else:
        r.trigger = (
            f"{r.label} {r.shown} above threshold {r.limit} for {min(count, need)} of {need} "
            f"observations{r.hastened}"
        )
    if count >= need:
        return None
    return r.decision(
        "holding", f"{r.trigger}; waiting{r.repair_note}", replace(r.state, hold=count)
    )


def _budget(r: _Round) -> Decision | None:
    """With the migration budget spent, the strategy is not asked (the hold stays reached)."""
    if r.left is None or r.left > 0:
        return None
    need = max(r.config.hold, 1)
    state = replace(r.state, hold=min(r.state.hold + 1, need))
    return r.decision("budget", f"{r.trigger}; {r.budget_spent()}{r.repair_note}", state)


def _balance(r: _Round) -> Decision:
    """Ask the strategy, order its proposal, and act if the plan clears the margin (and, with a
    migration budget, fits in what is left: :func:`_within_budget`)."""
    config, view, note = r.config, r.view, r.repair_note
    propose = _proposer(r, config.batch)
    proposal, plan = plan_within(r.cluster, propose, view.forbidden, config, view.constraints)
    if not proposal.net_moves():
        why = why_not(r.cluster, r.now, config, r.past, view.constraints)
        # All excluded: that is the reason, whatever the strategy says.
        stopped = f" ({proposal.stopped})" if why.movable or not why.candidates else ""
        reason = f"{r.trigger}; strategy {config.strategy} proposes no migration{stopped}; {why}"
        return r.decision("no-proposal", reason + note, r.attempted(), proposal=proposal, plan=plan)
    if not plan.moves:
        problem = plan.problems[0] if plan.problems else "no safe order"
        reason = f"{r.trigger}; none of the proposed migrations can be ordered safely ({problem})"
        return r.decision("unordered", reason + note, r.attempted(), proposal=proposal, plan=plan)
    migrations = _migrations(len(plan.moves))
    if config.metric == "none":
        if r.left is not None and len(plan.moves) > r.left:
            return _within_budget(r, len(plan.moves))
        reason = f"{r.trigger}; it proposes {migrations} ({proposal.stopped}){note}"
        return r.decision("plan", reason, r.acted(), proposal=proposal, plan=plan)
    predicted = r.predicted(plan)
    after = format_metric(config.metric, predicted)
    gain = (r.metric - predicted) / r.metric if r.metric > 0 else 0.0
    if config.margin > 0 and gain < config.margin - 1e-12:
        reason = (
            f"{r.trigger}; the plan would bring it to {after} with {migrations}, "
            f"{gain * 100:.0f} % better, less than the margin {config.margin * 100:g} %"
        )
        return r.decision(
            "below-margin",
            reason + note,
            r.attempted(),
            predicted=predicted,
            proposal=proposal,
            plan=plan,
        )
    if r.left is not None and len(plan.moves) > r.left:
        return _within_budget(r, len(plan.moves))
    reason = f"{r.trigger}; plan brings it to {after} with {migrations}{note}"
    return r.decision("plan", reason, r.acted(), predicted=predicted, proposal=proposal, plan=plan)


def _within_budget(r: _Round, whole: int) -> Decision:
    """The plan of ``whole`` migrations cleared the margin but the budget leaves fewer: the
    strategy is asked again for at most what is left — the moves that buy the most balance for
    a strategy that takes ``max_moves`` — and that part is made if it does not make the metric
    worse (the margin was the whole plan's to clear)."""
    config, view, note = r.config, r.view, r.repair_note
    left = r.left or 0
    propose = _proposer(r, most_moves(config.batch, left) or 0)
    proposal, plan = plan_within(r.cluster, propose, view.forbidden, config, view.constraints)
    predicted = r.predicted(plan) if plan.moves and config.metric != "none" else None
    if not plan.moves or len(plan.moves) > left or (predicted or 0.0) > r.metric + 1e-12:
        reason = f"{r.trigger}; {r.budget_spent(whole)}"
        return r.decision("budget", reason + note, r.attempted(), proposal=proposal, plan=plan)
    part = f"{_migrations(len(plan.moves))}, what the budget leaves of a plan of {whole}"
    if predicted is None:
        reason = f"{r.trigger}; it proposes {part} ({proposal.stopped}){note}"
    else:
        after = format_metric(config.metric, predicted)
        reason = f"{r.trigger}; plan brings it to {after} with {part}{note}"
    return r.decision("plan", reason, r.acted(), predicted=predicted, proposal=proposal, plan=plan)


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
