"""The planner's scheduler: the requested placements as ranked units, filled into steps.

Each requested placement becomes a unit (one guest, or the bundle members sharing a target).
Placements that fail the static constraints are unreachable at once. Units are ranked once,
deterministically: units that free the most room on *congested* nodes first (nodes whose planned
inflow exceeds their free room — the room the units free there, per dimension, as a fraction of
the limit), then units into nodes with the most planned inflow (the longest queues bound the
number of steps), then the guest id. What the target state itself cannot hold is given up next
(:mod:`.target`).

Every other unit waits in one of two places, both indexed by its target node
(:class:`~.state.Queues`):

* **ready** — units that fit there now, by rank;
* **waiting** — units that do not fit at the target yet (capacity, or a negative partner there).
  Room on a node only grows when a guest leaves it, so a node's waiting units are looked at again
  (vectorised) only after a step in which a guest left that node, and only as many are made ready,
  in rank order, as fit there together.

A step takes, in rank order, every ready unit that is safe given the step so far, until
``max_parallel`` is reached or nothing ready is left; a unit blocked only by the step itself (a
node's inflow limit, its room taken by other units in the step, a partner moving there in the same
step) is deferred to the next step. A node is skipped for the rest of a step once its inflow limit
is reached, or after as many misses for room. Each step therefore costs about the number of units
it looks at, not the number of pending moves. A step that can take nothing goes to the deadlock
breaker (:mod:`.parking`).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from opendrs.model.cluster import Cluster

from ..constraints import Constraints, RejectionCode
from .parking import DeadlockBreaker
from .plan import Plan, PlannedMove
from .state import Occupancy, Queues, UnitKind, Units, UnitState
from .target import unplaceable


class Outcome:
    """What trying a unit in the step being filled comes to (:meth:`Planner._try_join`)."""

    #: Not pending any more: dropped from the queue.
    SKIP: Final = 0
    #: Does not fit at its target now (capacity, or a partner there): back to waiting.
    WAIT: Final = 1
    #: Blocked only by the step itself: ready again for the next step.
    DEFER: Final = 2
    #: The room left at its target is taken by the step: deferred, and a miss for the node.
    DEFER_ROOM: Final = 3
    #: Joins the step.
    ACCEPT: Final = 4
    #: Larger than a limit: joins an empty step, which it then has to itself.
    ALONE: Final = 5


#: One unit before ranking: its guests (by id) and target node.
_Request = tuple[tuple[int, ...], int]


class Planner:
    """One planning run: the units, the state they move through, and the plan so far."""

    def __init__(
        self, cluster: Cluster, constraints: Constraints, max_parallel: int, max_inflow: int
    ) -> None:
        self.cluster = cluster
        self.constraints = constraints
        self.max_parallel = max_parallel
        self.max_inflow = max_inflow
        self.guest_ids = [g.id for g in cluster.guests]
        self.node_names = [n.name for n in cluster.nodes]
        self.occupancy = Occupancy(cluster, constraints, self.node_names)
        labels = [g.label for g in cluster.guests]
        self.units = Units(self.guest_ids, self.occupancy.guest_demand, labels)
        self.queues = Queues(self.units, len(cluster.nodes))
        self.moves: list[PlannedMove] = []
        self.unreachable: set[tuple[str, str]] = set()
        self.problems: list[str] = []
        self.breaker = DeadlockBreaker(
            cluster,
            constraints,
            self.units,
            self.occupancy,
            self.queues,
            max_parallel=max_parallel,
            max_inflow=max_inflow,
            give_up=self._give_up,
            problems=self.problems,
        )

    def run(self, requests: list[tuple[int, int]]) -> Plan:
        """The plan for the (guest index, node index) placements ``requests``."""
        self._build_units(requests)
        step = 0
        while self.units.pending_count:
            accepted, alone = self._fill_step()
            if accepted:
                step += 1
                if alone is not None:
                    self._report_alone(alone, step)
                self._apply_step(accepted, step)
            elif not self.breaker.break_deadlock():
                # Cannot happen (every stuck state has a hopeless unit or a cycle); stay safe.
                state = self.units.state
                stuck = [u for w in self.queues.waiting for u in w if state[u] == UnitState.PENDING]
                for u in stuck:
                    self._give_up(u, f"{self.units.label(u)}: no safe order found")
                break
        moves = tuple(sorted(self.moves, key=lambda m: (m.step, m.guest)))
        unreachable = tuple(sorted(self.unreachable))
        problems = tuple(dict.fromkeys(self.problems))
        return Plan(moves, not unreachable, unreachable, problems)

    def _report_alone(self, u: int, step: int) -> None:
        size = len(self.units.guests[u])
        over = []
        if size > self.max_parallel:
            over.append(f"max_parallel={self.max_parallel}")
        if size > self.max_inflow:
            over.append(f"max_node_inflow={self.max_inflow}")
        self.problems.append(
            f"{self.units.label(u)} moves {size} guests together, more than "
            f"{' and '.join(over)}: it runs alone in step {step}"
        )

    # ---------------------------------------------------------------------------- setup

    def _build_units(self, requests: list[tuple[int, int]]) -> None:
        """Turn the requested placements into ranked units, each one ready or waiting."""
        bundles = self._bundles(requests)
        if not bundles:
            return
        requested = self._statically_reachable(bundles)
        if not requested:
            return
        targets, demand = self._add_ranked(requested)
        self._drop_unplaceable()
        # Ready or waiting, vectorised.
        occupancy, units = self.occupancy, self.units
        fits = np.all(occupancy.committed[targets] + demand <= occupancy.bound[targets], axis=1)
        for u in range(len(units)):
            if units.state[u] != UnitState.PENDING:
                continue
            n = units.target[u]
            if fits[u] and not occupancy.holds_partner(units.partners[u], n):
                self.queues.push_ready(u)
            else:
                self.queues.waiting[n].append(u)

    def _bundles(self, requests: list[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
        """The guests to move, grouped by (hard-positive bundle or guest, target)."""
        cluster = self.cluster
        position = self.occupancy.position
        bundles: dict[tuple[int, int], list[int]] = {}
        for j, t in requests:
            if position[j] == t:
                continue
            guest = cluster.guests[j]
            where = self.node_names[t]
            if position[j] < 0:
                self.unreachable.add((guest.id, where))
                self.problems.append(f"guest {guest.id} is on unknown node {guest.node}")
                continue
            if guest.migrating_to is not None and guest.migrating_to != guest.node:
                self.unreachable.add((guest.id, where))
                self.problems.append(
                    f"guest {guest.id} is already migrating to {guest.migrating_to}; "
                    "it is not moved again"
                )
                continue
            bundles.setdefault((self.constraints.unit_of(j), t), []).append(j)
        return bundles

    def _statically_reachable(self, bundles: dict[tuple[int, int], list[int]]) -> list[_Request]:
        """The bundles whose every member passes the static constraints at their target.

        The others are unreachable, with the first failure of their first failing member. Sets
        the capacity demand of every guest in ``bundles``.
        """
        cluster, cons = self.cluster, self.constraints
        online = np.array([n.online for n in cluster.nodes], dtype=bool)
        not_maint = np.array([not n.maintenance for n in cluster.nodes], dtype=bool)
        # Static constraints, vectorised; only failures are explained.
        flat = [(j, t) for (_key, t), members in bundles.items() for j in members]
        movers = np.array([j for j, _t in flat], dtype=np.intp)
        targets = np.array([t for _j, t in flat], dtype=np.intp)
        static = (
            online[targets]
            & not_maint[targets]
            & cons.arch_ok[movers, targets]
            & cons.strict_ok[movers, targets]
        )
        bad = set(movers[~static].tolist())

        empty = np.zeros((len(cluster.nodes), len(self.occupancy.dimensions)))
        reachable: list[_Request] = []
        for (_key, t), members in bundles.items():
            guests = tuple(sorted(members, key=self.guest_ids.__getitem__))
            failing = [j for j in guests if j in bad]
            if not failing:
                reachable.append((guests, t))
                continue
            j = failing[0]
            checks = (
                (RejectionCode.OFFLINE, online[t]),
                (RejectionCode.MAINTENANCE, not_maint[t]),
                (RejectionCode.ARCH, cons.arch_ok[j, t]),
                (RejectionCode.PLATFORM, cons.limits_ok[j, t]),
                (RejectionCode.NODE_AFFINITY, cons.strict_ok[j, t]),
            )
            code = next(code for code, ok in checks if not ok)
            reason = cons.rejection(code, j, t, self.occupancy.position, empty, empty[0])
            for m in guests:
                self.unreachable.add((self.guest_ids[m], self.node_names[t]))
            labels = self.units.guest_labels
            who = f"guest {labels[j]}"
            if len(guests) > 1:
                who = "bundle " + ", ".join(labels[m] for m in guests) + f" ({who})"
            self.problems.append(f"{who} cannot move to {self.node_names[t]}: {reason}")
        return reachable

    def _add_ranked(self, requested: list[_Request]) -> tuple[np.ndarray, np.ndarray]:
        """Add the units of ``requested`` in rank order; returns their targets and demand.

        Rank: free the most room on congested nodes, then the busiest targets, then guest id.
        """
        occupancy = self.occupancy
        n_nodes, n_dims = len(self.node_names), len(occupancy.dimensions)
        unit_of = np.array([k for k, (guests, _t) in enumerate(requested) for _g in guests])
        members = np.array([g for guests, _t in requested for g in guests], dtype=np.intp)
        targets = np.array([t for _guests, t in requested], dtype=np.intp)
        member_demand = occupancy.guest_demand[members]
        incoming = np.zeros((n_nodes, n_dims))
        np.add.at(incoming, targets[unit_of], member_demand)
        inflow_count = np.bincount(targets[unit_of], minlength=n_nodes)
        limit = occupancy.limit
        deficit = np.maximum(incoming - (limit - occupancy.committed), 0.0)
        norm = np.where(limit > 0, limit, 1.0)
        sources = occupancy.position[members]
        freed = (np.minimum(member_demand, deficit[sources]) / norm[sources]).sum(axis=1)
        frees = np.zeros(len(requested))
        np.add.at(frees, unit_of, freed)
        unit_demand = np.zeros((len(requested), n_dims))
        np.add.at(unit_demand, unit_of, member_demand)
        keys = sorted(
            (-round(float(frees[k]), 9), -int(inflow_count[t]), self.guest_ids[guests[0]], k)
            for k, (guests, t) in enumerate(requested)
        )
        order = np.array([k for _f, _c, _id, k in keys], dtype=np.intp)
        for rank, k in enumerate(order.tolist()):
            guests, t = requested[k]
            self.units.add(
                guests, t, rank, UnitKind.MOVE, self._partners_of(guests), unit_demand[k]
            )
        return targets[order], unit_demand[order]

    def _partners_of(self, guests: tuple[int, ...]) -> np.ndarray | None:
        """The hard negative partners of ``guests`` that are not among them, None if none."""
        anti_partners = self.occupancy.anti_partners
        if not any(g in anti_partners for g in guests):
            return None
        found: set[int] = set()
        for g in guests:
            found.update(anti_partners.get(g, ()))
        found -= set(guests)
        return np.array(sorted(found), dtype=np.intp) if found else None

    def _drop_unplaceable(self) -> None:
        """Give up the placements that the target state itself cannot hold (:mod:`.target`)."""
        dropped = unplaceable(self.units, self.occupancy)
        for u in sorted(dropped, key=self.units.rank.__getitem__):
            self._give_up(u, dropped[u])

    # ---------------------------------------------------------------------------- queues

    def _classify(self, u: int) -> None:
        """Ready if it fits at its target now, waiting otherwise."""
        units, occupancy = self.units, self.occupancy
        n = units.target[u]
        if occupancy.fits(units.demand[u], n) and not occupancy.holds_partner(units.partners[u], n):
            self.queues.push_ready(u)
        else:
            self.queues.waiting[n].append(u)

    def _reexamine(self, n: int) -> None:
        """After guests left node ``n``: move its waiting units that fit now to ready."""
        queues, units, occupancy = self.queues, self.units, self.occupancy
        waiting = queues.waiting[n]
        if not waiting:
            return
        ids = np.array(waiting, dtype=np.intp)
        ids = ids[units.state[ids] == UnitState.PENDING]
        ids = ids[np.argsort(units.rank_array[ids], kind="stable")]
        bound, committed = occupancy.bound[n], occupancy.committed[n]
        fit = np.all(committed + units.demand[ids] <= bound, axis=1)
        keep = ids[~fit].tolist()
        candidates = ids[fit]
        if units.partnered[candidates].any():
            partners = units.partners
            blocked = np.array(
                [
                    bool(units.partnered[u]) and occupancy.holds_partner(partners[u], n)
                    for u in candidates.tolist()
                ],
                dtype=bool,
            )
            keep += candidates[blocked].tolist()
            candidates = candidates[~blocked]
        # Promote, in rank order, only what fits together with the units already ready here:
        # the rest could not join the next step anyway, and would only be looked at in vain.
        room = bound - committed
        for _rank, r in queues.ready[n]:
            # Units that no longer fit will go back to waiting when the step looks at them.
            if units.state[r] == UnitState.PENDING and np.all(units.demand[r] <= room):
                room = room - units.demand[r]
        together = np.all(np.cumsum(units.demand[candidates], axis=0) <= room, axis=1)
        count = len(together) if together.all() else int(np.argmin(together))
        for u in candidates[:count].tolist():
            queues.push_ready(u)
        keep += candidates[count:].tolist()
        queues.waiting[n] = keep

    # ---------------------------------------------------------------------------- steps

    def _fill_step(self) -> tuple[list[int], int | None]:
        """Take ready units in rank order while they are safe: the units of the next step.

        Returns them, and the one that has the step to itself (over a limit), if any.
        """
        queues, units = self.queues, self.units
        count = 0
        inflow: dict[int, int] = {}
        step_in: dict[int, np.ndarray] = {}
        step_target: dict[int, int] = {}
        accepted: list[int] = []
        deferred: list[int] = []
        closed: list[int] = []
        misses: dict[int, int] = {}
        alone: int | None = None
        while count < self.max_parallel:
            best = queues.pop_best()
            if best is None:
                break
            n, u = best
            outcome = self._try_join(u, n, count, inflow, step_in, step_target)
            if outcome == Outcome.WAIT:
                queues.waiting[n].append(u)
            elif outcome == Outcome.DEFER:
                deferred.append(u)
            elif outcome == Outcome.DEFER_ROOM:
                # The room left here is taken by the step; a few smaller units may still fit.
                deferred.append(u)
                misses[n] = misses.get(n, 0) + 1
            elif outcome in (Outcome.ACCEPT, Outcome.ALONE):
                accepted.append(u)
                size = len(units.guests[u])
                count += size
                inflow[n] = inflow.get(n, 0) + size
                step_in[n] = step_in.get(n, 0.0) + units.demand[u]
                for g in units.guests[u]:
                    step_target[g] = n
                if outcome == Outcome.ALONE:
                    alone = u
            if inflow.get(n, 0) < self.max_inflow and misses.get(n, 0) < self.max_inflow:
                queues.register(n)
            else:
                closed.append(n)
            if alone is not None:
                break
        for u in deferred:
            queues.push_ready(u)
        for n in closed:
            queues.register(n)
        return accepted, alone

    def _try_join(
        self,
        u: int,
        n: int,
        count: int,
        inflow: dict[int, int],
        step_in: dict[int, np.ndarray],
        step_target: dict[int, int],
    ) -> int:
        """Whether unit ``u`` can join the step being filled: an :class:`Outcome`.

        The step so far has ``count`` migrations, ``inflow`` of them into each node, bringing
        ``step_in`` there; ``step_target`` maps its guests to their targets. See the planner's
        safety model (:mod:`opendrs.engine.planner`).
        """
        units, occupancy = self.units, self.occupancy
        if units.state[u] != UnitState.PENDING:
            return Outcome.SKIP
        guests = units.guests[u]
        # The state at the start of the step.
        demand = units.demand[u]
        row = occupancy.committed[n]
        if not np.all(row + demand <= occupancy.bound[n]):
            return Outcome.WAIT
        if occupancy.holds_partner(units.partners[u], n):
            return Outcome.WAIT
        # The step so far.
        if any(g in step_target for g in guests):
            return Outcome.DEFER
        size = len(guests)
        if size > self.max_parallel or size > self.max_inflow:
            return Outcome.ALONE if count == 0 else Outcome.DEFER
        if count + size > self.max_parallel or inflow.get(n, 0) + size > self.max_inflow:
            return Outcome.DEFER
        extra = step_in.get(n)
        if extra is not None and not np.all(row + extra + demand <= occupancy.bound[n]):
            return Outcome.DEFER_ROOM
        partners = units.partners[u]
        if partners is not None and step_target:
            for p in partners.tolist():
                if step_target.get(p) == n:
                    return Outcome.DEFER
        return Outcome.ACCEPT

    def _apply_step(self, accepted: list[int], step: int) -> None:
        """Run a step: move its guests, then look again at the nodes they left."""
        units, occupancy = self.units, self.occupancy
        committed, position = occupancy.committed, occupancy.position
        departed: set[int] = set()
        for u in accepted:
            n = units.target[u]
            parking = units.kind[u] == UnitKind.PARK
            for g in units.guests[u]:
                s = int(position[g])
                demand = occupancy.guest_demand[g]
                committed[s] -= demand
                committed[n] += demand
                position[g] = n
                departed.add(s)
                self.moves.append(
                    PlannedMove(
                        self.guest_ids[g], self.node_names[s], self.node_names[n], step, parking
                    )
                )
            units.set_state(u, UnitState.DONE)
            link = units.link[u]
            if not parking and link >= 0 and units.state[link] == UnitState.PENDING:
                # The guest went straight to its target: its parking move is not needed.
                units.set_state(link, UnitState.CANCELLED)
        for s in sorted(departed):
            self._reexamine(s)

    # ---------------------------------------------------------------------------- giving up

    def _give_up(self, u: int, reason: str | None) -> None:
        """Give up unit ``u`` (``reason`` goes to the problems); a parked guest goes back."""
        units = self.units
        kind = units.kind[u]
        if kind == UnitKind.PARK:
            units.set_state(u, UnitState.CANCELLED)
            return
        units.set_state(u, UnitState.UNREACHABLE)
        guests = units.guests[u]
        if kind == UnitKind.RETURN:
            where = self.node_names[int(self.occupancy.position[guests[0]])]
            self.problems.append(
                f"{units.label(u)} stays on {where}, where it was parked"
                + (f": {reason}" if reason else "")
            )
            return
        target = self.node_names[units.target[u]]
        for g in guests:
            self.unreachable.add((self.guest_ids[g], target))
        if reason:
            self.problems.append(reason)
        link = units.link[u]
        if link >= 0 and units.state[link] == UnitState.PENDING:
            units.set_state(link, UnitState.CANCELLED)
        self._send_back(u)

    def _send_back(self, u: int) -> None:
        """Move the guests of unit ``u`` that are parked back to the nodes they came from."""
        units, occupancy = self.units, self.occupancy
        by_origin: dict[int, list[int]] = {}
        for g in units.guests[u]:
            if occupancy.position[g] != occupancy.origin[g]:
                by_origin.setdefault(int(occupancy.origin[g]), []).append(g)
        for origin, members in sorted(by_origin.items()):
            back = units.add(
                tuple(members), origin, units.rank[u], UnitKind.RETURN, units.partners[u]
            )
            self._classify(back)
