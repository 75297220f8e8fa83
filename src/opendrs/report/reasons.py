"""The policy's decision as the operator's sentence (logs, history, status, reports): the engine
gives a :class:`~opendrs.engine.policy.decision.Decision` — a code and typed facts — and its
words are made here, at the edge (Kubernetes' ``Status`` shape). :func:`explain` says it with
the engine's own sentence for where a strategy stopped, or with the operator's words for it
(``report.words.decision_words``)."""

from __future__ import annotations

from collections.abc import Callable

from opendrs.engine.policy.decision import (
    Balanced,
    BelowMargin,
    BudgetSpent,
    Busy,
    Closed,
    Decision,
    FailoverLost,
    Holding,
    Measurement,
    NoProposal,
    OverBudget,
    Planned,
    Repaired,
    RepairNote,
    Returned,
    Trigger,
    Unordered,
)
from opendrs.engine.policy.metrics import (
    format_by_arch,
    format_metric,
    format_threshold,
    metric_label,
)
from opendrs.engine.policy.needs import Need, need_sentence
from opendrs.engine.policy.spending import Hastening
from opendrs.engine.policy.state import BUDGET_WINDOW
from opendrs.engine.policy.why import WhyNot
from opendrs.engine.policy.windows import format_opening
from opendrs.engine.strategies.base import Stop
from opendrs.model.units import format_duration

__all__ = ["StopSaid", "decision_dict", "explain", "why_not_words"]


#: The operator's words for a :class:`Stop` (None: none for it, the engine's sentence is said).
StopSaid = Callable[[Stop], str | None]


def explain(decision: Decision, said: StopSaid | None = None) -> str:
    """The decision as one sentence for the operator (logs, history, reports). Where the
    strategy stopped is said by ``said`` when given — in a balancing plan, a return from
    maintenance and a repair toward the failover headroom too —, else by the engine's own
    sentence, where it has one (no proposal; a plan with no policy metric)."""
    facts = decision.facts
    if isinstance(facts, Busy):
        return _busy(facts)
    if isinstance(facts, Repaired):
        return _repaired(facts) + _stopped_at(facts.stop, said)
    if isinstance(facts, Returned):
        text = (
            f"{_guests(facts.guests)} back to {', '.join(facts.nodes)}, out of maintenance, "
            "bypassing threshold, hold and margin"
        ) + _stopped_at(facts.stop, said)
    elif isinstance(facts, Balanced):
        limit = format_threshold(facts.measured.metric, facts.threshold)
        text = f"{_shown(facts.measured)} at or below threshold {limit}: nothing to do"
    elif isinstance(facts, Closed):
        text = _closed(facts)
    else:
        text = f"{_trigger(facts.trigger)}; {_after_trigger(facts, said)}"
    return text + _note(decision.note, said)


def _stopped_at(stop: Stop | None, said: StopSaid | None) -> str:
    """`` (WORDS)``: where an acting plan's proposal stopped, in ``said``'s words ("" without
    them: the engine's sentence does not say it)."""
    words = None if stop is None or said is None else said(stop)
    return "" if words is None else f" ({words})"


def _stop_words(stopped: str | None, stop: Stop | None, said: StopSaid | None) -> str | None:
    """Where the strategy stopped: ``said``'s words for ``stop``, else the engine's sentence."""
    words = None if stop is None or said is None else said(stop)
    return stopped if words is None else words


def _after_trigger(
    facts: Holding | OverBudget | NoProposal | Unordered | BelowMargin | FailoverLost | Planned,
    said: StopSaid | None = None,
) -> str:
    """What a decision made once the threshold was crossed says after its trigger."""
    match facts:
        case Holding():
            return "waiting"
        case OverBudget(budget=budget):
            return _budget(budget)
        case NoProposal(trigger=trigger, why=why):
            stopped = _stop_words(facts.stopped, facts.stop, said)
            shown = "" if stopped is None else f" ({stopped})"
            return f"strategy {trigger.strategy} proposes no migration{shown}; {why_not_words(why)}"
        case Unordered(problem=problem):
            return f"none of the proposed migrations can be ordered safely ({problem})"
        case BelowMargin():
            after = format_metric(facts.trigger.measured.metric, facts.predicted)
            return (
                f"the plan would bring it to {after} with {_migrations(facts.migrations)}, "
                f"{facts.gain * 100:.0f} % better, less than the margin {facts.margin * 100:g} %"
            )
        case FailoverLost(migrations=migrations, before=before, after=after):
            had = before.startswith("failover headroom: yes")
            lose = "lose the failover headroom" if had else "leave more HA guests unable to restart"
            return (
                f"the plan of {_migrations(migrations)} would {lose} ({after}; now {before}): "
                "refused (keep_failover)"
            )
        case Planned():
            return _planned(facts, said)


def why_not_words(why: WhyNot) -> str:
    """Why the candidates stay: ``4 candidates: 1 may move; 2 in cooldown, 1 with local disks``."""
    groups = ", ".join(f"{count} {label}" for label, count in why.excluded)
    n = why.candidates
    if n == 0:
        return "no candidates (no running guest on a usable node)"
    head = f"{n} candidate{'s' if n != 1 else ''}"
    if why.movable == 0:
        return f"{head}, all excluded: {groups}"
    if not groups:
        return f"{head}, all may move"
    return f"{head}: {why.movable} may move; {groups}"


def _planned(facts: Planned, said: StopSaid | None) -> str:
    part = _migrations(facts.migrations)
    if facts.whole is not None:
        part += f", what the budget leaves of a plan of {facts.whole}"
    if facts.predicted is None:
        return f"it proposes {part} ({_stop_words(facts.stopped, facts.stop, said)})"
    after = format_metric(facts.trigger.measured.metric, facts.predicted)
    return f"plan brings it to {after} with {part}{_stopped_at(facts.stop, said)}"


#: Each activity (:data:`~.windows.ACTIVITIES`) as the sentence names it.
_ACTIVITY = {
    "balance": "balancing",
    "maintenance": "maintenance evacuation",
    "return": "return from maintenance",
    "repair": "repair",
}


def _closed(facts: Closed) -> str:
    """``spread 20 pp above threshold 15 pp for 6 of 6 observations; outside the migration
    window Mon-Fri 22:00-06:00 Europe/Berlin, no balancing migration starts; next opens Mon
    22:00``."""
    activity = _ACTIVITY[facts.activity]
    if facts.trigger is not None:
        what = _trigger(facts.trigger)
    elif facts.needed is not None:
        what = f"{activity} needed ({need_sentence(facts.needed)})"
    else:
        what = f"{activity} needed"
    if facts.blackout is None:
        where = f"outside the migration window {', '.join(facts.windows)} {facts.timezone}"
    else:
        where = f"in the blackout {facts.blackout} {facts.timezone}"
    if facts.opens is None:
        opens = "none opens within a year"
    else:
        opens = f"next opens {format_opening(facts.opens, facts.now, facts.timezone)}"
    return f"{what}; {where}, no {activity} migration starts; {opens}"


def _busy(facts: Busy) -> str:
    what = "" if facts.measured is None else f" ({_shown(facts.measured)})"
    if facts.moving is None:
        return f"a plan is still executing: no new decision{what}"
    return f"{facts.moving} is moving: no new decision until it ends{what}"


def _repaired(facts: Repaired) -> str:
    bypassed = "hold" if facts.hot_only else "threshold, hold"
    if facts.hot_only:
        kept = "the cooldown"
    elif facts.no_return_kept:
        kept = "the cooldown and minimum uptime"
    else:
        kept = "the cooldown, minimum uptime and no-return"
    overridden = f" and {kept} it could not keep" if facts.overridden else ""
    onto = ""
    if facts.onto_hot:
        onto = (
            f", onto {', '.join(facts.onto_hot)}, seen running hot lately: no other node had room"
        )
    return (
        f"repair: {_needed(facts.needed, facts.more)}; {_migrations(facts.migrations)}, "
        f"bypassing {bypassed} and margin{overridden}{onto}"
    )


def _shown(measured: Measurement) -> str:
    """The metric's label and value: ``spread 12.0 pp``."""
    shown = format_by_arch(measured.metric, dict(measured.by_arch))
    if measured.hour is not None:
        shown += f" at {measured.hour:02d}:00 of the daily profile"
    return f"{metric_label(measured.metric)} {shown}"


def _trigger(trigger: Trigger) -> str:
    if trigger.measured.metric == "none":
        return f"no policy metric: strategy {trigger.strategy}'s own trigger decides"
    limit = format_threshold(trigger.measured.metric, trigger.threshold)
    return (
        f"{_shown(trigger.measured)} above threshold {limit} for {trigger.count} of "
        f"{trigger.need} observations{_hastened(trigger.hastened)}"
    )


def _hastened(hastened: Hastening | None) -> str:
    if hastened is None:
        return ""
    text = f" (hastened by the budget left, {hastened.left} of {hastened.allowed}"
    if hastened.span is None:
        return text + ")"
    share = hastened.eagerness * 100
    return text + f": usage {share:.0f} % of the way to the last {format_duration(hastened.span)})"


def _budget(budget: BudgetSpent) -> str:
    last = "24 h" if budget.window == BUDGET_WINDOW else format_duration(budget.window)
    spent = f"{budget.spent} of {budget.allowed} in the last {last}"
    if budget.needed is None or not budget.left:
        what = f"the migration budget is spent: {spent}"
    else:
        what = f"the plan needs {_migrations(budget.needed)}, more than the budget leaves ({spent})"
    if budget.frees_in is None:
        return what
    return f"{what}; the next is free in {format_duration(budget.frees_in)}"


def _note(note: RepairNote, said: StopSaid | None = None) -> str:
    text = ""
    if note.stranded is not None:
        nodes = ", ".join(note.stranded.nodes)
        text += f"; {_guests(note.stranded.guests)} may not leave {nodes}, in maintenance"
    blocked = note.blocked
    if blocked is not None:
        what = _needed(blocked.needed, blocked.more)
        but = (
            "no allowed migration reaches it" if blocked.budget is None else _budget(blocked.budget)
        )
        text += f"; repair needed ({what}) but {but}"
    hot = note.unmovable
    if hot is not None:
        runs = "runs" if len(hot.nodes) == 1 else "run"
        text += (
            f"; {', '.join(hot.nodes)} {runs} hot (above {hot.level * 100:g} %) with no guest "
            "that may move"
        )
    short = note.failover
    if short is not None:
        words = None if said is None else said(short.stop)
        text += f"; {short.summary}: no move gives it back" if words is None else f"; {words}"
    return text


def _needed(first: Need, more: int) -> str:
    return need_sentence(first) + (f" (and {more} more)" if more else "")


def _migrations(n: int) -> str:
    return f"{n} migration{'s' if n != 1 else ''}"


def _guests(n: int) -> str:
    return f"{n} guest{'s' if n != 1 else ''}"


def decision_dict(decision: Decision, said: StopSaid | None = None) -> dict[str, object]:
    """The decision's data (:meth:`Decision.as_dict`) with its sentence as ``reason`` (after
    ``code``, where it always was)."""
    data = decision.as_dict()
    keys = list(data)
    at = keys.index("code") + 1
    words = explain(decision, said)
    return {**{k: data[k] for k in keys[:at]}, "reason": words, **{k: data[k] for k in keys[at:]}}
