"""Whether a spread finer than one step on the smallest node can be reached in whole steps.

A node's load of a resource changes only by whole steps where every movable demand is a multiple
of one step ``s`` (vCPUs are whole): node ``n`` can carry ``o_n + s·k`` for whole ``k`` only,
``o_n`` being what it carries that no move changes modulo ``s``. Its fraction ``(o_n + s·k) / C_n``
then moves by ``s / C_n`` at a time — 1.56 pp for one vCPU on a 64-core node — and a spread of
``w`` below that is reached only if every node's fraction lies in one window ``[lo, lo + w]``: each
node at a whole ``k_n`` with ``lo·C_n ≤ o_n + s·k_n ≤ (lo + w)·C_n``, and the ``k_n`` adding up
to what the nodes carry now (guests only move between them).

For a given ``lo`` that is a range ``[kmin_n, kmax_n]`` per node (and no lower than what the node
carries that no move takes away), and the window exists iff every
range is non-empty and ``Σ kmin_n ≤ K ≤ Σ kmax_n`` (``K``: the steps the nodes carry in all). The
capacity-weighted mean fraction ``m`` lies in every such window (it is a mean of fractions inside
it), so ``lo ∈ [m − w, m]``. Between two consecutive *breakpoints* — values of ``lo`` at which a
node's level ``(o_n + s·k) / C_n`` is ``lo`` or ``lo + w`` — every range is the same, and at a
breakpoint each range contains those on both sides of it: so the windows that exist, where they
are not the one centred on the mean, are nearest it at a breakpoint. :func:`whole_step_window`
looks at the centred window and then at the breakpoints, nearest it first, and returns the first
that exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Slack, in fractions, with which a level counts as inside a window (rounding only).
SLACK = 1e-13
#: Relative slack with which a demand counts as a whole number of steps.
WHOLE = 1e-9
#: The finest common step looked for, as a share of the smallest demand.
FINEST = 1e-3
#: Candidate windows checked at once (each against every kind of node).
CHUNK = 256


@dataclass(frozen=True)
class Window:
    """A window ``[low, low + width]`` of fractions, and per node the whole steps ``kmin``..
    ``kmax`` (counted from the node's ``offset``) that keep it inside."""

    low: float
    width: float
    offset: np.ndarray  # (N,) what each node carries modulo the step
    kmin: np.ndarray  # (N,) int
    kmax: np.ndarray  # (N,) int


def whole_steps(demand: np.ndarray, step: float) -> bool:
    """Whether every demand is a whole number of ``step`` (within rounding)."""
    if step <= 0 or not np.isfinite(step):
        return False
    ratio = demand / step
    return bool(np.all(np.abs(ratio - np.round(ratio)) <= WHOLE * np.maximum(1.0, np.abs(ratio))))


def common_step(demand: np.ndarray) -> float | None:
    """The largest step of which every positive demand is a whole number (their greatest common
    divisor, within rounding: 1 for vCPUs of 2 and 3), or None where there is none at least
    :data:`FINEST` of the smallest (measured loads, whose every value differs)."""
    values = np.unique(demand[demand > 0])
    if values.size == 0 or not np.all(np.isfinite(values)):
        return None
    step = float(values[0])
    least = step * FINEST
    for value in values[1:].tolist():
        a, b = value, step
        while b >= least:
            a, b = b, a % b
            if b > a - least:  # a remainder within rounding of a whole step is none
                b = 0.0
        step = a
        if step < least:
            return None
    return step if whole_steps(values, step) else None


def levels(load: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray]:
    """(offset, k): each load as ``offset + step·k`` with whole ``k`` and ``0 ≤ offset < step``
    (an offset within rounding of ``step`` counts as zero)."""
    k = np.floor(load / step + WHOLE)
    offset = np.maximum(load - k * step, 0.0)
    return offset, k.astype(np.int64)


def whole_step_window(
    capacity: np.ndarray,
    load: np.ndarray,
    step: float,
    width: float,
    fixed: np.ndarray | None = None,
) -> Window | None:
    """The window of ``width`` nearest the mean in which whole steps of ``step`` per node add up to
    ``load``'s total (see the module's docstring), or None where there is none.

    ``capacity`` and ``load`` are the nodes' (N,), all positive capacities; ``load`` is what they
    carry now, ``fixed`` what of it no move takes away (default: nothing; no node carries less).
    Among windows as near the mean, the lower one.
    """
    capacity = np.asarray(capacity, dtype=np.float64)
    load = np.asarray(load, dtype=np.float64)
    if capacity.size == 0 or step <= 0 or width < 0:
        return None
    offset, k_now = levels(load, step)
    least = np.zeros(len(load), dtype=np.int64)
    if fixed is not None:
        least = np.maximum(levels(np.asarray(fixed, dtype=np.float64), step)[1], 0)
    total = int(k_now.sum())
    mean = float(load.sum() / capacity.sum())
    # Nodes alike (the same capacity, offset and least steps) have the same ranges: checked once.
    keys = np.stack([capacity, np.round(offset / step, 9), least], axis=1)
    _, first, kind = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    kind = kind.reshape(-1)
    count = np.bincount(kind, minlength=first.size)
    cap, off, floor = capacity[first], offset[first], least[first]
    centred = mean - width / 2
    candidates = np.concatenate([[centred], _breakpoints(cap, off, step, width, mean)])
    order = np.lexsort((candidates, np.abs(candidates - centred)))
    candidates = candidates[order]
    for begin in range(0, candidates.size, CHUNK):
        low = candidates[begin : begin + CHUNK, None]
        kmin = np.maximum(np.ceil((low * cap - off - SLACK * cap) / step), floor)
        kmax = np.floor(((low + width) * cap - off + SLACK * cap) / step)
        ok = np.all(kmin <= kmax, axis=1)
        ok &= (kmin @ count <= total) & (kmax @ count >= total)
        if ok.any():
            row = int(np.argmax(ok))
            return Window(
                float(low[row, 0]),
                width,
                offset,
                kmin[row].astype(np.int64)[kind],
                kmax[row].astype(np.int64)[kind],
            )
    return None


def _breakpoints(
    cap: np.ndarray, off: np.ndarray, step: float, width: float, mean: float
) -> np.ndarray:
    """The values of ``lo`` in ``[mean − width, mean]`` at which a level of a node is ``lo`` or
    ``lo + width``."""
    out: list[np.ndarray] = []
    for c, o in zip(cap.tolist(), off.tolist(), strict=True):
        # Levels (o + s·k) / c within [mean − width, mean + width]: each is lo, or lo + width.
        first = int(np.ceil(((mean - width) * c - o) / step))
        last = int(np.floor(((mean + width) * c - o) / step))
        level = (o + step * np.arange(first, last + 1)) / c
        out.extend([level, level - width])
    if not out:
        return np.zeros(0)
    found = np.concatenate(out)
    return np.unique(found[(found >= mean - width) & (found <= mean)])
