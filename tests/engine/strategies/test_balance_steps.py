"""balance's typed move history (``strategies/balance/steps.py``): steps, their kinds, undo."""

from __future__ import annotations

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.strategies.balance.state import BalanceState
from opendrs.engine.strategies.balance.steps import History, Step, StepKind
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import Rules

GiB = 1024**3
MEMORY_ONLY = Settings(mode="static", weight_cpu=0.0, weight_memory=1.0, cpu_overcommit=8.0)


def _state() -> BalanceState:
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    guests = tuple(Guest(f"g{i}", "a", memory=4 * GiB) for i in range(4))
    cluster = Cluster(nodes, guests, Rules(), MEMORY_ONLY)
    return BalanceState(cluster, Constraints.build(cluster))


def test_each_kind_gives_the_reason_a_move_states() -> None:
    assert StepKind.REPAIR_RULES.reason == "repair: rules"
    assert StepKind.EXACT_ROOM.reason == "repair: makes room (exact)"
    assert StepKind.SET_EXCHANGE.reason == "balance (set exchange)"
    assert StepKind.BELOW_GRAIN.reason == "balance (below the grain)"
    repairs = {k for k in StepKind if k.is_repair}
    assert repairs == {k for k in StepKind if k.reason.startswith("repair")}


def test_record_keeps_the_objective_before_and_after_and_undo_restores_the_state() -> None:
    state = _state()
    history = History(state)
    load, j0 = state.node_load.copy(), state.objective()
    history.record(0, 1, StepKind.BALANCE)
    assert history.steps == [Step(0, 0, 1, j0, state.objective(), StepKind.BALANCE)]
    history.record_all([(1, 1), (2, 1)], StepKind.SWAP)
    assert [s.after for s in history.steps[:-1]] == [s.before for s in history.steps[1:]]
    assert len(history) == 3
    history.undo_since(1)
    assert len(history) == 1
    history.undo_since(0)
    assert np.allclose(state.node_load, load) and not state.moved().any()
