"""``balance``'s first phase (:func:`repair`): the units that break a hard constraint now are
moved first, to their best allowed node, whatever the cost — the rules' breakers, then the nodes
over capacity; what the greedy repair cannot place, the exact repair tries
(:func:`.exact.exact_repair`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .exact import exact_repair, in_maintenance
from .picks import pick
from .state import BalanceState
from .steps import History, StepKind

#: The units of the greedy repair's list checked at once first (:func:`_first_placeable`).
FIRST_BLOCK = 64

#: The greedy repair's kinds of step by phase; a unit on a node in maintenance is that instead.
_PHASE_KINDS = {"rules": StepKind.REPAIR_RULES, "capacity": StepKind.REPAIR_CAPACITY}


@dataclass
class ExactRepairMemo:
    """The exact repair the first search found (moves and summary; None: not run yet), for the
    second search, which starts from the same state."""

    found: tuple[list[tuple[int, int, StepKind]], dict[str, Any]] | None = None


@dataclass
class RepairOutcome:
    """What the repair phase left: the units it could not repair, and what the exact repair
    found (None: it did not run)."""

    stuck: list[int] = field(default_factory=list)
    exact: dict[str, Any] | None = None


def repair(
    history: History,
    limit: int,
    max_moves: int | None,
    memo: ExactRepairMemo,
) -> RepairOutcome:
    """Repair ``history``'s state in at most ``limit`` steps of history (``max_moves``: the
    option, for the note of an exact repair too long for it). ``memo`` keeps the exact repair
    for a second search, which starts from the same state."""
    state = history.state
    outcome = RepairOutcome(_greedy_repair(history, limit))
    if outcome.stuck and len(history) < limit:
        # The greedy repair moves only the units that break something: when one can go
        # nowhere, the exact model may move others to make room (the same in both passes).
        if memo.found is None:
            memo.found = exact_repair(state, list(dict.fromkeys(outcome.stuck)))
        pairs, outcome.exact = memo.found
        if len(history) + len(pairs) > limit:
            # All or nothing: part of a repair may not repair anything.
            outcome.exact = {**outcome.exact, "needs": len(pairs), "max_moves": max_moves}
            pairs = []
        for u, t, kind in pairs:
            history.record(u, t, kind)
        if pairs:
            outcome.stuck = [*state.violating_units(), *state.overloaded_units()]
    return outcome


def _greedy_repair(history: History, limit: int) -> list[int]:
    """Units that break a hard rule now, then those on nodes over capacity, each moved to its
    best allowed node; the units that could go nowhere."""
    state = history.state
    all_nodes = np.arange(len(state.cluster.nodes), dtype=np.intp)
    stuck: list[int] = []
    # The units repaired so far, kept as the repair records them (not gathered from the whole
    # history after each move).
    repaired = {step.unit for step in history.steps if step.kind.is_repair}
    for phase in ("rules", "capacity"):
        for _ in range(len(state.units.assign) + 1):
            todo = state.violating_units() if phase == "rules" else state.overloaded_units()
            todo = [u for u in todo if u not in repaired]
            if not todo or len(history) >= limit:
                break
            move = _first_placeable(state, todo, all_nodes)
            if move is None:
                stuck.extend(todo)
                break
            history.record(move[0], move[1], _repair_kind(state, move[0], phase))
            repaired.add(move[0])
    return stuck


def _first_placeable(
    state: BalanceState, todo: list[int], all_nodes: np.ndarray
) -> tuple[int, int] | None:
    """The first unit of ``todo`` with an allowed target, and its best one; None if none has.

    The units that have an allowed target at all are found in vectorised checks of many at once
    rather than a search per unit, so a node full of units that can go nowhere costs a pass,
    not one search per unit. The checks go through ``todo`` in order, in blocks that double
    (:data:`FIRST_BLOCK` first): a unit's check does not depend on the others, and most often
    the first block holds the unit moved, so a repair move checks a block, not all ``todo``."""
    candidates = np.array(todo, dtype=np.intp)
    begin, size = 0, FIRST_BLOCK
    while begin < candidates.size:
        block = candidates[begin : begin + size]
        for u in block[state.allowed(block, all_nodes).any(axis=1)].tolist():
            picks = pick(state, np.array([u], dtype=np.intp), all_nodes, forced=True)
            if picks:
                return u, picks[0][2]
        begin, size = begin + size, 2 * size
    return None


def _repair_kind(state: BalanceState, u: int, phase: str) -> StepKind:
    """What a repair of unit ``u`` in ``phase`` (``rules`` or ``capacity``) mends:
    ``maintenance`` for a unit on a node in maintenance, else the phase."""
    return StepKind.REPAIR_MAINTENANCE if in_maintenance(state, u) else _PHASE_KINDS[phase]
