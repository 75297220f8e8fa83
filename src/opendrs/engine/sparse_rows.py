"""Per-guest tables that most guests share a row of, stored once per distinct row.

At scale most guests are named by no rule: their node-affinity, forbidden and partner rows are
all the same. A dense guests × nodes array of them is 100 MB at 100,000 guests and 1,000 nodes;
stored by distinct row it is one index per guest and a few rows.

* :class:`RowMask` — a (G, N) boolean matrix as a per-guest index into a table of distinct rows;
  indexed as a NumPy array is (``m[j]``, ``m[j, n]``, ``m[rows]``, ``m[rows, cols]``);
* :class:`Partners` — per guest, a sorted array of other guests' indices, as one flat array.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from opendrs.engine.distinct import distinct


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class RowMask:
    """A (G, N) boolean matrix: the row of guest ``j`` is ``table[index[j]]``.

    Indexing gathers rows on demand and gives what the dense array would (row views are
    read-only: a row is shared by every guest that has it). :meth:`dense` builds the array for
    the places that need all of it at once (exact solvers, small clusters).
    """

    #: (G,) which table row each guest has.
    index: np.ndarray
    #: (K, N) the distinct rows.
    table: np.ndarray

    # NumPy operators on a RowMask would build object arrays: refuse them instead.
    __array_ufunc__ = None

    @classmethod
    def build(cls, index: np.ndarray, table: np.ndarray) -> RowMask:
        """The mask whose row ``j`` is ``table[index[j]]``, keeping one copy of each distinct
        row that some guest has (in the order of their bytes)."""
        index = np.asarray(index, dtype=np.intp)
        table = np.asarray(table, dtype=bool)
        used, inverse = np.unique(index, return_inverse=True)
        rows = table[used]
        if not rows.shape[1]:  # no nodes: every row is the empty one
            return cls(_frozen(np.zeros(len(index), np.intp)), _frozen(rows[: min(1, len(rows))]))
        # Equal rows, one id: compare them packed into one bytes value each.
        packed = np.ascontiguousarray(np.packbits(rows, axis=1))
        values = packed.view(f"V{packed.shape[1]}").ravel()
        _values, same, row_of_used = np.unique(values, return_index=True, return_inverse=True)
        return cls(
            _frozen(row_of_used.ravel()[inverse.ravel()].astype(np.intp)),
            _frozen(np.ascontiguousarray(rows[same])),
        )

    @classmethod
    def full(cls, n_rows: int, row: np.ndarray) -> RowMask:
        """``n_rows`` rows equal to ``row``."""
        return cls.build(np.zeros(n_rows, dtype=np.intp), np.asarray(row, dtype=bool)[None, :])

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.index), self.table.shape[1])

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            rows, cols = key
            return self.table[self.index[rows], cols]
        return self.table[self.index[key]]

    def with_row(self, row: np.ndarray) -> RowMask:
        """This mask with one more guest, whose row is ``row`` (N,): the table's row equal to
        it, or a new one at the end of the table."""
        row = np.asarray(row, dtype=bool)
        equal = np.flatnonzero((self.table == row[None, :]).all(axis=1))
        table = self.table if equal.size else _frozen(np.vstack([self.table, row[None, :]]))
        at = int(equal[0]) if equal.size else len(self.table)
        return RowMask(_frozen(appended(self.index, at)), table)

    def dense(self) -> np.ndarray:
        """The (G, N) array."""
        return self.table[self.index]

    def row_all(self) -> np.ndarray:
        """(G,) rows that are true everywhere."""
        return self.table.all(axis=1)[self.index]

    def row_any(self) -> np.ndarray:
        """(G,) rows with a true somewhere."""
        return self.table.any(axis=1)[self.index]

    def __invert__(self) -> RowMask:
        return RowMask(self.index, _frozen(~self.table))

    def distinct(self) -> np.ndarray:
        """(G,) for each row, its rank among the distinct rows present, ordered by their bytes
        packed eight columns to one — as ``np.unique`` over the packed rows numbers them."""
        used, inverse = np.unique(self.index, return_inverse=True)
        packed = np.packbits(self.table[used], axis=1)
        if not packed.shape[1]:
            return np.zeros(len(self.index), dtype=np.intp)
        values = np.ascontiguousarray(packed).view(f"V{packed.shape[1]}").ravel()
        rank = np.unique(values, return_inverse=True)[1].ravel()
        return rank[inverse.ravel()].astype(np.intp)

    @staticmethod
    def combine(masks: list[RowMask], usable: np.ndarray) -> RowMask:
        """``usable[None, :] & masks[0] & masks[1] & …``, row by row, each distinct combination
        of rows computed once."""
        key = np.zeros(len(masks[0].index), dtype=np.int64)
        for mask in masks:
            key = key * len(mask.table) + mask.index
        combos, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        table = np.broadcast_to(np.asarray(usable, dtype=bool), (len(combos), len(usable))).copy()
        for mask in masks:
            table &= mask.table[mask.index[first]]
        return RowMask.build(inverse.ravel(), table)


@dataclass(frozen=True, eq=False)
class Partners:
    """Per guest, a sorted array of guest indices (its partners under some rule).

    ``partners[j]`` is a read-only view into one flat array, as the list of arrays it stands for
    would give it."""

    #: (G + 1,) where each guest's partners start in :attr:`flat`.
    start: np.ndarray
    #: Every guest's partners, one after the other.
    flat: np.ndarray

    @classmethod
    def from_pairs(cls, n_guests: int, guest: np.ndarray, partner: np.ndarray) -> Partners:
        """From (guest, partner) pairs, duplicates and pairs of a guest with itself dropped."""
        guest = np.asarray(guest, dtype=np.int64)
        partner = np.asarray(partner, dtype=np.int64)
        keep = guest != partner
        pairs = distinct(guest[keep] * max(n_guests, 1) + partner[keep])
        owner = pairs // max(n_guests, 1)
        start = np.zeros(n_guests + 1, dtype=np.intp)
        np.cumsum(np.bincount(owner, minlength=n_guests), out=start[1:])
        return cls(_frozen(start), _frozen((pairs % max(n_guests, 1)).astype(np.intp)))

    @classmethod
    def within(cls, n_guests: int, sets: list[np.ndarray]) -> Partners:
        """Every member of each of ``sets`` partnered with the other members of it."""
        return cls.from_pairs(n_guests, *pairs_within(sets))

    def __len__(self) -> int:
        return len(self.start) - 1

    def __getitem__(self, j: int) -> np.ndarray:
        return self.flat[self.start[j] : self.start[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[j] for j in range(len(self)))

    def with_row(self, partners: np.ndarray) -> Partners:
        """These partners with one more guest's, ``partners`` (sorted indices); the others'
        rows are unchanged (they do not name the new guest)."""
        start = appended(self.start, self.start[-1] + len(partners))
        flat = np.concatenate([self.flat, np.asarray(partners, dtype=self.flat.dtype)])
        return Partners(_frozen(start), _frozen(flat))

    def with_rows(self, rows: Mapping[int, np.ndarray]) -> Partners:
        """These partners with the rows of the guests ``rows`` names (each its sorted partner
        indices) replaced; a row at index ``len(self)`` is one more guest's."""
        n_guests = len(self)
        counts = np.zeros(max(n_guests, max(rows, default=-1) + 1), dtype=np.intp)
        counts[:n_guests] = self.counts()
        pieces, done = [], 0
        for j in sorted(rows):
            row = np.asarray(rows[j], dtype=self.flat.dtype)
            pieces += [self.flat[self.start[done] : self.start[min(j, n_guests)]], row]
            counts[j] = len(row)
            done = min(j + 1, n_guests)
        pieces.append(self.flat[self.start[done] :])
        start = np.zeros(len(counts) + 1, dtype=np.intp)
        np.cumsum(counts, out=start[1:])
        return Partners(_frozen(start), _frozen(np.concatenate(pieces)))

    def counts(self) -> np.ndarray:
        """(G,) how many partners each guest has."""
        return np.diff(self.start)

    def having(self) -> np.ndarray:
        """The guests with at least one partner, in order."""
        return np.nonzero(self.counts())[0]


def appended(array: np.ndarray, value: object) -> np.ndarray:
    """A copy of the 1-D ``array`` with ``value`` after its last item, of its dtype."""
    out = np.empty(len(array) + 1, dtype=array.dtype)
    out[:-1] = array
    out[-1] = value
    return out


def pairs_within(sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(guest, partner) index arrays: every pair of members of each of ``sets`` (a member
    with itself too)."""
    if not sets:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    guest = np.concatenate([np.repeat(s, len(s)) for s in sets]).astype(np.intp)
    partner = np.concatenate([np.tile(s, len(s)) for s in sets]).astype(np.intp)
    return guest, partner


__all__ = ["Partners", "RowMask", "appended", "pairs_within"]
