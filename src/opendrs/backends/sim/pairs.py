"""(guest, node) pairs: per-guest values added up per node without a dense matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Pairs"]


@dataclass(frozen=True, slots=True)
class Pairs:
    """(guest, node) pairs, to add per-guest values up per node without a dense matrix."""

    n_nodes: int
    #: Pairs in guest order (as :func:`opendrs.engine.usage.accumulate` adds them).
    guest: np.ndarray
    node: np.ndarray
    #: The same pairs grouped by node, for :func:`numpy.add.reduceat`.
    grouped: np.ndarray
    starts: np.ndarray
    present: np.ndarray

    @classmethod
    def build(cls, nodes_of: Sequence[tuple[int, ...]], n_nodes: int) -> Pairs:
        guest = np.array([j for j, nodes in enumerate(nodes_of) for _ in nodes], dtype=np.intp)
        node = np.array([n for nodes in nodes_of for n in nodes], dtype=np.intp)
        order = np.argsort(node, kind="stable")
        by_node = node[order]
        starts = np.flatnonzero(np.r_[True, by_node[1:] != by_node[:-1]]) if node.size else node
        return cls(n_nodes, guest, node, guest[order], starts, by_node[starts])

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Per node, the sum of ``values`` (guests first) over the guests paired with it."""
        if values.ndim == 1:
            return np.bincount(self.node, weights=values[self.guest], minlength=self.n_nodes)
        out = np.zeros((self.n_nodes, *values.shape[1:]))
        if self.guest.size:
            out[self.present] = np.add.reduceat(values[self.grouped], self.starts, axis=0)
        return out
