"""The operator's words for what the engine decided: a move as "moves db-main (101) off pve1
(cpu 89 %) to pve4 (cpu 6 %)", a strategy's stop as a sentence, a move's cost as the bytes it
copies, a placement's penalty as the rules behind it.

The engine gives codes and figures (a move's reason code, :class:`Stop`, a penalty); they are
turned into words here, at the edge, for ``plan``, ``place``, the reports and the daemon's
decisions (:func:`decision_words`: its log, history, status, dashboard and proposals). Its own
figures stay in ``--format json`` and ``--verbose``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from opendrs.engine.breaks import rule_breaks
from opendrs.engine.strategies.base import Proposal, ProposedMove, Stop
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest
from opendrs.model.units import format_bytes

if TYPE_CHECKING:  # the daemon's decisions: not imported by `opendrs plan`
    from opendrs.engine.policy.decision import Decision

__all__ = [
    "DAEMON_SETTINGS",
    "Settings",
    "copied_bytes",
    "decision_words",
    "move_sentences",
    "penalty_rules",
    "purpose_words",
    "stop_sentence",
    "stop_words",
]

#: What a move's reason code means, said after the loads it evens out ("" : balancing alone).
_PURPOSES = {
    "balance": "",
    "balance (swap)": "in an exchange of two guests",
    "balance (set exchange)": "in an exchange of guests",
    "balance (below the grain)": "to even out the last small differences",
    "repair: rules": "to mend a broken hard rule",
    "repair: capacity": "to relieve a node over its capacity",
    "repair: maintenance": "to empty a node in maintenance",
    "repair (exact)": "to mend a broken hard constraint",
    "repair: maintenance (exact)": "to empty a node in maintenance",
    "repair: makes room (exact)": "to make room for a repair",
    "back from maintenance": "back to its node after maintenance",
    "balances the day's hours (daily profile)": "to even out the day's hours",
}


def copied_bytes(guest: Guest) -> int:
    """What a migration of ``guest`` copies: its memory and its local disks."""
    return guest.memory + guest.local_disk_bytes


def move_sentences(cluster: Cluster, moves: Sequence[ProposedMove]) -> list[str]:
    """Each move of a proposal in words, in order, the loads read as each move finds them:
    ``moves NAME (ID) off SOURCE (cpu 89 %) to TARGET (cpu 6 %)`` (the resource where the
    source is furthest above the target, every resource when it is above in none), why when
    it is not balancing alone, and what it copies (memory and local disks)."""
    loads = LoadModel.build(cluster)
    assign = loads.assign.copy()
    weights = np.array([cluster.settings.weight_cpu, cluster.settings.weight_memory])
    sentences = []
    for move in moves:
        j = cluster.guest_index.get(move.guest)
        s, t = cluster.node_index.get(move.source), cluster.node_index.get(move.target)
        if j is None or s is None or t is None:
            sentences.append(f"moves {move.guest} off {move.source} to {move.target}")
            continue
        fractions = loads.fractions(assign)
        shown = _shown(fractions[s], fractions[t], weights)
        sentence = (
            f"moves {cluster.guests[j].label} off {move.source} ({_loads(fractions[s], shown)}) "
            f"to {move.target} ({_loads(fractions[t], shown)})"
        )
        purpose = purpose_words(move.reason, cluster.guest_label)
        sentences.append(
            sentence + (f" {purpose}" if purpose else "") + f"; copies "
            f"{format_bytes(copied_bytes(cluster.guests[j]))}"
        )
        assign[j] = t
    return sentences


def _shown(source: np.ndarray, target: np.ndarray, weights: np.ndarray) -> list[int]:
    """The resources a move's sentence names: the one where the source is furthest above the
    target, or every weighted one when the source is above in none (a move that evens out
    the two resources together)."""
    gap = np.where(weights > 0, source - target, -np.inf)
    r = int(np.argmax(gap))
    return [r] if gap[r] > 0 else [k for k in range(len(RESOURCES)) if weights[k] > 0]


def _loads(node: np.ndarray, shown: list[int]) -> str:
    return ", ".join(f"{RESOURCES[r]} {_percent(node[r])}" for r in shown)


def purpose_words(reason: str, label: Callable[[str], str] = str) -> str:
    """A move's reason code in words ("" for balancing alone, and for another strategy's own
    sentence, whose figures are for ``--verbose``), with the guest it moves with (``(with
    ID)``, named by ``label``)."""
    code, _, partner = reason.partition(" (with ")
    words = _PURPOSES.get(code, "")
    if partner:
        words = f"{words} together with {label(partner.rstrip(')'))}".strip()
    return words


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %" if np.isfinite(fraction) else "no capacity"


@dataclass(frozen=True)
class Settings:
    """How the words name the settings a strategy stops at: its margin and its most migrations
    (the ``plan`` command's options by default)."""

    margin: str = "--margin"
    max_moves: str = "--max-moves"


#: The daemon's names for them: its configuration's (the policy's batch sets the most
#: migrations, or what the migration budget leaves when that is less).
DAEMON_SETTINGS = Settings("policy.options.margin", "policy.batch, or what the budget leaves")


class _Say(NamedTuple):
    """What a stop's words name things by: guests (``label``) and ``settings``."""

    label: Callable[[str], str]
    settings: Settings


def stop_sentence(proposal: Proposal, label: Callable[[str], str] = str) -> str:
    """Why the strategy stopped, in words, guests named by ``label`` (its own sentence where it
    gives no code, or a code this module does not know)."""
    stop = proposal.stop
    if stop is None or not _known(stop):
        return proposal.stopped
    return stop_words(stop, label)


def decision_words(decision: Decision, label: Callable[[str], str] = str) -> str:
    """The policy's decision in words — its reason, where the strategy stopped said as its
    :class:`Stop` (guests named by ``label``, settings by the daemon's names) — for the daemon's
    log, history, status, dashboard and proposals (the engine's own sentence for where it
    stopped: :func:`~opendrs.report.reasons.explain` without words)."""
    from opendrs.report.reasons import explain

    say = _Say(label, DAEMON_SETTINGS)
    return explain(decision, lambda stop: _words(stop, say) if _known(stop) else None)


def _known(stop: Stop) -> bool:
    return stop.code in _STOP_WORDS and all(map(_known, stop.parts))


def stop_words(
    stop: Stop, label: Callable[[str], str] = str, settings: Settings = Settings()
) -> str:
    """A :class:`Stop` in words (a part of one CPU architecture says which first), guests named
    by ``label``, the settings it stopped at by ``settings``."""
    return _words(stop, _Say(label, settings))


def _words(stop: Stop, say: _Say) -> str:
    text = _STOP_WORDS[stop.code](stop, say)
    arch = stop.details.get("arch")
    return f"{arch}: {text}" if arch else text


def _figure(value: float | str, unit: float | str) -> str:
    """A figure of a stop with its unit: ``12.5 %``, ``3.0 pp``, ``0.123`` (a ratio)."""
    if unit in ("%", "pp"):
        return f"{float(value):.1f} {unit}"
    return f"{float(value):.3f}"


def _threshold(value: float | str, unit: float | str) -> str:
    return f"{float(value):g} {unit}" if unit else f"{float(value):g}"


#: What a stop's ``measure`` is, in words (another is said as it is).
_MEASURES = {
    "imbalance": "imbalance of the nodes' loads (their coefficient of variation)",
    "gap": "gap between the busiest and the least busy member's load scores",
    "spread": "spread of the nodes' loads",
}


def _number(value: float | str) -> str:
    """A figure as a whole number where it is one (an objective: ``1074510``), else ``:g``."""
    number = float(value)
    return f"{number:.0f}" if number.is_integer() else f"{number:g}"


def _plural(count: float | str, noun: str) -> str:
    number = int(float(count))
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _balanced(stop: Stop, _say: _Say) -> str:
    spreads = ", ".join(f"{r} {float(stop.details[f'{r}_spread']) * 100:.1f} pp" for r in RESOURCES)
    goal = float(stop.details["target_spread"]) * 100
    commit = stop.details.get("cpu_commit_spread")
    vcpus = "" if commit is None else f", their vCPU commitments within {float(commit) * 100:g} pp"
    if "cpu_commit_moves" in stop.details:
        vcpus += f", no wider than they started ({_commit_price(stop, 'within')})"
    return (
        f"the cluster is balanced: the nodes' loads are within {goal:g} percentage points "
        f"of each other{vcpus} ({spreads}){_coarser(stop)}"
    )


def _coarser(stop: Stop) -> str:
    """The resources a balanced stop leaves wider than ``target_spread`` (the vCPUs: than their
    own goal), said as what their goal was: the smallest movable guest's share of the smallest
    usable node, which no spread can go below in whole guests."""
    goals = {r: float(stop.details["target_spread"]) for r in RESOURCES}
    if "cpu_commit_spread" in stop.details:
        goals["cpu"] = max(goals["cpu"], float(stop.details["cpu_commit_spread"]))
    wider = [r for r in RESOURCES if float(stop.details[f"{r}_spread"]) > goals[r] + 1e-9]
    if not wider:
        return ""
    return (
        f"; {' and '.join(wider)} within one step of the smallest movable guest on the "
        "smallest node, which is coarser"
    )


def _no_move_pays(stop: Stop, say: _Say) -> str:
    return (
        "no other allowed move evens the loads out enough to be worth the memory it copies "
        f"({_setting(say.settings.margin, stop.details['margin'])}){_commit_short(stop)}"
    )


def _commit_short(stop: Stop) -> str:
    """Where a search ended short of its goals with the vCPU commitments left no wider than
    they started: what narrowing them towards their goal took instead."""
    if "cpu_commit_moves" not in stop.details:
        return ""
    price = _commit_price(stop, "towards")
    if "cpu_commit_limit" not in stop.details:
        price += ", and left the other loads no more even"
    return f"; the vCPU commitments are left no wider than they started ({price})"


def _commit_price(stop: Stop, way: str) -> str:
    """What the plan that brought the vCPU commitments ``within`` their goal (or ``towards``
    it) took — or, where the move limit stopped it, where it stopped."""
    asked = float(stop.details["cpu_commit_asked"]) * 100
    took = _plural(stop.details["cpu_commit_moves"], "migration")
    if "cpu_commit_limit" in stop.details:
        limit = _plural(stop.details["cpu_commit_limit"], "migration")
        return f"the limit of {limit} stopped the plan towards {asked:g} pp at {took}"
    if way == "within":
        return f"within {asked:g} pp would take {took}"
    return f"narrowing them towards {asked:g} pp took {took}"


def _setting(name: str, value: float | str) -> str:
    """A setting and its value: ``--margin 0.05``."""
    return f"{name} {float(value):g}"


def _move_limit(stop: Stop, say: _Say) -> str:
    limit = _plural(stop.details["max_moves"], "migration")
    return f"the limit of {limit} ({say.settings.max_moves}) stopped the search"


def _below_threshold(stop: Stop, _say: _Say) -> str:
    d = stop.details
    measure = str(d["measure"])
    unit = d.get("unit", "")
    return (
        f"the {_MEASURES.get(measure, measure)} is now {_figure(d['value'], unit)}, at or below "
        f"the threshold of {_threshold(d['threshold'], unit)}"
    )


def _gain_below_margin(stop: Stop, say: _Say) -> str:
    d = stop.details
    measure, unit = str(d["measure"]), d.get("unit", "")
    return (
        f"the best move, {say.label(str(d['guest']))} to {d['target']}, would bring the "
        f"{_MEASURES.get(measure, measure)} from {_figure(d['value'], unit)} to "
        f"{_figure(d['after'], unit)}: less than the {_setting(say.settings.margin, d['margin'])} "
        "asks"
    )


def _no_allowed_target(stop: Stop, _say: _Say) -> str:
    who = "started HA resource" if stop.details.get("scope") == "ha" else "guest that may move"
    return f"no {who} has a node it is allowed to move to"


def _passes_done(stop: Stop, _say: _Say) -> str:
    passes = int(float(stop.details["passes"]))
    if passes < 1:
        return "no pass over the guests was asked for (passes 0)"
    return f"{passes} pass{'' if passes == 1 else 'es'} over the guests done"


def _by_arch(stop: Stop, say: _Say) -> str:
    said = "; ".join(_words(part, say) for part in stop.parts)
    return said or "no CPU architecture has a node to balance"


def _nothing_relieves(stop: Stop, say: _Say) -> str:
    guests = ", ".join(say.label(g) for g in str(stop.details["guests"]).split())
    return f"no node relieves the {_plural(stop.details['bad'], 'guest')} that need it ({guests})"


def _failover_short(stop: Stop, say: _Say) -> str:
    from opendrs.engine.headroom import nodes_phrase  # kept out of `opendrs plan`'s start

    guests = [say.label(g) for g in str(stop.details["guests"]).split()]
    failed = nodes_phrase(str(stop.details["failed"]).split())
    fail = "fail" if " and " in failed else "fails"
    why = "; ".join(_words(part, say) for part in stop.parts)
    text = f"failover headroom short: {', '.join(guests)} cannot restart when {failed} {fail}"
    return f"{text}, and {why}" if why else text


def _hot_level(stop: Stop, _say: _Say) -> str:
    from opendrs.engine.headroom import nodes_phrase

    nodes = nodes_phrase(str(stop.details["nodes"]).split())
    hot = float(stop.details["hot"]) * 100
    return f"the only moves that would give it back fill {nodes} above the hot level {hot:g} %"


def _no_bad_guest(stop: Stop, _say: _Say) -> str:
    pressure = float(stop.details["cpu_pressure"]) * 100
    return (
        f"no guest needs relief: none has a CPU pressure above {pressure:g} %, sits on a node "
        "above its memory threshold or breaks a placement rule"
    )


def _solved(stop: Stop, _say: _Say) -> str:
    d = stop.details
    return (
        f"{_search(stop)}: {_plural(d['migrations'], 'migration')} lower its objective (spread, "
        f"migration cost, soft rules) from {_number(d['objective_before'])} to "
        f"{_number(d['objective_after'])}"
    )


def _current_best(stop: Stop, _say: _Say) -> str:
    objective = _number(stop.details["objective"])
    return f"{_search(stop)}: the current placement is already it (objective {objective})"


def _search(stop: Stop) -> str:
    """The search's result as the optimal strategy's stops begin with it."""
    if int(float(stop.details.get("proven", 0))):
        return "the best placement, proven optimal"
    bound = stop.details.get("bound")
    also = "" if bound is None else f", its objective bounded by {_number(bound)}"
    return f"the best placement found in the time limit{also}"


def _batch_cut(stop: Stop, say: _Say) -> str:
    d = stop.details
    cut = (
        f"cut to {int(float(d['kept']))} of {_plural(d['proposed'], 'migration')} by the "
        f"policy's {d['limit']} of {float(d['batch']):g}"
    )
    return "; ".join([*(_words(part, say) for part in stop.parts), cut])


def _repairs_only(stop: Stop, _say: _Say) -> str:
    strategy = stop.details.get("strategy")
    if strategy is None:
        return "only the repairs: the guests that must move, which move first"
    return (
        "only the repairs, which the daemon makes first with any strategy: "
        f"{strategy} is asked once nothing that may move breaks a hard rule"
    )


def _said(template: str) -> Callable[[Stop, _Say], str]:
    """A stop's words from ``template``, its details filled in (numbers as ``:g``)."""

    def words(stop: Stop, _say: _Say) -> str:
        shown = {k: f"{v:g}" if isinstance(v, float) else str(v) for k, v in stop.details.items()}
        return template.format(**shown)

    return words


_STOP_WORDS: dict[str, Callable[[Stop, _Say], str]] = {
    "balanced": _balanced,
    "no_move_pays": _no_move_pays,
    "move_limit": _move_limit,
    "below_threshold": _below_threshold,
    "no_movable_guest": _said("no guest may move: none is both running and free to move"),
    "basic_mode": _said("the cluster counts guests only (basic mode): this strategy balances none"),
    "no_allowed_target": _no_allowed_target,
    "gain_below_margin": _gain_below_margin,
    "passes_done": _passes_done,
    "pass_moved_nothing": _said(
        "pass {pass} over the guests moved nothing: every guest is within {keep} (keep) of its "
        "best node's score"
    ),
    "by_arch": _by_arch,
    "no_usable_node": _said("no node is usable: each is offline or in maintenance"),
    "too_few_nodes": _said("fewer than 2 usable nodes: nothing to balance between"),
    "idle": _said("the busiest node, {node}, is idle"),
    "no_fitting_move": _said(
        "no VM on {node}, the busiest node, fits on another below the midpoint of their loads"
    ),
    "no_bad_guest": _no_bad_guest,
    "nothing_relieves": _nothing_relieves,
    "every_group_visited": _said("every guest of the busiest nodes was considered"),
    "solved": _solved,
    "current_best": _current_best,
    "no_node_over_threshold": _said(
        "balancing is off, no node being over a threshold ({thresholds}): nothing to balance"
    ),
    "no_feasible_placement": _said(
        "no placement keeping every hard rule was found within the time limit of {time_limit} s"
    ),
    "infeasible": _said("no placement keeps every hard rule: {reasons}"),
    "returned": _said("the evacuated guests go back to their nodes after maintenance"),
    "failover_closer": _said("the moves bring the cluster closer to its failover headroom"),
    "failover_short": _failover_short,
    "hot_level": _hot_level,
    "no_helping_move": _said("no allowed move gives it back"),
    "day_balanced": _said("every hour of the day has its {metric} at or below the target"),
    "no_day_move_pays": _said("no other move lowers the imbalance over the day's hours enough"),
    "repairs_only": _repairs_only,
    "batch_cut": _batch_cut,
}


def penalty_rules(cluster: Cluster, members: Iterable[str], node: str) -> list[str]:
    """The soft rules ``members`` (a guest and the guests it moves with) would break on
    ``node``: what a placement's penalty stands for."""
    moving = set(members)
    guests = tuple(replace(g, node=node) if g.id in moving else g for g in cluster.guests)
    breaks = rule_breaks(replace(cluster, guests=guests))
    return sorted({b.rule for b in breaks if not b.hard and moving & set(b.guests)})
