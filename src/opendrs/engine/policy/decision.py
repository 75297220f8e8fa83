"""What the policy decided, as a code and typed facts (:class:`Decision`) — Kubernetes'
``Status`` shape: the decision carries data; its sentence is made only at the edge
(:func:`opendrs.report.reasons.explain`, for logs, history and reports)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Literal

from opendrs.engine.planner import Plan
from opendrs.engine.policy.needs import Need
from opendrs.engine.policy.spending import Hastening
from opendrs.engine.policy.state import PolicyState
from opendrs.engine.policy.why import WhyNot
from opendrs.engine.strategies.base import Proposal, Stop
from opendrs.model.units import format_duration

DecisionKind = Literal["none", "plan", "repair"]

#: A count of things the sentence names with a noun ("1 guest", "2 guests"): its gist is none,
#: one or many (:meth:`Decision.gist`).
_NOUN = {"count": "noun"}
#: A count the sentence names only when there is any: its gist is whether it is zero.
_ANY = {"count": "any"}
#: A duration in seconds the sentence shows in units (``21h 5m``): its gist is which units.
_UNITS = {"count": "units"}


class DecisionCode(StrEnum):
    """What a decision is, for code (``report.reasons.explain`` says it to the operator)."""

    #: A plan is still executing (or a guest moving); nothing decided.
    BUSY = "busy"
    #: A plan that repairs a broken hard constraint (acts).
    REPAIR = "repair"
    #: Evacuated guests back to their node out of maintenance (acts).
    RETURN = "return"
    #: The metric at or below the threshold.
    BALANCED = "balanced"
    #: Above the threshold for fewer observations than the hold.
    HOLDING = "holding"
    #: The migration budget is spent (or too little is left for the plan).
    BUDGET = "budget"
    #: The strategy proposes no migration.
    NO_PROPOSAL = "no-proposal"
    #: No proposed migration can be ordered safely.
    UNORDERED = "unordered"
    #: The plan improves the metric by less than the margin.
    BELOW_MARGIN = "below-margin"
    #: A balancing plan refused: it would lose the failover headroom (``keep_failover``).
    FAILOVER = "failover"
    #: A balancing plan (acts).
    PLAN = "plan"
    #: A plan that would act, outside every migration window (``policy.windows``).
    OUTSIDE_WINDOW = "outside-window"
    #: A plan that would act, within a blackout (``policy.blackouts``).
    BLACKOUT = "blackout"

    @property
    def acts(self) -> bool:
        """Whether a decision of this code carries a plan to carry out."""
        return self in (DecisionCode.REPAIR, DecisionCode.RETURN, DecisionCode.PLAN)

    @property
    def kind(self) -> DecisionKind:
        """The history's ``action``: ``plan``, ``repair`` (any other plan that acts), ``none``."""
        if self is DecisionCode.PLAN:
            return "plan"
        return "repair" if self.acts else "none"


# -- the facts every decision may name --------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """The policy metric on the observation: per CPU architecture, and at which hour of the daily
    profile (None: on the average usage)."""

    metric: str
    by_arch: tuple[tuple[str, float], ...]
    hour: int | None = None


@dataclass(frozen=True)
class Trigger:
    """Where the threshold and the hold stand once the policy may ask the strategy: ``count`` of
    ``need`` observations above ``threshold`` (with no policy metric, the strategy's own trigger
    decides), and how the budget left hastens it (None: it does not)."""

    measured: Measurement
    threshold: float
    count: int
    need: int
    strategy: str
    hastened: Hastening | None = None


@dataclass(frozen=True)
class BudgetSpent:
    """Why the budget stops a plan: ``spent`` of ``allowed`` budgeted migrations started within
    the ``window`` (seconds), ``left`` may start; the plan ``needed`` that many (None: the budget
    is all spent); the oldest leaves the window in ``frees_in`` seconds (None: none spent)."""

    spent: int
    allowed: int
    window: int
    left: int = field(metadata=_ANY)
    needed: int | None = field(default=None, metadata=_NOUN)
    frees_in: float | None = field(default=None, metadata=_UNITS)


@dataclass(frozen=True)
class Stranded:
    """Guests left on nodes in maintenance that may not move (each logged at WARNING)."""

    guests: int = field(metadata=_NOUN)
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class HotUnmovable:
    """Nodes that run hot above ``level`` (a share of their capacity) with no guest on them
    that may move: no relief reaches them (their guests ignored by a rule, locked, pinned, …)."""

    nodes: tuple[str, ...]
    level: float


@dataclass(frozen=True)
class RepairBlocked:
    """A repair needed but not made: the first thing it must repair, how many more, and the
    budget that stops it (None: no allowed migration reaches it)."""

    needed: Need
    more: int = field(metadata=_ANY)
    budget: BudgetSpent | None = None


@dataclass(frozen=True)
class FailoverShort:
    """The cluster short of the failover headroom (``keep_failover``; ``summary``, the
    headroom's) and no repair move found: ``stop`` says which HA guests cannot restart when
    which nodes fail, and what keeps the moves that would give it back off
    (:func:`~opendrs.engine.policy.failover.failover_blocked`)."""

    summary: str
    stop: Stop


@dataclass(frozen=True)
class RepairNote:
    """What every decision after the repair guard names of a repair it did not make (and,
    past the failover check, of a failover headroom no move gives back)."""

    stranded: Stranded | None = None
    blocked: RepairBlocked | None = None
    failover: FailoverShort | None = None
    unmovable: HotUnmovable | None = None


# -- the facts of each code -------------------------------------------------------------------


@dataclass(frozen=True)
class Busy:
    """A plan executes (``moving`` None) or ``moving`` is a guest on the move; the metric is
    shown unless the policy has none (``measured`` None)."""

    code: ClassVar[DecisionCode] = DecisionCode.BUSY
    moving: str | None
    measured: Measurement | None


@dataclass(frozen=True)
class Repaired:
    """A repair of ``needed`` (and ``more``) in ``migrations``, bypassing the hold and margin —
    and the threshold unless it only relieves hot nodes (``hot_only``); ``overridden``: it
    could not keep the cooldown, minimum uptime and no-return (only the cooldown, relieving hot
    nodes; only the cooldown and minimum uptime with ``no_return_kept``: no guest goes back to a
    node it left); ``onto_hot``: the targets seen running hot lately it moves guests to, a
    relief's last resort (none otherwise)."""

    code: ClassVar[DecisionCode] = DecisionCode.REPAIR
    needed: Need
    more: int = field(metadata=_ANY)
    migrations: int = field(metadata=_NOUN)
    hot_only: bool
    overridden: bool
    #: Where the plan's proposal stopped, when it says (a repair toward the failover headroom).
    stop: Stop | None = None
    no_return_kept: bool = False
    onto_hot: tuple[str, ...] = ()


@dataclass(frozen=True)
class Returned:
    """``guests`` back to ``nodes`` out of maintenance; ``stop``: where the plan stopped."""

    code: ClassVar[DecisionCode] = DecisionCode.RETURN
    guests: int = field(metadata=_NOUN)
    nodes: tuple[str, ...]
    stop: Stop | None = None


@dataclass(frozen=True)
class Balanced:
    """The metric at or below ``threshold``."""

    code: ClassVar[DecisionCode] = DecisionCode.BALANCED
    measured: Measurement
    threshold: float


@dataclass(frozen=True)
class Holding:
    """Above the threshold for fewer observations than the hold."""

    code: ClassVar[DecisionCode] = DecisionCode.HOLDING
    trigger: Trigger


@dataclass(frozen=True)
class OverBudget:
    """The migration budget stops the plan (or the strategy is not asked)."""

    code: ClassVar[DecisionCode] = DecisionCode.BUDGET
    trigger: Trigger
    budget: BudgetSpent


@dataclass(frozen=True)
class NoProposal:
    """The strategy proposes no migration: where it ``stopped`` (the engine's sentence) and
    its ``stop`` (code and details; both None: not said, every candidate being excluded), and
    why the candidates stay."""

    code: ClassVar[DecisionCode] = DecisionCode.NO_PROPOSAL
    trigger: Trigger
    stopped: str | None
    why: WhyNot
    stop: Stop | None = None


@dataclass(frozen=True)
class Unordered:
    """None of the proposed migrations can be ordered safely: the planner's first ``problem``."""

    code: ClassVar[DecisionCode] = DecisionCode.UNORDERED
    trigger: Trigger
    problem: str


@dataclass(frozen=True)
class BelowMargin:
    """The plan's ``migrations`` bring the metric to ``predicted``, ``gain`` better (a share),
    less than the ``margin``."""

    code: ClassVar[DecisionCode] = DecisionCode.BELOW_MARGIN
    trigger: Trigger
    predicted: float
    migrations: int = field(metadata=_NOUN)
    gain: float
    margin: float


@dataclass(frozen=True)
class FailoverLost:
    """The plan's ``migrations`` would take the cluster from the failover headroom it keeps
    (``before``, the summary now) to ``after``: refused."""

    code: ClassVar[DecisionCode] = DecisionCode.FAILOVER
    trigger: Trigger
    migrations: int = field(metadata=_NOUN)
    before: str
    after: str


@dataclass(frozen=True)
class Planned:
    """A balancing plan of ``migrations`` — part of a plan of ``whole`` the budget cut (None:
    the whole plan) — bringing the metric to ``predicted`` (None: no policy metric); where the
    strategy ``stopped`` (the engine's sentence) and its ``stop`` (code and details)."""

    code: ClassVar[DecisionCode] = DecisionCode.PLAN
    trigger: Trigger
    migrations: int = field(metadata=_NOUN)
    predicted: float | None
    stopped: str
    whole: int | None = None
    stop: Stop | None = None


@dataclass(frozen=True)
class Closed:
    """What would act — ``activity`` (:data:`~.windows.ACTIVITIES`) for ``needed`` (a repair's
    first need, None: balancing, whose ``trigger`` is then given) — may not start now: outside
    the ``windows`` (``blackout`` None) or within ``blackout``, in ``timezone``; ``opens``: when
    it may (a time, None: not within a year)."""

    activity: str
    windows: tuple[str, ...]
    blackout: str | None
    timezone: str
    now: float
    opens: float | None
    needed: Need | None = None
    trigger: Trigger | None = None


@dataclass(frozen=True)
class OutsideWindow(Closed):
    code: ClassVar[DecisionCode] = DecisionCode.OUTSIDE_WINDOW


@dataclass(frozen=True)
class InBlackout(Closed):
    code: ClassVar[DecisionCode] = DecisionCode.BLACKOUT


Facts = (
    Busy
    | Repaired
    | Returned
    | Balanced
    | Holding
    | OverBudget
    | NoProposal
    | Unordered
    | BelowMargin
    | FailoverLost
    | Planned
    | OutsideWindow
    | InBlackout
)


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one observation: its facts (whose type gives its code), the
    repair it did not make, and the plan it carries."""

    facts: Facts
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
    #: Whether its migrations count against the migration budget: a balancing plan, or a repair
    #: of nodes that only run hot (the history keeps it; see ``max_migrations_per_day``).
    budgeted: bool = False
    #: What a repair that could not be made adds to the decision.
    note: RepairNote = RepairNote()
    #: What the plan does, as migration windows name it (:data:`~.windows.ACTIVITIES`); None
    #: when it does not act. The executor starts none of its moves while that is closed.
    activity: str | None = None

    @property
    def code(self) -> DecisionCode:
        return self.facts.code

    @property
    def act(self) -> bool:
        return self.code.acts

    @property
    def kind(self) -> DecisionKind:
        return self.code.kind

    @property
    def stop(self) -> Stop | None:
        """Where the plan's proposal stopped, as a code and details, when the decision says it
        (the strategy proposes nothing, a balancing plan, a return or a failover repair)."""
        stop = getattr(self.facts, "stop", None)
        return stop if isinstance(stop, Stop) else None

    def gist(self) -> Hashable:
        """The kind of reason: the code and its facts without their numbers (two decisions with
        the same gist say the same thing, the figures aside)."""
        return (self.code.value, _gist(self.facts), _gist(self.note))

    def as_dict(self) -> dict[str, object]:
        """The decision's data (JSON); its sentence is the edge's
        (:func:`opendrs.report.reasons.decision_dict` adds it as ``reason``)."""
        return {
            "act": self.act,
            "kind": self.kind,
            "code": self.code.value,
            "stop": None if self.stop is None else self.stop.as_dict(),
            "activity": self.activity,
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
            **self._failover(),
            **self.needs(),
        }

    def needs(self) -> dict[str, object]:
        """What the repair needs (``need``), and what a repair it did not make needed
        (``blocked``, with how many more), as typed details, when the decision names them."""
        out: dict[str, object] = {}
        needed = getattr(self.facts, "needed", None)
        if needed is not None:
            out["need"] = needed.as_dict()
        blocked = self.note.blocked
        if blocked is not None:
            out["blocked"] = {**blocked.needed.as_dict(), "more": blocked.more}
        return out

    def _failover(self) -> dict[str, object]:
        """The failover headroom checked (``keep_failover``), when it was."""
        check = self.state.failover
        return {} if check is None else {"failover": check.as_dict()}


#: A figure within a text fact (a strategy's note, a guest's or node's name).
_FIGURES = re.compile(r"[0-9][0-9.,]*")


def _gist(value: object, count: str | None = None) -> Hashable:
    """``value`` with its figures left out: a number drops out — but for a count the sentence's
    words follow (``count``: ``"noun"``, none, one or many; ``"any"``, whether there is any;
    ``"units"``, which units a duration is shown in) — and a text fact (a strategy's note, a
    name) drops the figures within it."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return _FIGURES.sub("#", value)
    if isinstance(value, float) and count == "units":
        return _FIGURES.sub("#", format_duration(value))
    if isinstance(value, int) and count is not None:
        return min(value, 2) if count == "noun" else value == 0
    if isinstance(value, int | float):
        return "#"
    if isinstance(value, Measurement):
        # Which architecture is the worst is said when there are several; the hour is a figure.
        by_arch = dict(value.by_arch)
        worst = max(by_arch.values(), default=0.0)
        shown = min(a for a, v in by_arch.items() if v == worst) if len(by_arch) > 1 else None
        return (value.metric, _gist(tuple(by_arch)), _gist(shown), value.hour is None)
    if isinstance(value, Stop):
        # The code and its parts' codes; its figures (and the guests it names) drop out.
        return (value.code, tuple(_gist(part) for part in value.parts))
    if isinstance(value, WhyNot):
        labels = tuple(_gist(label) for label, _n in value.excluded)
        return (_gist(value.candidates, "noun"), _gist(value.movable, "any"), labels)
    if dataclasses.is_dataclass(value):
        fields = dataclasses.fields(value)
        return tuple(_gist(getattr(value, f.name), f.metadata.get("count")) for f in fields)
    if isinstance(value, tuple):
        return tuple(_gist(v) for v in value)
    raise TypeError(f"no gist for {type(value).__name__}")
