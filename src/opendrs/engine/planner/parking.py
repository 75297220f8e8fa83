"""Deadlock breaking: what the planner does when no pending unit can move, parking included.

When a step can take nothing, every pending unit waits for another one: the plan is **stuck**.
:meth:`DeadlockBreaker.break_deadlock` then, in this order:

1. makes ready the waiting units that fit at their target now (a parking move that no longer fits
   its spare is dropped instead: its guest waits where it is);
2. gives up the **hopeless** units — those that cannot arrive even if every pending move off
   their target ran first, or whose hard negative partner stays on the target — repeatedly, until
   what remains waits only in cycles;
3. breaks the cycles by **parking**. In a cycle unit A waits for room that unit B frees, B for room
   that A frees (e.g. a swap of two guests between two full nodes). One member moves to a spare
   node and later on to its own target: two moves, the first flagged ``parking``.

The member parked is one whose departure lets a waiting unit in at once, then the one cheapest to
copy (memory and local disks), then by rank. The spare is a usable node that passes the member's
static constraints, its capacity (transit counted), its hard anti-affinity and the migration
limits, is not a source or target of the cycle's moves, and keeps the most headroom — measured
against the larger of its load now and its load once the plan is done — then the name. The parked
guest's own final move then ranks last, so the room it left keeps the whole cycle moving: one
parking move per cycle.

One stuck state may hold many cycles: one guest is parked per node-disjoint cycle, up to
``max_parallel`` migrations (they share the next step); what is left of the step opens further
"holes" in cycles already opened (at most ``max_node_inflow`` per node), so that a long ring of
full nodes moves at several places at once. A guest is parked at most once; a cycle none of whose
members can be parked is unreachable.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from opendrs.engine.distinct import distinct
from opendrs.model.cluster import Cluster

from ..constraints import Constraints
from .state import LAST_RANK, PARK_RANK, Occupancy, Queues, UnitKind, Units, UnitState


class Grouped:
    """Values grouped by an integer key, each group in the values' original order."""

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.values = values[order]

    def get(self, key: int) -> list[int]:
        lo = int(np.searchsorted(self.keys, key, side="left"))
        hi = int(np.searchsorted(self.keys, key, side="right"))
        return self.values[lo:hi].tolist()


@dataclass
class ParkingRound:
    """Reservations of the parking moves chosen in one deadlock round (they share a step)."""

    committed: np.ndarray
    inflow: np.ndarray
    #: Committed capacity once every pending move has run (the spare's load to come).
    final: np.ndarray
    #: Migrations reserved in the round.
    count: int = 0
    #: Guest -> the spare it is parked on in this round.
    parked_on: dict[int, int] = field(default_factory=dict)
    #: Node -> parking moves leaving it in this round.
    holes: dict[int, int] = field(default_factory=dict)

    def reserve(
        self, guests: tuple[int, ...], sources: set[int], spare: int, demand: np.ndarray
    ) -> None:
        """Reserve the parking of ``guests`` (with ``demand``) from ``sources`` on ``spare``."""
        self.committed[spare] += demand
        self.inflow[spare] += len(guests)
        self.count += len(guests)
        for g in guests:
            self.parked_on[g] = spare
        for s in sources:
            self.holes[s] = self.holes.get(s, 0) + 1


@dataclass
class _Stuck:
    """The pending units of a stuck plan, and what their moves would free."""

    #: The pending units, parking moves left out, by rank.
    units: np.ndarray
    #: Their targets.
    targets: np.ndarray
    #: Those not given up (an ordered set, by rank).
    alive: dict[int, None]
    #: Their guests, and the unit of each, by rank.
    movers: np.ndarray
    mover_units: list[int]
    #: The unit of every guest still moving.
    moving: dict[int, int]
    #: The demand (nodes × dimensions) of the guests that would leave each node.
    leaving: np.ndarray
    #: The units by target node.
    by_target: Grouped


class DeadlockBreaker:
    """Breaks the deadlocks of one planning run (see the module).

    It reads and changes the run's ``units``, ``occupancy`` and ``queues``; ``give_up(u, reason)``
    gives up unit ``u`` as unreachable (``reason`` a sentence for the plan's problems, or None),
    and ``problems`` collects the sentences about cycles that cannot be broken.
    """

    def __init__(
        self,
        cluster: Cluster,
        constraints: Constraints,
        units: Units,
        occupancy: Occupancy,
        queues: Queues,
        *,
        max_parallel: int,
        max_inflow: int,
        give_up: Callable[[int, str | None], None],
        problems: list[str],
    ) -> None:
        self.cluster = cluster
        self.constraints = constraints
        self.units = units
        self.occupancy = occupancy
        self.queues = queues
        self.max_parallel = max_parallel
        self.max_inflow = max_inflow
        self.give_up = give_up
        self.problems = problems
        #: Parking moves made so far (they rank in this order).
        self.parked_count = 0

    def break_deadlock(self) -> bool:
        """Nothing could move: give up hopeless units, or park a member of a cycle.

        Returns whether anything changed (then the next step can make progress).
        """
        units = self._stuck_units()
        if self._promote_fitting(units):
            return True
        stuck = self._stuck(units)
        if self._give_up_hopeless(stuck):
            self.queues.drop_settled()
            return True
        return self._park_cycles(stuck)

    # ---------------------------------------------------------------------- the stuck state

    def _stuck_units(self) -> np.ndarray:
        """The pending waiting units by rank; stale parking moves among them are cancelled."""
        units = self.units
        waiting = np.fromiter(
            itertools.chain.from_iterable(self.queues.waiting), dtype=np.intp, count=-1
        )
        stuck = distinct(waiting[units.state[waiting] == UnitState.PENDING])
        # A parking move that no longer fits its spare is dropped; its guest waits where it is.
        for u in stuck[units.rank_array[stuck] < 0].tolist():
            units.set_state(u, UnitState.CANCELLED)
        stuck = stuck[units.rank_array[stuck] >= 0]
        return stuck[np.argsort(units.rank_array[stuck], kind="stable")]

    def _promote_fitting(self, stuck: np.ndarray) -> bool:
        """Make ready the ``stuck`` units that fit at their target now; whether there were any."""
        units, occupancy = self.units, self.occupancy
        targets = units.target_array[stuck]
        fits = np.all(
            occupancy.committed[targets] + units.demand[stuck] <= occupancy.bound[targets], axis=1
        )
        promoted = False
        for u in stuck[fits].tolist():
            if not occupancy.holds_partner(units.partners[u], units.target[u]):
                self.queues.promote(u)
                promoted = True
        return promoted

    def _stuck(self, stuck: np.ndarray) -> _Stuck:
        units, occupancy = self.units, self.occupancy
        mover_units: list[int] = []
        mover_guests: list[int] = []
        for u in stuck.tolist():
            for g in units.guests[u]:
                mover_units.append(u)
                mover_guests.append(g)
        movers = np.array(mover_guests, dtype=np.intp)
        leaving = np.zeros((len(occupancy.node_names), len(occupancy.dimensions)))
        np.add.at(leaving, occupancy.position[movers], occupancy.guest_demand[movers])
        targets = units.target_array[stuck]
        return _Stuck(
            units=stuck,
            targets=targets,
            alive=dict.fromkeys(stuck.tolist()),
            movers=movers,
            mover_units=mover_units,
            moving=dict(zip(mover_guests, mover_units, strict=True)),
            leaving=leaving,
            by_target=Grouped(targets, stuck),
        )

    # ---------------------------------------------------------------------- hopeless units

    def _give_up_hopeless(self, stuck: _Stuck) -> bool:
        """Give up hopeless units, until what is left waits only on units that can still move.

        Returns whether any was given up.
        """
        units, occupancy = self.units, self.occupancy
        committed, bound, targets = occupancy.committed, occupancy.bound, stuck.targets
        leaving, alive = stuck.leaving, stuck.alive
        suspects = np.any(
            committed[targets] - leaving[targets] + units.demand[stuck.units] > bound[targets],
            axis=1,
        )
        work = deque(
            u
            for u, bad in zip(stuck.units.tolist(), suspects.tolist(), strict=True)
            if bad or units.partners[u] is not None
        )
        removed = False
        while work:
            u = work.popleft()
            if u not in alive:
                continue
            reason = self._why_hopeless(u, leaving, stuck.moving)
            if reason is None:
                continue
            del alive[u]
            sources = set()
            for g in units.guests[u]:
                leaving[occupancy.position[g]] -= occupancy.guest_demand[g]
                stuck.moving.pop(g, None)
                sources.add(int(occupancy.position[g]))
            self.give_up(u, reason)
            removed = True
            for s in sorted(sources):
                work.extend(v for v in stuck.by_target.get(s) if v in alive)
        return removed

    def _why_hopeless(self, u: int, leaving: np.ndarray, moving: dict[int, int]) -> str | None:
        """Why unit ``u`` cannot arrive even if every pending move off its target ran first."""
        units, occupancy = self.units, self.occupancy
        t = units.target[u]
        need = occupancy.committed[t] - leaving[t] + units.demand[u] > occupancy.bound[t]
        label, where = units.label(u), occupancy.node_names[t]
        if need.any():
            dims = ", ".join(str(occupancy.dimensions[d]) for d in np.nonzero(need)[0].tolist())
            return (
                f"{label} cannot move to {where}: not enough room there ({dims}) "
                "even after every planned move off it"
            )
        partners = units.partners[u]
        if partners is not None:
            for p in partners.tolist():
                if occupancy.migrating_to[p] == t:
                    return (
                        f"{label} cannot move to {where}: its hard anti-affinity partner "
                        f"{units.guest_labels[p]} is migrating there"
                    )
                if occupancy.position[p] == t and p not in moving:
                    return (
                        f"{label} cannot move to {where}: its hard anti-affinity partner "
                        f"{units.guest_labels[p]} stays there"
                    )
        return None

    # ---------------------------------------------------------------------- cycles

    def _park_cycles(self, stuck: _Stuck) -> bool:
        """Walk "waits for" edges from each unit and park one member of each cycle found.

        Pass 1 parks one guest per node-disjoint cycle; pass 2 spends what is left of the step on
        more "holes" in the cycles already opened (at most ``max_node_inflow`` per node), which
        lets long rings move at several places at once. When nothing can be parked, the first
        cycle found that cannot be broken is given up. Returns whether anything changed.
        """
        occupancy = self.occupancy
        by_source = Grouped(
            occupancy.position[stuck.movers], np.array(stuck.mover_units, dtype=np.intp)
        )
        final = occupancy.committed - stuck.leaving
        np.add.at(final, stuck.targets, self.units.demand[stuck.units])
        n_nodes = len(occupancy.node_names)
        round_ = ParkingRound(occupancy.committed.copy(), np.zeros(n_nodes, dtype=np.int64), final)
        excluded: set[int] = set()
        touched: set[int] = set()
        first_unbreakable: list[int] | None = None
        for disjoint in (True, False):
            seen: set[int] = set()
            for start in stuck.alive:
                if round_.count >= self.max_parallel:
                    break
                if start in seen or start in excluded:
                    continue
                cycle = self._find_cycle(start, stuck, by_source, excluded, seen)
                if cycle is None:
                    continue
                nodes = self._cycle_nodes(cycle)
                if disjoint and nodes & touched:
                    continue
                if self._park(cycle, nodes, stuck, round_, extra_hole=not disjoint):
                    excluded.update(cycle)
                    touched |= nodes
                elif disjoint and first_unbreakable is None:
                    first_unbreakable = cycle
            if not round_.count:
                break
        if round_.count:
            return True
        if first_unbreakable is not None:
            self._give_up_cycle(first_unbreakable)
            return True
        return False

    def _find_cycle(
        self,
        start: int,
        stuck: _Stuck,
        by_source: Grouped,
        excluded: set[int],
        seen: set[int],
    ) -> list[int] | None:
        """The cycle that the "waits for" walk from ``start`` runs into, if it is a new one.

        The units walked join ``seen``; a walk that reaches a unit seen or excluded ends there.
        """
        path: list[int] = []
        index: dict[int, int] = {}
        cur: int | None = start
        cycle: list[int] | None = None
        while cur is not None:
            if cur in index:
                cycle = path[index[cur] :]
                break
            if cur in seen or cur in excluded:
                break
            index[cur] = len(path)
            path.append(cur)
            cur = self._successor(cur, stuck, by_source, excluded)
        seen.update(path)
        return cycle

    def _successor(
        self, u: int, stuck: _Stuck, by_source: Grouped, excluded: set[int]
    ) -> int | None:
        """The best-ranked pending unit that ``u`` waits for (one leaving ``u``'s target)."""
        units, position = self.units, self.occupancy.position
        t = units.target[u]
        if self.occupancy.holds_partner(units.partners[u], t):
            partners = units.partners[u]
            assert partners is not None
            moving = stuck.moving
            waits = sorted(
                {moving[p] for p in partners.tolist() if position[p] == t and p in moving},
                key=units.rank.__getitem__,
            )
        else:
            waits = by_source.get(t)
        for v in waits:
            if v in stuck.alive and v not in excluded and v != u:
                return v
        return None

    def _cycle_nodes(self, cycle: list[int]) -> set[int]:
        """The sources and targets of a cycle's moves."""
        units, position = self.units, self.occupancy.position
        nodes: set[int] = set()
        for u in cycle:
            nodes.add(units.target[u])
            nodes.update(int(position[g]) for g in units.guests[u])
        return nodes

    def _give_up_cycle(self, cycle: list[int]) -> None:
        """Give up every member of a cycle none of whose members can be parked."""
        units, names = self.units, self.occupancy.node_names
        members = ", ".join(
            f"{units.label(u)} ({self._source_names(u)} → {names[units.target[u]]})" for u in cycle
        )
        self.problems.append(
            f"Cycle {members} cannot be broken: no spare node can take one of its guests safely"
        )
        for u in cycle:
            self.give_up(u, None)
        self.queues.drop_settled()

    def _source_names(self, u: int) -> str:
        names, position = self.occupancy.node_names, self.occupancy.position
        return "+".join(dict.fromkeys(names[int(position[g])] for g in self.units.guests[u]))

    # ---------------------------------------------------------------------- parking

    def _park(
        self,
        cycle: list[int],
        cycle_nodes: set[int],
        stuck: _Stuck,
        round_: ParkingRound,
        *,
        extra_hole: bool = False,
    ) -> bool:
        """Park one member of ``cycle`` on a spare node; False when none can be parked.

        With ``extra_hole`` the cycle shares nodes with one parked already in this round: only a
        member leaving a node with fewer than ``max_node_inflow`` holes this round is parked.
        """
        for v in self._parking_candidates(cycle, stuck, round_, extra_hole):
            spare = self._spare(v, cycle_nodes, round_)
            if spare is not None:
                self._park_on(v, spare, round_)
                return True
        return False

    def _parking_candidates(
        self, cycle: list[int], stuck: _Stuck, round_: ParkingRound, extra_hole: bool
    ) -> list[int]:
        """The members of ``cycle`` that may be parked, best first."""
        units, position = self.units, self.occupancy.position
        candidates = [v for v in cycle if units.kind[v] == UnitKind.MOVE and not units.parked[v]]
        if extra_hole:
            candidates = [
                v
                for v in candidates
                if all(
                    round_.holes.get(int(position[g]), 0) < self.max_inflow for g in units.guests[v]
                )
            ]
        cost = {v: sum(self._copy_bytes(g) for g in units.guests[v]) for v in candidates}
        candidates.sort(key=lambda v: (not self._unblocks(v, stuck), cost[v], units.rank[v]))
        return candidates

    def _park_on(self, v: int, spare: int, round_: ParkingRound) -> None:
        """Park unit ``v`` on ``spare``: a parking move now, its own move last."""
        units, position = self.units, self.occupancy.position
        guests = units.guests[v]
        self.parked_count += 1
        park = units.add(
            guests, spare, PARK_RANK + self.parked_count, UnitKind.PARK, units.partners[v]
        )
        units.link[park] = v
        units.link[v] = park
        units.parked[v] = True
        # The parked guest moves on last, so the room it left keeps the cycle moving.
        units.rank[v] = units.rank_array[v] = LAST_RANK + self.parked_count
        self.queues.push_ready(park)
        round_.reserve(guests, {int(position[g]) for g in guests}, spare, units.demand[v])

    def _copy_bytes(self, g: int) -> int:
        """What moving guest ``g`` copies: its memory if it runs, and its local disks."""
        guest = self.cluster.guests[g]
        storage = self.constraints.capacity.storage_cols
        running = bool(np.any(self.occupancy.guest_demand[g][~storage] > 0))
        return (guest.memory if running else 0) + guest.local_disk_bytes

    def _unblocks(self, v: int, stuck: _Stuck) -> bool:
        """Whether parking unit ``v`` lets a waiting unit into one of ``v``'s sources at once."""
        units, occupancy = self.units, self.occupancy
        position, migrating_to = occupancy.position, occupancy.migrating_to
        guests = set(units.guests[v])
        for s in dict.fromkeys(int(position[g]) for g in guests):
            freed = occupancy.committed[s].copy()
            for g in guests:
                if position[g] == s:
                    freed -= occupancy.guest_demand[g]
            for w in stuck.by_target.get(s):
                if w == v or w not in stuck.alive:
                    continue
                if not np.all(freed + units.demand[w] <= occupancy.bound[s]):
                    continue
                partners = units.partners[w]
                if partners is not None and any(
                    p not in guests and (position[p] == s or migrating_to[p] == s)
                    for p in partners.tolist()
                ):
                    continue
                return True
        return False

    def _spare(self, v: int, cycle_nodes: set[int], round_: ParkingRound) -> int | None:
        """The spare node for parking unit ``v`` (most headroom after the move, then name)."""
        size = len(self.units.guests[v])
        oversize = size > self.max_parallel or size > self.max_inflow
        if oversize and round_.count:
            return None
        if not oversize and round_.count + size > self.max_parallel:
            return None
        candidates = np.nonzero(self._spare_mask(v, cycle_nodes, round_, oversize))[0]
        if not candidates.size:
            return None
        limit = self.occupancy.limit[candidates]
        peak = (
            np.maximum(round_.committed[candidates], round_.final[candidates])
            + self.units.demand[v]
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(limit > 0, (limit - peak) / np.where(limit > 0, limit, 1.0), np.inf)
        room = frac.min(axis=1)
        names = self.occupancy.node_names
        best = min(range(len(candidates)), key=lambda i: (-room[i], names[candidates[i]]))
        return int(candidates[best])

    def _spare_mask(
        self, v: int, cycle_nodes: set[int], round_: ParkingRound, oversize: bool
    ) -> np.ndarray:
        """The nodes that may take unit ``v`` as a spare in this round."""
        units, occupancy, constraints = self.units, self.occupancy, self.constraints
        position = occupancy.position
        guests = units.guests[v]
        ok = constraints.usable.copy()
        for g in guests:
            ok &= constraints.arch_ok[g]
            # A guest that already sits outside its strict node affinity (it is moving to
            # comply) may wait outside it too: that is no worse than now.
            if constraints.strict_ok[g, occupancy.origin[g]]:
                ok &= constraints.strict_ok[g]
            ok[position[g]] = False
        ok[sorted(cycle_nodes)] = False
        if not oversize:
            ok &= round_.inflow + len(guests) <= self.max_inflow
        ok &= np.all(round_.committed + units.demand[v] <= occupancy.bound, axis=1)
        partners = units.partners[v]
        if partners is not None:
            for p in partners.tolist():
                ok[position[p]] = False
                if occupancy.migrating_to[p] >= 0:
                    ok[occupancy.migrating_to[p]] = False
                if p in round_.parked_on:
                    ok[round_.parked_on[p]] = False
        return ok
