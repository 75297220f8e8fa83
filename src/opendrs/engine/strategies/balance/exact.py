"""``balance``'s exact repair (:func:`exact_repair`): when a unit that breaks a hard constraint can
go nowhere, the CP-SAT model places it and the units that may make room for it."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendrs.engine.distinct import distinct
from opendrs.engine.strategies.exact_repair import (
    REPAIR_SHARED_CAP,
    REPAIR_WALL_CAP,
    SKIPPED,
    solve_repair,
)

from ..base import migration_cost
from .state import BalanceState
from .steps import StepKind

#: The exact repair: the stuck units it takes at once; the nodes that lack least to take them
#: (two per stuck unit, from ``REPAIR_TARGETS`` to four times that) and the nodes with the most
#: room (``REPAIR_SPARES``) in its first model; the (movable unit, node) pairs up to which it then
#: tries every unit on every node.
REPAIR_UNITS = 256
REPAIR_TARGETS = 16
REPAIR_SPARES = 8
REPAIR_PAIRS = 20_000


def exact_repair(
    state: BalanceState, stuck: list[int]
) -> tuple[list[tuple[int, int, StepKind]], dict[str, Any]]:
    """Moves ``(unit, target, kind)`` that repair the ``stuck`` units with the exact model
    (:func:`~opendrs.engine.strategies.exact_repair.solve_repair`), moving other units to make room,
    and a summary for the proposal's options. No moves when it finds no repair.

    First a small model: the stuck units (at most :data:`REPAIR_UNITS`) on the nodes that lack
    least to take them, and the units there, which may stay, go to one of those nodes or to one
    of the nodes with the most room. Then, if it finds nothing and the cluster is small, every
    movable unit on every node. A unit that no allowed node could hold even empty stays out.
    The summary's ``deterministic`` is True only when every model's search ended on its
    deterministic budget or a proof; a search the wall clock cut ends the repair with no moves
    (the greedy repair's answer stands: :mod:`~opendrs.engine.strategies.exact_repair`).
    """
    units = state.units
    movable = [u for u in dict.fromkeys(stuck) if units.movable[u] or units.anchored[u]]
    must = np.array(movable[:REPAIR_UNITS], dtype=np.intp)
    fit = _repair_domains(state, must)
    info: dict[str, Any] = {"exact": "not run", "units": 0, "nodes": 0}
    info["hopeless"] = int((~fit.any(axis=1)).sum())
    must, fit = must[fit.any(axis=1)], fit[fit.any(axis=1)]
    if must.size == 0:
        return [], info
    n_movable, usable = np.count_nonzero(units.movable), state.usable
    for whole in (False, True):
        model, allow = _repair_neighbourhood(state, must, fit, whole=whole)
        # Complete: every stuck unit, every movable unit, every usable node in the model.
        complete = len(movable) <= REPAIR_UNITS and len(model) == n_movable
        complete = bool(complete and np.all(allow[:, usable]))
        model, domain = _repair_model_domains(state, model, allow)
        found = solve_repair(*_repair_inputs(state, model, domain))
        nodes = distinct(np.concatenate(domain)).size if domain else 0
        info.update(exact=found.status, units=len(model), nodes=nodes, complete=complete)
        if found.status == SKIPPED:
            info["cut"] = "deadline"  # (the plan's shared deadline was spent: no search ran)
        elif found.wall_cut:
            info["cut"] = "wall clock"  # (its answer is not used, and no other model runs)
        info["deterministic"] = info.get("deterministic", True) and found.deterministic
        small = n_movable * np.count_nonzero(usable) <= REPAIR_PAIRS
        if found.choice is not None or complete or not small or not found.deterministic:
            break
    if found.choice is None:
        return [], info
    chosen = dict(zip(model, found.choice.tolist(), strict=True))
    moving = [u for u in model if state.broken[u] or chosen[u] != int(units.assign[u])]
    first = set(must.tolist())
    moving.sort(key=lambda u: (u in first, u))  # the room first, then the repairs

    def kind(u: int) -> StepKind:
        if u not in first:
            return StepKind.EXACT_ROOM
        return StepKind.EXACT_MAINTENANCE if in_maintenance(state, u) else StepKind.EXACT_REPAIR

    return [(u, chosen[u], kind(u)) for u in moving], info


def in_maintenance(state: BalanceState, u: int) -> bool:
    """Whether unit ``u`` is on a node that takes no guests: in maintenance (a unit on an
    offline node does not move)."""
    return not state.usable[int(state.units.assign[u])]


def _repair_domains(state: BalanceState, which: np.ndarray) -> np.ndarray:
    """(len(which), N): the nodes each unit may end on in a repair — usable, allowed, roomy
    enough when empty of guests; for a movable or anchored unit only."""
    units = state.units
    empty = state.limit - state.cons.capacity.base + state.tol
    fits = np.all(units.need[which][:, None, :] <= empty[None, :, :], axis=2)
    moves = units.movable[which] | units.anchored[which]
    return units.static_ok[which] & state.usable[None, :] & fits & moves[:, None]


def _repair_neighbourhood(
    state: BalanceState, must: np.ndarray, fit: np.ndarray, *, whole: bool
) -> tuple[list[int], np.ndarray]:
    """The units of an exact repair model and the nodes (len, N) each may end on (see
    :func:`exact_repair`); ``fit``: the repair domains of the ``must`` units."""
    units, usable = state.units, state.usable
    movable = np.nonzero(units.movable)[0]
    if whole:
        return movable.tolist(), np.broadcast_to(usable, (movable.size, usable.size))
    free = state.limit - state.committed
    scale = np.maximum(state.limit, 1.0)
    lack = (np.maximum(units.need[must][:, None, :] - free[None, :, :], 0.0) / scale).sum(axis=2)
    lack = np.where(fit, lack, np.inf)
    wanted = min(max(REPAIR_TARGETS, 2 * must.size), 4 * REPAIR_TARGETS)
    best = np.argsort(lack, axis=1, kind="stable")[:, :wanted]
    votes = np.zeros(usable.size)
    for row, cols in enumerate(best):
        votes[cols[np.isfinite(lack[row, cols])]] += 1
    targets = np.zeros(usable.size, dtype=bool)
    targets[np.argsort(-votes, kind="stable")[: min(np.count_nonzero(votes), wanted)]] = True
    slack = np.where(usable, (free / scale).min(axis=1), -np.inf)
    spares = np.zeros(usable.size, dtype=bool)
    spares[np.argsort(-slack, kind="stable")[:REPAIR_SPARES]] = True
    spares &= usable
    model = set(must.tolist())
    for u in must.tolist():
        model.update(units.unit_of[units.neg_guests[u]].tolist())
    model.update(movable[targets[units.assign[movable]] & ~state.broken[movable]].tolist())
    chosen = sorted(u for u in model if u >= 0 and (units.movable[u] or units.anchored[u]))
    allow = np.zeros((len(chosen), usable.size), dtype=bool)
    for k, u in enumerate(chosen):
        allow[k] = targets | spares
        allow[k, state.where[units.members[u]]] = True
    return chosen, allow


def _repair_model_domains(
    state: BalanceState, model: list[int], allow: np.ndarray
) -> tuple[list[int], list[np.ndarray]]:
    """The model's units and their domains (within ``allow``): no node where a hard
    anti-affinity partner left out of the model is; a unit left with no node is left out (it
    stays), until none is."""
    units = state.units
    fit = _repair_domains(state, np.array(model, dtype=np.intp)) & allow
    inside = np.zeros(len(units.assign), dtype=bool)
    keep = np.ones(len(model), dtype=bool)
    has_neg = np.array([units.neg_guests[u].size > 0 for u in model], dtype=bool)
    while True:
        inside[:] = False
        inside[np.array(model, dtype=np.intp)[keep]] = True
        domain = fit.copy()
        for k in np.nonzero(keep & has_neg)[0].tolist():
            partners = units.neg_guests[model[k]]
            of = units.unit_of[partners]
            where = state.where[partners[(of < 0) | ~inside[np.maximum(of, 0)]]]
            domain[k, where[where >= 0]] = False
        empty = keep & ~domain.any(axis=1)
        if not empty.any():
            return [u for u, k in zip(model, keep, strict=True) if k], [
                np.nonzero(domain[k])[0] for k in np.nonzero(keep)[0]
            ]
        keep &= ~empty


def _repair_inputs(
    state: BalanceState, model: list[int], domain: list[np.ndarray]
) -> tuple[
    np.ndarray,
    np.ndarray,
    tuple[str, ...],
    list[np.ndarray],
    list[np.ndarray],
    list[tuple[int, int]],
]:
    """The arguments of :func:`~opendrs.engine.strategies.exact_repair.solve_repair`: need, room,
    dims, domains, costs and apart pairs. A cost is the net migrations' (from where each guest
    started) first, then how full the target is now (up to 100): the roomiest targets, which
    need the fewest parking moves, among equally cheap repairs."""
    units, guests, settings = state.units, state.cluster.guests, state.cluster.settings
    fill = np.minimum(50 * (state.committed / np.maximum(state.limit, 1.0)).max(axis=1), 100)
    fill = np.maximum(fill, 0).astype(np.int64)
    scale = 101 * (len(model) + 1)
    index = {u: i for i, u in enumerate(model)}
    room = state.limit - state.committed
    if model:
        members = np.concatenate([units.members[u] for u in model])
        np.add.at(room, state.where[members], units.guest_need[members])
    start = state.loads.assign
    cost: list[np.ndarray] = []
    apart: list[tuple[int, int]] = []
    for i, u in enumerate(model):
        partners = distinct(units.unit_of[units.neg_guests[u]]).tolist()
        apart.extend((i, index[p]) for p in partners if index.get(p, -1) > i)
        idx = units.members[u]
        price = np.array([migration_cost(guests[j], settings) for j in idx.tolist()])
        away = start[idx][:, None] != domain[i][None, :]
        net = (price[:, None] * away).sum(axis=0).astype(np.int64)
        cost.append(np.where(net > 0, scale * net + fill[domain[i]], 0))
    need = units.need[model] if model else np.zeros((0, room.shape[1]))
    return need, room, state.cons.capacity.dimensions, domain, cost, apart


def exact_note(info: dict[str, Any]) -> str:
    """The note of an exact repair: what the model was and what it found."""
    text = f"exact repair: CP-SAT {info['exact']}"
    if info["units"]:
        text += f" over {info['units']} units and {info['nodes']} nodes"
    if info["hopeless"]:
        text += f"; {info['hopeless']} units fit no allowed node even empty"
    if info.get("cut") == "deadline":
        text += (
            f"; skipped: the plan's {REPAIR_SHARED_CAP:g} s of exact repair were spent (a busy"
            " machine) or the daemon is stopping; the greedy repair's answer stands"
        )
    elif "cut" in info:
        text += (
            f"; stopped by its wall-clock cap (at most {REPAIR_WALL_CAP:g} s) before its"
            " deterministic budget (a busy machine): not used, as it would not repeat"
        )
    if "needs" in info:
        text += f"; not made: {info['needs']} moves, more than max_moves {info['max_moves']}"
    return text
