"""Units by kind for ``balance``'s exchanges (:class:`Kinds`): units alike pair alike, so an
exchange's gain and score are computed per pair of kinds (:class:`GainingPairs` keeps those that
gain), and pairs of units only for the best (:func:`best_allowed`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: The best-scoring kind pairs an exchange search sorts first (see :func:`best_allowed`).
PREFIX_KINDS = 64


@dataclass
class Kinds:
    """Units by kind: ``units`` (by index); per kind, one unit (``first``) and how many there are
    (``count``); the units' positions kind after kind (``by_kind``), and where each kind's start
    there (``start``)."""

    units: np.ndarray
    first: np.ndarray
    count: np.ndarray
    by_kind: np.ndarray
    start: np.ndarray

    @classmethod
    def of(cls, units: np.ndarray, first: np.ndarray, kind: np.ndarray) -> Kinds:
        """``units`` of the kinds ``kind`` (each one's), ``first``: one position of each."""
        count = np.bincount(kind, minlength=first.size)
        by_kind = np.argsort(kind, kind="stable")
        return cls(units, units[first], count, by_kind, np.cumsum(count) - count)

    @classmethod
    def join(cls, parts: list[Kinds]) -> Kinds:
        """The units of ``parts`` one part after the other, each part's kinds its own."""
        at = np.cumsum([0] + [p.units.size for p in parts]).tolist()
        return cls(
            np.concatenate([p.units for p in parts]),
            np.concatenate([p.first for p in parts]),
            np.concatenate([p.count for p in parts]),
            np.concatenate([p.by_kind + k for p, k in zip(parts, at, strict=False)]),
            np.concatenate([p.start + k for p, k in zip(parts, at, strict=False)]),
        )


@dataclass(frozen=True)
class GainingPairs:
    """The kind pairs of an exchange table whose gain is positive and whose units' allowed nodes
    let them exchange, the only ones an exchange is chosen from: each one's row (kind on the
    node), column (kind elsewhere), gain and score."""

    rows: np.ndarray
    cols: np.ndarray
    gain: np.ndarray
    score: np.ndarray

    def split(self, widths: list[int]) -> list[GainingPairs]:
        """The pairs of tables side by side, ``widths`` columns each, table by table (the pairs
        in the order of their columns)."""
        if len(widths) == 1:
            return [self]
        ends = np.cumsum(widths)
        at = [0, *np.searchsorted(self.cols, ends).tolist()]
        return [
            GainingPairs(self.rows[lo:hi], self.cols[lo:hi] - (end - width), *self._values(lo, hi))
            for lo, hi, end, width in zip(at[:-1], at[1:], ends.tolist(), widths, strict=True)
        ]

    @cached_property
    def best(self) -> float:
        """The best score (-inf without pairs)."""
        return float(self.score.max()) if self.score.size else -np.inf

    def above(self, floor: float) -> GainingPairs:
        """The pairs scoring above ``floor``, in the same order."""
        if floor == -np.inf:
            return self
        if self.best <= floor:
            return _NO_PAIRS
        keep = self.score > floor
        return GainingPairs(self.rows[keep], self.cols[keep], self.gain[keep], self.score[keep])

    def _values(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The gains and scores of the pairs ``lo`` to ``hi``."""
        return self.gain[lo:hi], self.score[lo:hi]

    @classmethod
    def join(cls, parts: list[GainingPairs], widths: list[int]) -> GainingPairs:
        """The pairs of tables side by side, ``widths`` columns each."""
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0, *widths[:-1]]).tolist()
        some = [k for k, p in enumerate(parts) if p.score.size]
        if len(some) <= 1:  # most often: nothing to lay end to end
            p, k = (parts[some[0]], shift[some[0]]) if some else (_NO_PAIRS, 0)
            return cls(p.rows, p.cols + k, p.gain, p.score)
        return cls(
            np.concatenate([p.rows for p in parts]),
            np.concatenate([p.cols + k for p, k in zip(parts, shift, strict=True)]),
            np.concatenate([p.gain for p in parts]),
            np.concatenate([p.score for p in parts]),
        )


_NO_PAIRS = GainingPairs(
    np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), np.zeros(0), np.zeros(0)
)


@dataclass(frozen=True)
class PairCheck:
    """Whether exchanges of pairs of units (positions in the two :class:`Kinds`) are allowed:
    ``alike`` checks what the units of a kind share (allowed nodes, capacity demand, demand, node
    — the same answer for every pair of units of a pair of kinds), ``apart`` what each unit has
    of its own (its hard anti-affinity partners); None when no unit has any."""

    alike: Callable[[np.ndarray, np.ndarray], np.ndarray]
    apart: Callable[[np.ndarray, np.ndarray], np.ndarray] | None

    def __call__(self, xs: np.ndarray, os: np.ndarray) -> np.ndarray:
        """Whether exchanging each pair (``xs[k]``, ``os[k]``) is allowed."""
        ok = self.alike(xs, os)
        if self.apart is not None:
            ok &= self.apart(xs, os)
        return ok


def best_allowed(
    check: PairCheck,
    x: Kinds,
    o: Kinds,
    pairs: GainingPairs,
) -> tuple[float, float, int, int] | None:
    """The allowed pair of units of the best score among ``pairs`` (kinds of ``x`` with kinds of
    ``o``), the lower unit indices first among equal scores: (score, gain, its position in ``x``,
    in ``o``); None if no pair is allowed."""
    if pairs.score.size == 0:
        return None
    # Most often a pair of the best-scoring kinds is allowed.
    best = pairs.score.max()
    top = np.flatnonzero(pairs.score == best)
    if (first := first_allowed(check, x, o, pairs.rows[top], pairs.cols[top])) is not None:
        at_x, at_o, k = first
        return float(best), float(pairs.gain[top[k]]), at_x, at_o
    # Best first: the few best-scoring kind pairs (every pair tied with the last of them)
    # sorted first, the rest only if no pair of units of those is allowed.
    negated = -pairs.score
    for rank in _best_first(negated, PREFIX_KINDS):
        found = _first_in_order(check, x, o, pairs.rows[rank], pairs.cols[rank], -negated[rank])
        if found is not None:
            k, at_x, at_o = found
            return float(pairs.score[rank[k]]), float(pairs.gain[rank[k]]), at_x, at_o
    return None


def _best_first(negated: np.ndarray, head: int) -> Iterable[np.ndarray]:
    """The positions of ``negated`` in increasing order, equal values by position (a stable
    sort), in one or two parts: those up to the ``head``-th smallest value (ties included),
    then the others, each sorted only when asked for."""
    if negated.size <= 2 * head:
        yield np.argsort(negated, kind="stable")
        return
    bound = np.partition(negated, head)[head]
    for part in (np.flatnonzero(negated <= bound), np.flatnonzero(negated > bound)):
        yield part[np.argsort(negated[part], kind="stable")]


def _first_in_order(
    check: PairCheck,
    x: Kinds,
    o: Kinds,
    xk: np.ndarray,
    ok: np.ndarray,
    values: np.ndarray,
) -> tuple[int, int, int] | None:
    """The first allowed pair of units of the kind pairs (``xk``, ``ok``) of scores ``values``
    (best first): by score, then by unit index; which kind pair (its position) and the units'
    positions in ``x`` and ``o``."""
    # The kind pairs whose units are alike enough to be allowed, 256 (and every pair tied
    # with the last of them) at a time; then their pairs of units, in order.
    for begin, end in runs(np.arange(1, xk.size + 1), _tie_ends(values), 256):
        alike = check.alike(x.by_kind[x.start[xk[begin:end]]], o.by_kind[o.start[ok[begin:end]]])
        kept = begin + np.flatnonzero(alike)
        if kept.size == 0:
            continue
        if check.apart is None:
            # Every pair of units of those kinds is allowed: the first of the best.
            best = kept[values[kept] == values[kept[0]]]
            at_x, at_o, k = _lowest_pair(x, o, xk[best], ok[best])
            return int(best[k]), at_x, at_o
        found = _first_apart(check.apart, x, o, (xk[kept], ok[kept]), values[kept])
        if found is not None:
            k, at_x, at_o = found
            return int(kept[k]), at_x, at_o
    return None


def _tie_ends(values: np.ndarray) -> np.ndarray:
    """Where each run of equal ``values`` ends (the position after its last)."""
    return np.flatnonzero(np.append(values[1:] != values[:-1], True)) + 1


def _first_apart(
    apart: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x: Kinds,
    o: Kinds,
    kind_pairs: tuple[np.ndarray, np.ndarray],
    values: np.ndarray,
) -> tuple[int, int, int] | None:
    """:func:`_first_in_order` of the kind pairs ``kind_pairs`` (of ``x``, of ``o``) whose units are
    alike enough to be allowed: the pairs of units best first, by unit index among equal
    scores, checked ``apart`` 256 (and every pair tied with the last of them) at a time."""
    xk, ok = kind_pairs
    for begin, end in runs(np.cumsum(x.count[xk] * o.count[ok]), _tie_ends(values), 256):
        xs, os, kinds = unit_pairs(x, o, xk[begin:end], ok[begin:end])
        order = np.lexsort((o.units[os], x.units[xs], -values[begin:end][kinds]))
        xs, os, kinds = xs[order], os[order], kinds[order]
        for at in range(0, xs.size, 256):
            allowed = apart(xs[at : at + 256], os[at : at + 256])
            if allowed.any():
                pair = at + int(np.argmax(allowed))
                return begin + int(kinds[pair]), int(xs[pair]), int(os[pair])
    return None


def _lowest_pair(x: Kinds, o: Kinds, xk: np.ndarray, ok: np.ndarray) -> tuple[int, int, int]:
    """The first pair of units, by unit index, of the kind pairs (``xk[i]``, ``ok[i]``): its
    positions in ``x`` and ``o``, and ``i`` (a kind's first unit is its lowest)."""
    lowest_x, lowest_o = x.by_kind[x.start[xk]], o.by_kind[o.start[ok]]
    i = int(np.lexsort((o.units[lowest_o], x.units[lowest_x]))[0])
    return int(lowest_x[i]), int(lowest_o[i]), i


def first_allowed(
    check: PairCheck,
    x: Kinds,
    o: Kinds,
    xk: np.ndarray,
    ok: np.ndarray,
) -> tuple[int, int, int] | None:
    """The first allowed pair of units, by unit index, of the kind pairs (``xk[i]``, ``ok[i]``):
    its positions in ``x`` and ``o``, and ``i``. None if no pair is allowed."""
    alike = np.flatnonzero(check.alike(x.by_kind[x.start[xk]], o.by_kind[o.start[ok]]))
    if alike.size == 0:
        return None
    xk, ok = xk[alike], ok[alike]
    # The very first pair, most often allowed.
    at_x, at_o, i = _lowest_pair(x, o, xk, ok)
    if check.apart is None or check.apart(np.array([at_x]), np.array([at_o]))[0]:
        return at_x, at_o, int(alike[i])
    xs, os, kinds = unit_pairs(x, o, xk, ok)
    order = np.lexsort((o.units[os], x.units[xs]))
    allowed = check.apart(xs[order], os[order])
    if not allowed.any():
        return None
    pair = order[int(np.argmax(allowed))]
    return int(xs[pair]), int(os[pair]), int(alike[kinds[pair]])


def runs(reach: np.ndarray, ends: np.ndarray, least: int) -> Iterable[tuple[int, int]]:
    """Runs [begin, end) of kind pairs, each of whole tie groups (``ends``: where each ends) and
    of at least ``least`` pairs of units but the last (``reach``: how many up to each)."""
    begin = 0
    while begin < reach.size:
        done = int(reach[begin - 1]) if begin else 0
        j = int(np.searchsorted(reach[ends - 1], done + least))
        end = int(ends[j]) if j < ends.size else reach.size
        yield begin, end
        begin = end


def unit_pairs(
    x: Kinds, o: Kinds, xk: np.ndarray, ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of units of the kind pairs (``xk[i]``, ``ok[i]``): the positions of the units
    in ``x`` and ``o``, and the kind pair (i) each pair of units is of."""
    sizes = x.count[xk] * o.count[ok]
    kinds = np.repeat(np.arange(xk.size), sizes)
    offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = o.count[ok[kinds]]
    xs = x.by_kind[x.start[xk[kinds]] + offset // width]
    os = o.by_kind[o.start[ok[kinds]] + offset % width]
    return xs, os, kinds


def distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of ``key`` (n, k): one index of each distinct row, and for each row which of
    those it equals."""
    order = np.lexsort(key.T[::-1])
    ranked = key[order]
    new = np.ones(len(key), dtype=bool)
    new[1:] = np.any(ranked[1:] != ranked[:-1], axis=1)
    inverse = np.empty(len(key), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def every(mask: np.ndarray) -> np.ndarray:
    """``mask.all(axis=-1)``, one column at a time (a reduction over a short last axis is slow)."""
    out = mask[..., 0].copy()
    for k in range(1, mask.shape[-1]):
        out &= mask[..., k]
    return out
