"""The statistics of a run's steps, for the stability report (:class:`StepStatistics`).

They follow :mod:`opendrs.engine.usage` exactly, vectorised over steps: the balance statistics use
dynamic-mode loads (the host's base load plus the measured use of the guests that load the node)
over the capacity net of reserves; capacity violations follow
:class:`~opendrs.engine.usage.CapacityModel`.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from opendrs.engine.usage import safe_divide, tolerance

__all__ = [
    "HOT",
    "HOT_WINDOW",
    "Fractions",
    "StepStatistics",
    "over_capacity",
    "percentile",
    "steps_in",
]

#: The load fraction above which a node runs hot, and the window its load is averaged over for it.
HOT: Final = 0.85
HOT_WINDOW: Final = 300.0
#: Node load fractions (cpu, memory), each (nodes, steps).
Fractions = tuple[np.ndarray, np.ndarray]


def steps_in(seconds: float, step: float) -> int:
    """The whole steps a window of ``seconds`` averages over (at least one: the step itself)."""
    return max(1, round(seconds / step))


def percentile(parts: list[np.ndarray], q: float) -> float:
    """The ``q``-th percentile of the values of ``parts`` together (0 when there are none)."""
    values = np.concatenate(parts) if parts else np.zeros(0)
    return float(np.percentile(values, q)) if values.size else 0.0


def over_capacity(
    cpu: np.ndarray, mem: np.ndarray, cap: np.ndarray, cfg_over: np.ndarray, *, dynamic: bool
) -> np.ndarray:
    """The (node, step) pairs over a hard capacity limit, (nodes, steps): a configured one
    (``cfg_over``, per node), or in dynamic mode the measured ``cpu`` or ``mem`` (each (nodes,
    steps)) above the capacity ``cap`` (nodes, 2)."""
    over = np.broadcast_to(cfg_over[:, None], cpu.shape)
    if dynamic:
        cap_cpu = cap[:, 0:1]
        cap_mem = cap[:, 1:2]
        over = over | (cpu > cap_cpu + tolerance(cap_cpu)) | (mem > cap_mem + tolerance(cap_mem))
    return over


class StepStatistics:
    """The figures of the steps recorded so far: the balance spread of each (on loads averaged
    over ``window_steps``), the steps each node ran hot (averaged over ``hot_steps``), each step's
    most loaded node, the highest load and the capacity violations."""

    def __init__(
        self,
        n_nodes: int,
        *,
        weights: tuple[float, float],
        dynamic: bool,
        hot: float,
        window_steps: int,
        hot_steps: int,
    ) -> None:
        self.weights = weights
        self.dynamic = dynamic
        self.hot = hot
        self.spreads: list[np.ndarray] = []
        #: Steps averaged for the spread and for the hot level, and the node fractions (cpu,
        #: memory) of the last steps the longer of the two needs.
        self.window_steps = window_steps
        self.hot_steps = hot_steps
        self.tail: Fractions | None = None
        #: Per node, the steps it ran hot; per step, the most loaded online node's load.
        self.hot_count = np.zeros(n_nodes, dtype=np.int64)
        self.peaks: list[np.ndarray] = []
        self.violations = 0
        self.max_load = 0.0

    def record(
        self,
        cpu: np.ndarray,
        mem: np.ndarray,
        cap: np.ndarray,
        *,
        usable: np.ndarray,
        online: np.ndarray,
        cfg_over: np.ndarray,
    ) -> np.ndarray:
        """Record steps whose node loads are ``cpu`` and ``mem`` (each (nodes, steps)), on
        capacities ``cap`` (nodes, 2); ``cfg_over``: the nodes over a configured limit. The
        (node, step) pairs over capacity, (nodes, steps)."""
        cap_cpu = cap[:, 0:1]
        cap_mem = cap[:, 1:2]
        f_cpu = safe_divide(cpu, cap_cpu)
        f_mem = safe_divide(mem, cap_mem)
        averaged, short = self.averaged(f_cpu, f_mem)
        self.count_hot(short, online)
        self.spreads.append(self.spread(averaged, usable))
        if online.any():
            both = np.concatenate((f_cpu[online], f_mem[online]))
            both = both[np.isfinite(both)]
            if both.size:
                self.max_load = max(self.max_load, float(both.max()))
        over = over_capacity(cpu, mem, cap, cfg_over, dynamic=self.dynamic)
        self.violations += int(np.count_nonzero(over))
        return over

    def spread(self, averaged: Fractions, usable: np.ndarray) -> np.ndarray:
        """The balance spread of each step: the largest of the weighted resources' max − min
        over the usable nodes (0 with fewer than two known)."""
        spread = np.zeros(averaged[0].shape[1])
        for fractions, weight in ((averaged[0], self.weights[0]), (averaged[1], self.weights[1])):
            if weight <= 0:
                continue
            values = fractions[usable]
            if values.shape[0] < 2:
                continue
            finite = np.isfinite(values)
            high = np.where(finite, values, -np.inf).max(axis=0)
            low = np.where(finite, values, np.inf).min(axis=0)
            spread = np.maximum(spread, np.where(finite.sum(axis=0) >= 2, high - low, 0.0))
        return spread

    def averaged(self, f_cpu: np.ndarray, f_mem: np.ndarray) -> tuple[Fractions, Fractions]:
        """Node fractions (cpu, memory), each (N, steps), averaged over the window ending at each
        step: the spread's window, and the hot level's."""
        keep = max(self.window_steps, self.hot_steps) - 1
        out: list[np.ndarray] = []
        short: list[np.ndarray] = []
        tails: list[np.ndarray] = []
        for k, block in enumerate((f_cpu, f_mem)):
            tail = self.tail[k] if self.tail is not None else block[:, :0]
            joined = np.concatenate((tail, block), axis=1)
            sums = np.cumsum(np.concatenate((np.zeros((joined.shape[0], 1)), joined), axis=1), 1)
            ends = np.arange(tail.shape[1] + 1, joined.shape[1] + 1)
            for w, into in ((self.window_steps, out), (self.hot_steps, short)):
                if w <= 1:
                    into.append(block)
                    continue
                starts = np.maximum(ends - w, 0)
                with np.errstate(invalid="ignore"):
                    into.append((sums[:, ends] - sums[:, starts]) / (ends - starts))
            tails.append(joined[:, max(joined.shape[1] - keep, 0) :])
        self.tail = (tails[0], tails[1])
        return (out[0], out[1]), (short[0], short[1])

    def count_hot(self, fractions: Fractions, online: np.ndarray) -> None:
        """Count the steps each online node ran above the hot level, and keep each step's most
        loaded node's load (fractions averaged over the hot window; unknown ones left out)."""
        load = np.fmax(fractions[0][online], fractions[1][online])
        load = np.where(np.isfinite(load), load, np.nan)
        steps = load.shape[1]
        if not load.shape[0]:
            self.peaks.append(np.zeros(steps))
            return
        self.hot_count[online] += np.count_nonzero(load > self.hot, axis=1)
        known = np.isfinite(load).any(axis=0)
        peak = np.zeros(steps)
        peak[known] = np.nanmax(load[:, known], axis=0)
        self.peaks.append(peak)
