"""``balance``'s choice of moves in a round: the nodes it looks at (:func:`round_window`), the best
disjoint moves among them (:func:`pick`), and the windows known to offer none
(:class:`IdleWindows`)."""

from __future__ import annotations

import numpy as np

from opendrs.engine.distinct import distinct

from .state import BalanceState

#: Candidate moves a round's greedy pass first screens at once for the next one it can take
#: (then twice as many each time).
PICK_BLOCK = 16

#: A round's band distances are computed only for the moves that may be made where those are
#: fewer than one in this many of its (unit, target) pairs (the same values, fewer of them).
BAND_AT_MOST = 4


def round_window(
    state: BalanceState, f: np.ndarray, usable_idx: np.ndarray, wide: int
) -> tuple[np.ndarray, np.ndarray]:
    """Source and target nodes looked at in a round.

    All nodes on small clusters. On big ones, nodes are ranked by what moving a typical guest
    there would do: their fractions projected on the mean movable demand, weighted as the objective
    weighs resources (``Σ_r w_r d̄_r f_nr / Σ_n C_nr``). The ``wide`` highest are sources, the
    ``wide`` lowest targets; the ``wide / 2`` nodes that contribute most to the objective
    (``C_n Σ_r w_r (f_nr − f̄_r)²``) join both sides — a node high in one resource and low in
    another trades both ways — and unusable nodes are sources, which must empty.
    """
    n_nodes = len(f)
    if n_nodes <= wide:
        return np.arange(n_nodes, dtype=np.intp), usable_idx
    projected = (f * (state.steer_wnorm * state.mean_demand)[None, :]).sum(axis=1)[usable_idx]
    mean = f[usable_idx].mean(axis=0)
    contribution = ((state.cap * (f - mean) ** 2) * state.steer_wnorm[None, :]).sum(axis=1)
    top = usable_idx[np.argsort(-contribution[usable_idx], kind="stable")[: max(wide // 2, 1)]]
    order = np.argsort(-projected, kind="stable")
    sources = usable_idx[order[:wide]]
    targets = usable_idx[order[::-1][:wide]]
    unusable = np.nonzero(~state.usable)[0]
    return np.union1d(np.union1d(sources, top), unusable), np.union1d(targets, top)


def pick(
    state: BalanceState,
    units: np.ndarray,
    targets: np.ndarray,
    *,
    forced: bool,
    shaped: bool = True,
    limit: int = 1 << 30,
) -> list[tuple[float, int, int]]:
    """Best disjoint moves of a round: [(gain, unit, target)], each node used at most once.

    Forced (repair) moves go to the target with the largest objective gain, whatever it is.
    Balancing moves must lower the objective; among them, when ``shaped``, the band distance they
    remove decides (the objective gain where no move removes any), else the objective gain, both
    per guest the unit migrates; then the cheaper migration.
    """
    if units.size == 0 or targets.size == 0:
        return []
    # Units alike score alike: one row per kind of unit (``kind``: each unit's row).
    kinds, kind = (np.arange(units.size),) * 2 if forced else _kinds(state, units)
    gain, score = _scores(state, units, kinds, targets, forced, shaped)
    rows, cols, n_sources = _candidates(state, units, kind, score, forced)
    if rows.size == 0:
        return []
    s = score[kind[rows], cols]
    cost = state.units.cost[units[rows]]
    if forced:
        order = np.lexsort((targets[cols], units[rows], -s))
    else:
        # Fewest moves: best score first; among scores within 1 %, the one that helps the held
        # resources most, then the cheaper migration.
        bucket = np.floor(np.log(s) / np.log(1.01))
        held = _held_gains(state, units[kinds], targets, (kind[rows], cols))
        order = np.lexsort((targets[cols], units[rows], cost, -held, -bucket))
    rows, cols = rows[order], cols[order]
    taken = _disjoint(
        state.units.assign[units[rows]],
        targets[cols],
        min(n_sources, len(targets), limit),
        len(state.cluster.nodes),
    )
    return [
        (float(gain[kind[rows[k]], cols[k]]), int(units[rows[k]]), int(targets[cols[k]]))
        for k in taken
    ]


def _held_gains(
    state: BalanceState, rows: np.ndarray, targets: np.ndarray, at: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """(k,) the objective gain, per guest, in the held resources alone of the moves ``at``
    (positions in ``rows``, the units of each kind, and ``targets``); zeros when none is held."""
    if not state.held.any():
        return np.zeros(at[0].size)
    wnorm = np.where(state.held, state.wnorm, 0.0)
    kinds, inverse = np.unique(at[0], return_inverse=True)
    gain = state.gains(rows[kinds], targets, wnorm)
    return gain[inverse, at[1]] / state.unit_guests[rows[at[0]]]


class IdleWindows:
    """The windows in which a round found no move that lowers the objective (no pick at all),
    with the versions of their nodes then: a move's gain depends only on its two nodes' loads,
    and whether it is allowed only on its unit and target, so a window found idle stays idle
    for the pairs of nodes no move has changed since. A round's search then looks first at the
    other pairs only; when those offer no move either, it finds none, without the whole search.
    """

    def __init__(self, state: BalanceState) -> None:
        self.state = state
        #: window size -> (sources, their versions, targets, their versions)
        self.windows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def record(self, sources: np.ndarray, targets: np.ndarray, window: int) -> None:
        """The search of every movable unit on ``sources`` to ``targets`` found no move."""
        version = self.state.version
        self.windows[window] = (sources, version[sources], targets, version[targets])

    def pick(
        self,
        cand: np.ndarray,
        sources: np.ndarray,
        targets: np.ndarray,
        window: int,
        limit: int,
        shaped: bool,
    ) -> list[tuple[float, int, int]]:
        """:func:`pick` (balancing) of ``cand`` (units on ``sources``) to ``targets``."""
        state = self.state
        kept = self.windows.get(window)
        if kept is not None:
            idle_sources = _unchanged(state, kept[0], kept[1], len(state.cluster.nodes))
            idle_targets = _unchanged(state, kept[2], kept[3], len(state.cluster.nodes))
            new_units = cand[~idle_sources[state.units.assign[cand]]]
            new_targets = targets[~idle_targets[targets]]
            if not pick(state, new_units, targets, forced=False, shaped=shaped, limit=1) and not (
                pick(state, cand, new_targets, forced=False, shaped=shaped, limit=1)
            ):
                return []
        return pick(state, cand, targets, forced=False, shaped=shaped, limit=limit)


def _unchanged(
    state: BalanceState, nodes: np.ndarray, versions: np.ndarray, n_nodes: int
) -> np.ndarray:
    """(N,) the ``nodes`` still at ``versions``."""
    mask = np.zeros(n_nodes, dtype=bool)
    mask[nodes[state.version[nodes] == versions]] = True
    return mask


def _kinds(state: BalanceState, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One unit (its position) of each kind, and each unit's kind: units of a kind
    (:meth:`BalanceState.unit_kinds`) on the same node score alike."""
    kind, n_kinds = state.unit_kinds()
    code = state.units.assign[units].astype(np.int64) * n_kinds + kind[units]
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse


def _scores(
    state: BalanceState,
    units: np.ndarray,
    kinds: np.ndarray,
    targets: np.ndarray,
    forced: bool,
    shaped: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(len(kinds), len(targets)) the objective gain of moving one unit of each kind (``kinds``:
    positions in ``units``) to each target, and what the move is chosen by, -inf where it may not
    be made: the objective gain (forced: any; else a positive one, per guest of the unit), or
    when ``shaped`` the band distance removed per guest by a move that lowers the objective, if
    any move removes some."""
    rows = units[kinds]
    # The gains' matrix product rounds as it does for every unit only with two rows or more (a
    # single row takes numpy's vector path): a lone kind of several units is computed twice.
    twice = rows.size == 1 and units.size > 1
    gain = state.gains(np.repeat(rows, 2) if twice else rows, targets)[: rows.size]
    if forced:
        return gain, np.where(state.allowed(rows, targets), gain, -np.inf)
    # Whether a move is allowed, only for the kinds with a move that lowers the objective.
    lowers = gain > 0
    some = np.nonzero(lowers.any(axis=1))[0]
    ok = np.zeros(gain.shape, dtype=bool)
    if some.size:
        ok[some] = state.allowed(rows[some], targets)
    # Per migration: a bundle of k guests must do k times as much as one guest.
    per_guest = state.unit_guests[rows][:, None]
    live = np.logical_and(ok, lowers, out=ok)
    # A unit of one guest: its gain (the same bits as gain / 1).
    score = np.where(live, gain / per_guest if per_guest.max(initial=1) > 1 else gain, -np.inf)
    count = np.count_nonzero(live) if shaped else 0
    if count:
        # The band distance of the moves that may be made only: where few may, at theirs alone.
        if count * BAND_AT_MOST < live.size:
            at = np.nonzero(live)
            band = np.full(score.shape, -np.inf)
            found = state.band_gains(rows, targets, at)
            band[at] = np.where(found > 1e-9, found / per_guest[at[0], 0], -np.inf)
        else:
            band = state.band_gains(rows, targets)
            band = np.where(live & (band > 1e-9), band / per_guest, -np.inf)
        if np.isfinite(band).any():
            return gain, band
    return gain, score


def _candidates(
    state: BalanceState, units: np.ndarray, kind: np.ndarray, score: np.ndarray, forced: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """The candidate moves (unit position, target position) of a round, best first: at most a few
    per unit, so a busy target does not hide the unit's next-best choice; and the number of
    source nodes they leave. ``score``: one row per kind, ``kind`` each unit's."""
    best = score.max(axis=1)[kind]
    unit_rows = np.nonzero(np.isfinite(best))[0]
    if unit_rows.size == 0:
        return unit_rows, unit_rows, 0
    if not forced and unit_rows.size > 8:
        # Only a few units of each source node can be taken in a round: keep each source's
        # eight best, ordered by their best score.
        src = state.units.assign[units[unit_rows]]
        order = np.lexsort((units[unit_rows], -best[unit_rows], src))
        first = np.r_[True, src[order][1:] != src[order][:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        rank = np.arange(len(order)) - group_start
        unit_rows = np.sort(unit_rows[order[rank < 8]])
    # Each kept unit's best few targets, so a busy target does not hide the next-best choice.
    per_unit = min(64, score.shape[1])
    kept, of_kept = np.unique(kind[unit_rows], return_inverse=True)
    top = np.argsort(-score[kept], axis=1, kind="stable")[:, :per_unit][of_kept]
    rows = np.repeat(unit_rows, per_unit)
    cols = top.ravel()
    keep = np.isfinite(score[kind[rows], cols])
    n_sources = len(distinct(state.units.assign[units[unit_rows]]))
    return rows[keep], cols[keep], n_sources


def _disjoint(sources: np.ndarray, targets: np.ndarray, most: int, n_nodes: int) -> list[int]:
    """The moves (source, target) a greedy pass in the order given takes: each one whose nodes
    no move taken before it uses, up to ``most`` moves. (A unit's second move would leave a
    node used already.) The next one is looked for a block at a time, twice as long each time."""
    used = np.zeros(n_nodes, dtype=bool)
    taken: list[int] = []
    begin, block = 0, PICK_BLOCK
    while begin < sources.size and len(taken) < most:
        src, tgt = sources[begin : begin + block], targets[begin : begin + block]
        free = ~(used[src] | used[tgt])
        k = int(np.argmax(free))
        if not free[k]:
            begin, block = begin + block, 2 * block
            continue
        used[src[k]] = used[tgt[k]] = True
        taken.append(begin + k)
        begin, block = begin + k + 1, PICK_BLOCK
    return taken
