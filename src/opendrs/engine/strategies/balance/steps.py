"""``balance``'s move history: each step a :class:`Step` of a :class:`StepKind`, recorded in a
:class:`History` as the phases make them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .state import BalanceState


class StepKind(Enum):
    """What a step of the search did; its value is the reason its move gives."""

    REPAIR_RULES = "repair: rules"
    REPAIR_CAPACITY = "repair: capacity"
    REPAIR_MAINTENANCE = "repair: maintenance"
    EXACT_REPAIR = "repair (exact)"
    EXACT_MAINTENANCE = "repair: maintenance (exact)"
    EXACT_ROOM = "repair: makes room (exact)"
    BALANCE = "balance"
    SWAP = "balance (swap)"
    SET_EXCHANGE = "balance (set exchange)"
    BELOW_GRAIN = "balance (below the grain)"
    #: A move undone by pruning (the unit back where it started): no reason of its own.
    PRUNED = "pruned"

    @property
    def reason(self) -> str:
        """The reason a proposed move of this kind gives."""
        return self.value

    @property
    def is_repair(self) -> bool:
        """Whether the step mends a hard constraint (greedy or exact)."""
        return self in _REPAIRS


_REPAIRS = frozenset(
    {
        StepKind.REPAIR_RULES,
        StepKind.REPAIR_CAPACITY,
        StepKind.REPAIR_MAINTENANCE,
        StepKind.EXACT_REPAIR,
        StepKind.EXACT_MAINTENANCE,
        StepKind.EXACT_ROOM,
    }
)


@dataclass(frozen=True)
class Step:
    """One move of the search: ``unit`` from node ``source`` to ``target``, the objective
    ``before`` and ``after`` it, and what it was for."""

    unit: int
    source: int
    target: int
    before: float
    after: float
    kind: StepKind


class History:
    """The steps the search has made on ``state``, in order."""

    def __init__(self, state: BalanceState) -> None:
        self.state = state
        self.steps: list[Step] = []

    def __len__(self) -> int:
        return len(self.steps)

    def record(self, u: int, t: int, kind: StepKind) -> None:
        """Move unit ``u`` to ``t`` and record it."""
        state = self.state
        j0 = state.objective()
        src = int(state.units.assign[u])
        state.move(u, t)
        self.steps.append(Step(u, src, t, j0, state.objective(), kind))

    def record_all(self, moves: list[tuple[int, int]], kind: StepKind) -> None:
        """:meth:`record` of each move (unit, target) in order, the objectives after each
        computed at once."""
        state = self.state
        j0 = state.objective()
        for (u, t), (src, j1) in zip(moves, state.move_all(moves), strict=True):
            self.steps.append(Step(u, src, t, j0, j1, kind))
            j0 = j1

    def add(self, step: Step) -> None:
        """Record ``step``, a move already made."""
        self.steps.append(step)

    def undo_since(self, mark: int) -> None:
        """Undo the steps from the ``mark``-th on, last first, and forget them."""
        for step in reversed(self.steps[mark:]):
            self.state.move(step.unit, step.source)
        del self.steps[mark:]
