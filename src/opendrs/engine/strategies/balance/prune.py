"""``balance``'s pruning (:func:`prune`): every move the target no longer needs is undone."""

from __future__ import annotations

import numpy as np

from .steps import History, Step, StepKind


def prune(history: History) -> None:
    """Undo the moves that the target no longer needs, most expensive first: each unit moved
    back where it started when it may go there and every weighted resource stays within its
    goal (``state.goal``) without the move. Only when the search ended balanced. A gathered
    bundle stays gathered: undoing that would break its hard affinity again."""
    state = history.state
    units, weighted, goal = state.units, state.weights > 0, state.goal
    moved = np.nonzero(state.moved() & ~state.broken_at_start)[0].tolist()
    if not np.all(state.spreads()[weighted] <= goal[weighted]):
        return
    for u in sorted(moved, key=lambda u: (-units.cost[u], units.label[u])):
        origin = int(state.origin[u])
        back = state.allowed_one(u, origin)
        here_ok = units.static_ok[u, origin] and state.cons.usable[origin]
        if not (back and here_ok):
            continue
        t = int(units.assign[u])
        if np.all(state.spreads_moved(u, origin)[weighted] <= goal[weighted]):
            state.move(u, origin)
            history.add(Step(u, t, origin, 0.0, state.objective(), StepKind.PRUNED))
        else:
            state.there_and_back(u, origin)
