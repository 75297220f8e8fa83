"""The requested placements that the target state itself cannot hold.

No order of moves reaches a target state that puts hard negative partners on one node or fills a
node beyond a limit, so this is settled before anything is ordered:

* of two partners heading for one node the lower-ranked stays where it is (a partner that stays
  there, or is already migrating there, wins);
* from a node the target state overfills, incoming units are given up from the lowest rank until
  it fits (those given up needlessly are taken back).

A guest given up stays where it is, which adds to its own node and may meet partners heading
there, so both repeat until the target state is consistent.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .state import Occupancy, Units, UnitState


def unplaceable(units: Units, occupancy: Occupancy) -> dict[int, str]:
    """The pending units the target state cannot hold, each with the sentence that says why."""
    pending = [u for u in range(len(units)) if units.state[u] == UnitState.PENDING]
    if not pending:
        return {}
    return _TargetState(units, occupancy, pending).settle()


class _TargetState:
    """The target state of the pending units, as units are given up."""

    def __init__(self, units: Units, occupancy: Occupancy, pending: list[int]) -> None:
        self.units = units
        self.occupancy = occupancy
        self.pending = pending
        #: The target of every guest of a unit not given up.
        self.final_node: dict[int, int] = {}
        #: The unit of every guest of a pending unit.
        self.unit_of: dict[int, int] = {}
        for u in pending:
            for g in units.guests[u]:
                self.final_node[g] = units.target[u]
                self.unit_of[g] = u
        #: The units given up, with the reason.
        self.dropped: dict[int, str] = {}

    def settle(self) -> dict[int, str]:
        """Give up units until the target state is consistent; returns those given up."""
        work = deque(u for u in self.pending if self.units.partners[u] is not None)
        while True:
            self._separate_partners(work)
            fresh = self._fit_capacity()
            if not fresh:
                break
            for u in fresh:
                if u in self.dropped:
                    work.extend(self._partner_units(u))
            if not work:
                break
        return self.dropped

    def _drop(self, u: int, reason: str) -> None:
        self.dropped[u] = reason
        for g in self.units.guests[u]:
            del self.final_node[g]

    def _partner_units(self, u: int) -> list[int]:
        """The units, not given up, of the hard negative partners of ``u``'s guests."""
        out = []
        for g in self.units.guests[u]:
            for r in self.occupancy.anti_partners.get(g, ()):
                q = self.unit_of.get(r, -1)
                if q >= 0 and q not in self.dropped:
                    out.append(q)
        return out

    # ---------------------------------------------------------------------- anti-affinity

    def _separate_partners(self, work: deque[int]) -> None:
        """Give up one of every two hard negative partners that would meet on a node."""
        units, labels = self.units, self.units.guest_labels
        while work:
            u = work.popleft()
            if u in self.dropped or units.partners[u] is None:
                continue
            conflict = self._partner_conflict(u)
            if conflict is None:
                continue
            p, q, why = conflict
            if q >= 0 and units.rank[q] > units.rank[u]:
                loser = q
                partners_of = self.occupancy.anti_partners
                mine = next(g for g in units.guests[u] if p in partners_of.get(g, ()))
                who, why = labels[mine], "goes there too"
                work.append(u)
            else:
                loser, who = u, labels[p]
            where = self.occupancy.node_names[units.target[u]]
            self._drop(
                loser,
                f"{units.label(loser)} cannot move to {where}: its hard "
                f"anti-affinity partner {who} {why}",
            )
            # Its guests stay where they are, where partners may be heading.
            work.extend(self._partner_units(loser))

    def _partner_conflict(self, u: int) -> tuple[int, int, str] | None:
        """The first partner ``p`` that would share ``u``'s target with it.

        Returns ``p``, the unit moving ``p`` (-1 when ``p`` stays) and what ``p`` does there.
        """
        t = self.units.target[u]
        partners = self.units.partners[u]
        assert partners is not None
        occupancy = self.occupancy
        for p in partners.tolist():
            q = self.unit_of.get(p, -1)
            moving = q >= 0 and q not in self.dropped
            if occupancy.migrating_to[p] == t:
                why = "is migrating there"
            elif moving and self.final_node[p] == t:
                why = "goes there too"
            elif not moving and occupancy.position[p] == t:
                why = "stays there"
            else:
                continue
            return p, q if moving else -1, why
        return None

    # ---------------------------------------------------------------------- capacity

    def _fit_capacity(self) -> list[int]:
        """Give up units heading for a node the target state overfills, lowest rank first.

        Returns the units given up for good in this pass.
        """
        units, occupancy = self.units, self.occupancy
        position, guest_demand = occupancy.position, occupancy.guest_demand
        final = occupancy.committed.copy()
        by_target: dict[int, list[int]] = {}
        for u in self.pending:
            if u in self.dropped:
                continue
            t = units.target[u]
            final[t] += units.demand[u]
            by_target.setdefault(t, []).append(u)
            for g in units.guests[u]:
                final[position[g]] -= guest_demand[g]
        bound = occupancy.bound
        queue = deque(np.nonzero(np.any(final > bound, axis=1))[0].tolist())
        fresh: list[int] = []
        while queue:
            t = queue.popleft()
            if np.any(final[t] > bound[t]):
                fresh += self._relieve(t, final, by_target.get(t, []), queue)
        return fresh

    def _relieve(
        self, t: int, final: np.ndarray, incoming: list[int], queue: deque[int]
    ) -> list[int]:
        """Give up units of ``incoming`` into node ``t`` until it fits; returns those given up.

        ``final`` (the target state's committed capacity) follows; the nodes the guests given up
        stay on join ``queue``.
        """
        units, occupancy = self.units, self.occupancy
        position, guest_demand = occupancy.position, occupancy.guest_demand
        bound = occupancy.bound
        here: list[int] = []
        for u in sorted(incoming, key=units.rank.__getitem__, reverse=True):
            need = final[t] > bound[t]
            if not need.any():
                break
            if u in self.dropped:
                continue
            dims = ", ".join(str(occupancy.dimensions[d]) for d in np.nonzero(need)[0].tolist())
            self._drop(
                u,
                f"{units.label(u)} cannot move to {occupancy.node_names[t]}: the target "
                f"placement leaves no room for it there ({dims})",
            )
            here.append(u)
            final[t] -= units.demand[u]
            for g in units.guests[u]:
                final[position[g]] += guest_demand[g]
                queue.append(int(position[g]))
        given_up: list[int] = []
        for u in reversed(here):  # Take back what was given up needlessly, best first.
            if np.all(final[t] + units.demand[u] <= bound[t]):
                del self.dropped[u]
                final[t] += units.demand[u]
                for g in units.guests[u]:
                    final[position[g]] -= guest_demand[g]
                    self.final_node[g] = t
            else:
                given_up.append(u)
        return given_up
