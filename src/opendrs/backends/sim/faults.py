"""The scenario's faults, planned at the start of a run: node failures and maintenance as events,
migration failures, hangs and lost answers armed for the migrations they strike, and windows or
odds of API errors (:class:`FaultPlan`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from opendrs.model.units import format_duration

from ..scenario import Fault, Scenario

__all__ = ["FAIL_AFTER", "Armed", "FaultPlan", "MigrationFaults", "NodeFault", "merge_windows"]

#: A migration that fails does so after this share of its duration (drawn uniformly between).
FAIL_AFTER: Final = (0.1, 0.9)

#: A fault armed at a time (``at``, guest) or given odds per migration (probability, guest) — a
#: guest of ``None``: any guest.
Armed = list[tuple[float, str | None]]
#: A node fault to happen: (time, ``node-failure`` or ``maintenance``, node index, duration).
NodeFault = tuple[float, str, int, float | None]
#: What strikes a migration that starts: (it hangs, the reason it will fail or None, its answer
#: is lost).
MigrationFaults = tuple[bool, str | None, bool]


class FaultPlan:
    """The faults of a run: the node faults to schedule (:attr:`node_faults`, in order), the armed
    migration faults (used up as they strike) and the API errors."""

    def __init__(
        self,
        scenario: Scenario,
        end: float,
        node_names: Sequence[str],
        node_index: Mapping[str, int],
    ) -> None:
        self.seed = scenario.seed
        self.end = end
        self.node_names = tuple(node_names)
        self.node_index = node_index
        self.node_faults: list[NodeFault] = []
        self.armed_failures: Armed = []
        self.armed_hangs: Armed = []
        self.armed_lost: Armed = []
        self.hang_odds: Armed = []
        self.lost_odds: Armed = []
        windows: list[tuple[float, float]] = []
        probability = 0.0
        for index, fault in enumerate(scenario.faults):
            probability = self._plan(index, fault, probability, windows)
        #: Windows of API errors (sorted, not overlapping), and the odds of one per call.
        self.windows = merge_windows(windows)
        self.window_starts = [start for start, _ in self.windows]
        self.api_probability = probability
        self.api_rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(scenario.seed, spawn_key=(4,)))
        )

    def _plan(
        self, index: int, fault: Fault, probability: float, windows: list[tuple[float, float]]
    ) -> float:
        """Plan one fault entry; returns the combined per-call API error probability."""
        if fault.type in ("migration-hang", "api-lost-answer"):
            armed = self.armed_hangs if fault.type == "migration-hang" else self.armed_lost
            odds = self.hang_odds if fault.type == "migration-hang" else self.lost_odds
            if fault.probability is not None:
                odds.append((fault.probability, fault.guest))
            elif fault.at is not None:
                armed.append((fault.at, fault.guest))
            return probability
        if fault.probability is not None:  # api-error per call
            return 1.0 - (1.0 - probability) * (1.0 - fault.probability)
        for when, pick in self._times(index, fault):
            node = self.node_index[fault.node] if fault.node is not None else pick
            if fault.type in ("node-failure", "maintenance"):
                self.node_faults.append((when, fault.type, node, fault.duration))
            elif fault.type == "api-error":
                windows.append((when, when + (fault.duration or 0.0)))
            else:  # migration-failure
                self.armed_failures.append((when, fault.guest))
        return probability

    def _times(self, index: int, fault: Fault) -> list[tuple[float, int]]:
        """When a fault entry strikes, and the node a random one picks (-1: none picked)."""
        if fault.at is not None:
            return [(fault.at, -1)]
        candidates = fault.nodes or self.node_names
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(2, index)))
        )
        times: list[tuple[float, int]] = []
        t = 0.0
        while True:
            t += float(rng.exponential(86400.0 / fault.per_day))
            pick = int(rng.integers(len(candidates)))
            if t >= self.end:
                return times
            times.append((t, self.node_index[candidates[pick]]))

    def migration_faults(
        self, gid: str, now: float, draws: Sequence[float], failure_rate: float
    ) -> MigrationFaults:
        """What strikes the controller's migration of ``gid`` starting at ``now``, given its
        draws (failure, hang, lost answer). A hanging migration has no end of its own: a failure
        armed for it waits for the next."""
        draw, hang_draw, lost_draw = draws
        reason: str | None = None
        hangs = self._strikes(self.armed_hangs, self.hang_odds, gid, now, hang_draw)
        if not hangs:
            if disarm(self.armed_failures, gid, now):
                reason = "simulated migration failure (scheduled)"
            elif draw < failure_rate:
                reason = "simulated migration failure"
        lost = self._strikes(self.armed_lost, self.lost_odds, gid, now, lost_draw)
        return hangs, reason, lost

    @staticmethod
    def _strikes(armed: Armed, odds: Armed, gid: str, now: float, draw: float) -> bool:
        """Whether a hang (or a lost answer) strikes a migration of ``gid`` starting now: a
        scheduled one is due, or ``draw`` falls under the combined odds of the entries for it."""
        if disarm(armed, gid, now):
            return True
        miss = 1.0
        for probability, guest in odds:
            if guest is None or guest == gid:
                miss *= 1.0 - probability
        return draw < 1.0 - miss

    def api_error(self, operation: str, now: float) -> str | None:
        """The message of a simulated API error that refuses ``operation`` at ``now``, or None."""
        index = bisect.bisect_right(self.window_starts, now) - 1
        if index >= 0 and now < self.windows[index][1]:
            return (
                f"simulated API error: {operation} failed (the API is unavailable until "
                f"{format_duration(self.windows[index][1])} after the start)"
            )
        if self.api_probability > 0 and self.api_rng.random() < self.api_probability:
            return f"simulated API error: {operation} failed"
        return None


def disarm(armed: Armed, gid: str, now: float) -> bool:
    """Whether a scheduled fault is due for a migration of ``gid`` at ``now`` (it is used up)."""
    for index, (at, guest) in enumerate(armed):
        if at <= now and (guest is None or guest == gid):
            del armed[index]
            return True
    return False


def merge_windows(windows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping windows."""
    out: list[tuple[float, float]] = []
    for start, stop in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out
