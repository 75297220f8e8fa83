"""``opendrs simulate --failover-check MODES``: every simulated hour, what a node failure would do.

At each check every node fails in turn, on a copy of the cluster as the simulator has it then
(:meth:`~opendrs.backends.sim.Simulator.peek`; the run itself goes on untouched), and its HA
guests restart, in each of the ``MODES``. An hour when a node is down or in maintenance is
skipped: a further failure would be a second one.

* ``basic``, ``static`` — as Proxmox VE's HA manager recovers them in that scheduler mode
  (:func:`opendrs.compat.pve.recovery.recover_node`: ``select_service_node`` with
  ``best-score``, one relocation after a start with no room);
* ``opendrs`` — as the failover headroom check places them with ``best-fit``
  (:mod:`opendrs.engine.headroom`: each on the best node with room for it, biggest first), which
  ``policy.keep_failover`` keeps with ``failover_recovery: best-fit`` and the simulator's own HA
  manager follows.

The probe counts the failures that leave an HA guest down and the guests they leave down. The
scenario's own node failures are recovered by the simulator's HA manager
(:mod:`opendrs.backends.sim`) and counted apart (``ha_unrestartable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Final

from opendrs.compat.pve.recovery import recover_node
from opendrs.engine.headroom import failover_headroom
from opendrs.engine.policy.failover import placement_key
from opendrs.model.cluster import Cluster

__all__ = ["EVERY", "MODES", "FailoverProbe", "Tally", "stranded_by_failure"]

#: Simulated seconds between two checks.
EVERY: Final = 3600.0
#: How the failed node's HA guests restart (the module docstring).
MODES: Final = ("basic", "static", "opendrs")


@dataclass
class Tally:
    """What the node failures tried in one mode left down."""

    #: Node failures tried, and those that left at least one HA guest down (held guests aside).
    cases: int = 0
    short_cases: int = 0
    #: The HA guests left down, summed over the failures, and the most one failure left.
    stranded: int = 0
    worst: int = 0
    #: HA guests that may not start elsewhere at all, summed over the failures tried.
    held: int = 0

    def add(self, stranded: int, held: int) -> None:
        self.cases += 1
        self.short_cases += stranded > 0
        self.stranded += stranded
        self.worst = max(self.worst, stranded)
        self.held += held


def stranded_by_failure(cluster: Cluster, mode: str) -> list[tuple[int, int]]:
    """For each online node failing alone: (HA guests left down, HA guests held) in ``mode``;
    empty when fewer than two nodes are online."""
    online = [n.name for n in cluster.nodes if n.online]
    if len(online) < 2:
        return []
    if mode == "opendrs":
        cases = failover_headroom(cluster, 1).cases
        return [(len(c.stranded) - len(c.held), len(c.held)) for c in cases]
    assert mode in ("basic", "static")
    recoveries = (recover_node(cluster, name, mode) for name in online)
    return [(len(r.stranded), len(r.held)) for r in recoveries]


@dataclass
class FailoverProbe:
    """The checks of one run and what they found, mode by mode."""

    modes: Sequence[str]
    every: float = EVERY
    next_at: float = 0.0
    #: Hours checked, and hours not checked because a node was down or in maintenance then
    #: (a further failure would be a second one).
    checks: int = 0
    skipped: int = 0
    tallies: dict[str, Tally] = field(default_factory=dict)
    _kept: tuple[object, dict[str, list[tuple[int, int]]]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"failover modes: {', '.join(unknown) or 'none'} (known: {MODES})")
        self.tallies = {mode: Tally() for mode in self.modes}

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def check(self, now: float, cluster: Cluster) -> None:
        """Fail each node of ``cluster`` in turn and count what its recovery leaves; nothing
        while a node is down or in maintenance."""
        self.next_at = now + self.every
        if not all(n.usable for n in cluster.nodes):
            self.skipped += 1
            return
        self.checks += 1
        for mode, cases in self._cases(cluster).items():
            for stranded, held in cases:
                self.tallies[mode].add(stranded, held)

    def _cases(self, cluster: Cluster) -> dict[str, list[tuple[int, int]]]:
        """:func:`stranded_by_failure` in every mode; the last ones again when neither the
        placement nor the nodes changed and capacity counts no measured use (the cluster's
        ``mode`` is not ``dynamic``)."""
        key = placement_key(cluster) if cluster.settings.mode != "dynamic" else None
        if key is not None and self._kept is not None and self._kept[0] == key:
            return self._kept[1]
        cases = {mode: stranded_by_failure(cluster, mode) for mode in self.modes}
        self._kept = None if key is None else (key, cases)
        return cases

    def as_dict(self) -> dict[str, object]:
        return {
            "checks": self.checks,
            "skipped": self.skipped,
            **{mode: asdict(tally) for mode, tally in self.tallies.items()},
        }
