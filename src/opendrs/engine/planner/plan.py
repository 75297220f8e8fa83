"""The planner's answer: a :class:`Plan` of :class:`PlannedMove` steps."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class Moving(Protocol):
    """Anything that moves a guest to a node: a proposed, planned or plain move."""

    @property
    def guest(self) -> str: ...

    @property
    def target(self) -> str: ...


def final_placement(moves: Iterable[Moving]) -> dict[str, str]:
    """Where each guest of ``moves`` ends: the target of its last move (the last move wins)."""
    return {move.guest: move.target for move in moves}


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """One migration of a plan: ``guest`` from ``source`` to ``target`` in step ``step`` (1-based).

    ``parking`` marks a temporary move to a spare node that breaks a cycle; the same guest moves
    on from the spare to its target in a later step.
    """

    guest: str
    source: str
    target: str
    step: int
    parking: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest,
            "source": self.source,
            "target": self.target,
            "step": self.step,
            "parking": self.parking,
        }


@dataclass(frozen=True)
class Plan:
    """An ordered plan: steps of migrations, each safe to run at once after the previous ones."""

    #: Every migration, ordered by step, then guest id.
    moves: tuple[PlannedMove, ...]
    #: Whether every requested placement is reached safely.
    feasible: bool
    #: (guest, target) placements that no safe order reaches; those guests are not moved there.
    unreachable: tuple[tuple[str, str], ...] = ()
    #: One sentence each: why placements are unreachable, bundles over a limit, dropped placements.
    problems: tuple[str, ...] = ()

    @property
    def steps(self) -> int:
        """The number of steps."""
        return self.moves[-1].step if self.moves else 0

    def by_step(self) -> tuple[tuple[PlannedMove, ...], ...]:
        """The moves grouped by step: element ``k`` holds the moves of step ``k + 1``."""
        out: list[list[PlannedMove]] = [[] for _ in range(self.steps)]
        for move in self.moves:
            out[move.step - 1].append(move)
        return tuple(tuple(step) for step in out)

    def as_dict(self) -> dict[str, object]:
        return {
            "feasible": self.feasible,
            "steps": self.steps,
            "moves": [m.as_dict() for m in self.moves],
            "unreachable": [{"guest": g, "target": t} for g, t in self.unreachable],
            "problems": list(self.problems),
        }
