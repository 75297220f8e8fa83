"""Planner: from the current placement to a target placement, an ordered plan of safe steps.

A strategy says *where* guests should end up; the planner says *in which order* to move them so
that the cluster stays valid the whole way there, and which of the requested placements no safe
order reaches.

The safety model
----------------
A plan is a sequence of **steps**; a step is a set of migrations that run at the same time, and a
step starts only when the previous one has finished.

* **Transit counts twice.** While a guest migrates it loads *both* its source and its target in
  every hard capacity dimension of :class:`~opendrs.engine.usage.CapacityModel` — configured vCPUs
  against cores × overcommit, configured memory, measured use in dynamic mode, and local storage
  pools (local disks occupy both nodes while they are copied). After the step it loads only the
  target. A stopped guest commits only its storage
  (:meth:`~opendrs.engine.constraints.Constraints.guest_demand`).
* **Capacity.** A step is safe when, for every node, what is committed at the start of the step
  plus the demand of the step's migrations into the node stays within every limit (with the
  capacity model's rounding tolerance). A node over a limit therefore receives nothing while it is
  over — it never gets worse — but guests may always leave it.
* **Hard anti-affinity in transit.** A migrating guest occupies both nodes, so no guest moves onto
  a node that a hard negative partner occupies at any moment of the step: a partner that stays
  there, leaves it in the same step, or moves there in the same step. (Guests already migrating
  when the plan starts occupy their migration target as well, throughout.)
* **Static constraints.** Every target — parking spares included — is usable (online, not in
  maintenance), has the guest's CPU architecture and passes its strict node affinity.
* **Limits.** At most ``max_parallel`` migrations per step, at most ``max_node_inflow`` into any
  node per step. The members of a hard-positive bundle that go to the same node move together in
  one step and count as several migrations; a bundle larger than a limit runs alone in its step
  (and the plan says so).

The algorithm
-------------
Each requested placement becomes a **unit** (one guest, or the bundle members sharing a target).
Placements that fail the static constraints are unreachable at once. Units are ranked once,
deterministically: units that free the most room on *congested* nodes first (nodes whose planned
inflow exceeds their free room — the room the units free there, per dimension, as a fraction of
the limit), then units into nodes with the most planned inflow (the longest queues bound the
number of steps), then the guest id.

No order reaches a target state that is itself invalid, so that is settled next: of two hard
negative partners heading for one node the lower-ranked stays put (a partner already there wins),
and from a node the target state overfills, incoming units are given up from the lowest rank until
it fits (those given up needlessly are taken back); guests that stay add to their own node, so this
repeats until the target state is consistent.

Every other unit waits in one of two places, both indexed by its target node:

* **ready** — a heap per target node (by rank) of units that fit there now, with one global heap
  over the heads of those heaps;
* **waiting** — units that do not fit at the target yet (capacity, or a negative partner there).
  Room on a node only grows when a guest leaves it, so a node's waiting units are looked at again
  (vectorised) only after a step in which a guest left that node, and only as many are made ready,
  in rank order, as fit there together.

A step takes, in rank order, every ready unit that is safe given the step so far, until
``max_parallel`` is reached or nothing ready is left; a unit blocked only by the step itself (a
node's inflow limit, its room taken by other units in the step, a partner moving there in the same
step) is deferred to the next step. A node is skipped for the rest of a step once its inflow limit
is reached, or after as many misses for room. Each step therefore costs about the number of units
it looks at, not the number of pending moves.

When a step can take nothing, every pending unit waits for another one: the plan is **stuck**.
Units that cannot arrive even if every pending move off their target ran first (or whose negative
partner stays on the target) are unreachable, repeatedly, until what remains waits only in cycles.
A cycle — unit A waits for room that unit B frees, B for room that A frees, e.g. a swap of two
guests between two full nodes — is then broken by **parking**: one member moves to a spare node
and later on to its own target (two moves, the first flagged ``parking``). The member chosen is one
whose departure lets a waiting unit in at once, then the one cheapest to copy (memory and local
disks), then by rank; the spare is a usable node that passes the member's static constraints, its
capacity (transit counted), its hard anti-affinity and the migration limits, is not a source or
target of the cycle's moves, and keeps the most headroom — measured against the larger of its load
now and its load once the plan is done — then the name. The parked guest's own final move then
ranks last, so the room it left keeps the whole cycle moving: one parking move per cycle.

One stuck state may hold many cycles: one guest is parked per node-disjoint cycle, up to
``max_parallel`` migrations (they share the next step); what is left of the step opens further
"holes" in cycles already opened (at most ``max_node_inflow`` per node), so that a long ring of
full nodes moves at several places at once. A guest is parked at most once; a cycle none of whose
members can be parked is unreachable. A parked guest whose final move then proves unreachable is
moved back where it came from, if that is safe (else the plan says where it stays).

Same input, same plan: the target mapping is read in sorted order and every choice breaks ties by
rank, node name or guest id.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from opendrs.model.cluster import Cluster

from .constraints import Constraints, current_assign
from .usage import loaded_nodes, tolerance

if TYPE_CHECKING:
    from .strategies.base import Proposal


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """One migration of a plan: ``guest`` from ``source`` to ``target`` in step ``step`` (1-based).

    ``parking`` marks a temporary move to a spare node that breaks a cycle; the same guest moves
    on from the spare to its target in a later step.
    """

    guest: str
    source: str
    target: str
    step: int
    parking: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest,
            "source": self.source,
            "target": self.target,
            "step": self.step,
            "parking": self.parking,
        }


@dataclass(frozen=True)
class Plan:
    """An ordered plan: steps of migrations, each safe to run at once after the previous ones."""

    #: Every migration, ordered by step, then guest id.
    moves: tuple[PlannedMove, ...]
    #: Whether every requested placement is reached safely.
    feasible: bool
    #: (guest, target) placements that no safe order reaches; those guests are not moved there.
    unreachable: tuple[tuple[str, str], ...] = ()
    #: One sentence each: why placements are unreachable, bundles over a limit, dropped placements.
    problems: tuple[str, ...] = ()

    @property
    def steps(self) -> int:
        """The number of steps."""
        return self.moves[-1].step if self.moves else 0

    def by_step(self) -> tuple[tuple[PlannedMove, ...], ...]:
        """The moves grouped by step: element ``k`` holds the moves of step ``k + 1``."""
        out: list[list[PlannedMove]] = [[] for _ in range(self.steps)]
        for move in self.moves:
            out[move.step - 1].append(move)
        return tuple(tuple(step) for step in out)

    def as_dict(self) -> dict[str, object]:
        return {
            "feasible": self.feasible,
            "steps": self.steps,
            "moves": [m.as_dict() for m in self.moves],
            "unreachable": [{"guest": g, "target": t} for g, t in self.unreachable],
            "problems": list(self.problems),
        }


# --------------------------------------------------------------------------------------------
# Entry points


def plan_moves(
    cluster: Cluster,
    target: Mapping[str, str],
    *,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
    constraints: Constraints | None = None,
) -> Plan:
    """Order the migrations from the current placement of ``cluster`` to ``target``.

    ``target`` maps guest ids to the node each should end on; guests not in it, or already on
    their target, do not move. ``max_parallel`` and ``max_node_inflow`` default to the cluster's
    settings. ``constraints`` may pass :class:`Constraints` already built for this cluster (their
    forbidden placements are ignored here), which saves building them again — that takes seconds
    at 100,000 guests.

    Raises ValueError for a guest or node the cluster does not have, or a limit below 1.
    """
    settings = cluster.settings
    parallel = settings.max_parallel if max_parallel is None else max_parallel
    inflow = settings.max_node_inflow if max_node_inflow is None else max_node_inflow
    if parallel < 1:
        raise ValueError(f"max_parallel must be at least 1, not {parallel}")
    if inflow < 1:
        raise ValueError(f"max_node_inflow must be at least 1, not {inflow}")
    requests = _validate(cluster, target)
    cons = constraints if constraints is not None else Constraints.build(cluster)
    return _Planner(cluster, cons, parallel, inflow).run(requests)


def plan_with_retries(
    cluster: Cluster,
    propose: Callable[[frozenset[tuple[str, str]]], Proposal],
    *,
    max_retries: int = 5,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
    constraints: Constraints | None = None,
) -> tuple[Proposal, Plan]:
    """Ask a strategy for a proposal until its moves can be ordered safely.

    ``propose(forbidden)`` must return a proposal that avoids the (guest, node) placements in
    ``forbidden`` (strategies do so through ``PlacementState.build(cluster, forbidden=…)``). While
    the plan of the proposal's net moves is not feasible, its unreachable placements are added to
    ``forbidden`` and the strategy is asked again, at most ``max_retries`` times. If it never gets
    there, the last proposal is returned with the plan of its reachable part (``feasible`` False,
    ``problems`` naming the dropped placements). Every move of the returned plan is safe.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be at least 0, not {max_retries}")
    cons = constraints if constraints is not None else Constraints.build(cluster)
    forbidden: set[tuple[str, str]] = set()
    attempts = 0
    while True:
        proposal = propose(frozenset(forbidden))
        attempts += 1
        target = {m.guest: m.target for m in proposal.net_moves()}
        plan = plan_moves(
            cluster,
            target,
            max_parallel=max_parallel,
            max_node_inflow=max_node_inflow,
            constraints=cons,
        )
        if plan.feasible:
            return proposal, plan
        fresh = set(plan.unreachable) - forbidden
        if not fresh or attempts > max_retries:
            break
        forbidden |= fresh
    dropped = ", ".join(f"{g} → {n}" for g, n in plan.unreachable)
    if fresh:
        why = f"still unreachable after {attempts} proposal{'' if attempts == 1 else 's'}"
    else:
        why = "proposed again although forbidden"
    note = f"Dropped placements {dropped} ({why}); the plan moves only the reachable rest."
    return proposal, replace(plan, problems=(*plan.problems, note))


def _validate(cluster: Cluster, target: Mapping[str, str]) -> list[tuple[int, int]]:
    """(guest index, node index) of every requested placement, in guest id order."""
    gidx, nidx = cluster.guest_index, cluster.node_index
    out: list[tuple[int, int]] = []
    for guest, node in sorted(target.items(), key=lambda kv: (str(kv[0]), str(kv[1]))):
        if guest not in gidx:
            raise ValueError(f"target placement: unknown guest {guest!r}")
        if node not in nidx:
            raise ValueError(f"target placement of guest {guest!r}: unknown node {node!r}")
        out.append((gidx[guest], nidx[node]))
    return out


# --------------------------------------------------------------------------------------------
# The scheduler

# Unit states, kinds, and outcomes of trying a unit in a step.
_PENDING, _DONE, _UNREACHABLE, _CANCELLED = 0, 1, 2, 3
_MOVE, _PARK, _RETURN = 0, 1, 2
_SKIP, _WAIT, _DEFER, _DEFER_ROOM, _ACCEPT, _ALONE = 0, 1, 2, 3, 4, 5
#: Parking units rank before every other unit, in the order they were created.
_PARK_RANK = -(10**12)
#: The final move of a parked guest ranks after every other unit.
_LAST_RANK = 10**12


class _Planner:
    """State of one planning run: the evolving cluster state and the pending units."""

    def __init__(self, cluster: Cluster, cons: Constraints, max_parallel: int, max_inflow: int):
        self.cluster = cluster
        self.cons = cons
        self.max_parallel = max_parallel
        self.max_inflow = max_inflow
        self.ids = [g.id for g in cluster.guests]
        self.names = [n.name for n in cluster.nodes]
        n_nodes = len(cluster.nodes)
        cap = cons.capacity
        self.dims = cap.dims
        self.limit = cap.limit
        self.bound = cap.limit + tolerance(cap.limit)
        #: Committed capacity (N, D) at the start of the next step.
        self.committed = cap.committed()
        #: Node of every guest at the start of the next step (and before the plan).
        self.pos = current_assign(cluster)
        self.orig = self.pos.copy()
        #: Migration target of guests already migrating when the plan starts (else -1).
        self.extra = np.full(len(cluster.guests), -1, dtype=np.intp)
        for j, guest in enumerate(cluster.guests):
            if guest.migrating_to is not None and guest.migrating_to != guest.node:
                self.extra[j] = cluster.node_index.get(guest.migrating_to, -1)
        self.usable = cons.usable
        #: Hard negative partners of each guest that has any, made symmetric (and never itself).
        self.neg: dict[int, set[int]] = {}
        for j, partners in enumerate(cons.hard_neg):
            if partners.size:
                for p in partners.tolist():
                    if p != j:
                        self.neg.setdefault(j, set()).add(p)
                        self.neg.setdefault(p, set()).add(j)
        #: Capacity demand of each moving guest (G, D), and as rows by guest index.
        self.gdm = np.zeros((len(cluster.guests), len(self.dims)))
        self.gd: dict[int, np.ndarray] = {}

        # Units, as parallel lists (and growable arrays for the vectorised checks).
        self.u_guests: list[tuple[int, ...]] = []
        self.u_target: list[int] = []
        self.u_rank: list[int] = []
        self.u_kind: list[int] = []
        self.u_partners: list[np.ndarray | None] = []
        self.u_link: list[int] = []
        self.u_parked: list[bool] = []
        self.demand = np.zeros((16, len(self.dims)))
        self.state = np.zeros(16, dtype=np.int8)
        self.target_np = np.zeros(16, dtype=np.intp)
        self.rank_np = np.zeros(16, dtype=np.int64)
        self.partnered = np.zeros(16, dtype=bool)
        self.n_pending = 0
        self.park_counter = 0

        self.ready: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes)]
        self.waiting: list[list[int]] = [[] for _ in range(n_nodes)]
        #: Global heap of (rank of the head of ready[n], n); ``head[n]`` is the live entry.
        self.heads: list[tuple[int, int]] = []
        self.head: list[int | None] = [None] * n_nodes

        self.moves: list[PlannedMove] = []
        self.unreachable: set[tuple[str, str]] = set()
        self.problems: list[str] = []

    # ---------------------------------------------------------------------------- units

    def _add_unit(
        self,
        guests: tuple[int, ...],
        target: int,
        rank: int,
        kind: int,
        partners: np.ndarray | None,
        demand: np.ndarray | None = None,
    ) -> int:
        u = len(self.u_guests)
        if u >= len(self.state):
            grow = max(16, len(self.state))
            self.demand = np.vstack([self.demand, np.zeros((grow, len(self.dims)))])
            self.state = np.concatenate([self.state, np.zeros(grow, dtype=np.int8)])
            self.target_np = np.concatenate([self.target_np, np.zeros(grow, dtype=np.intp)])
            self.rank_np = np.concatenate([self.rank_np, np.zeros(grow, dtype=np.int64)])
            self.partnered = np.concatenate([self.partnered, np.zeros(grow, dtype=bool)])
        self.u_guests.append(guests)
        self.u_target.append(target)
        self.u_rank.append(rank)
        self.u_kind.append(kind)
        self.u_partners.append(partners)
        self.u_link.append(-1)
        self.u_parked.append(False)
        if demand is None:
            demand = sum((self.gd[g] for g in guests), np.zeros(len(self.dims)))
        self.demand[u] = demand
        self.state[u] = _PENDING
        self.target_np[u] = target
        self.rank_np[u] = rank
        self.partnered[u] = partners is not None
        self.n_pending += 1
        return u

    def _label(self, u: int) -> str:
        guests = self.u_guests[u]
        if len(guests) == 1:
            return f"guest {self.ids[guests[0]]}"
        return "bundle " + ", ".join(self.ids[g] for g in guests)

    def _partners(self, guests: tuple[int, ...]) -> np.ndarray | None:
        neg = self.neg
        if not any(g in neg for g in guests):
            return None
        found: set[int] = set()
        for g in guests:
            found.update(neg.get(g, ()))
        found -= set(guests)
        return np.array(sorted(found), dtype=np.intp) if found else None

    def _blocked_at(self, u: int, n: int) -> bool:
        """Whether a hard negative partner of unit ``u`` occupies node ``n`` now."""
        parts = self.u_partners[u]
        if parts is None:
            return False
        return bool((self.pos[parts] == n).any() or (self.extra[parts] == n).any())

    def _fits_now(self, u: int, n: int) -> bool:
        return bool(np.all(self.committed[n] + self.demand[u] <= self.bound[n]))

    def _set_state(self, u: int, state: int) -> None:
        if self.state[u] == _PENDING:
            self.n_pending -= 1
        self.state[u] = state

    # ---------------------------------------------------------------------------- queues

    def _register(self, n: int) -> None:
        """Put node ``n``'s best ready unit in the global heap (if it is not there already)."""
        heap = self.ready[n]
        if heap:
            rank = heap[0][0]
            if self.head[n] != rank:
                self.head[n] = rank
                heapq.heappush(self.heads, (rank, n))
        else:
            self.head[n] = None

    def _push_ready(self, u: int) -> None:
        n = self.u_target[u]
        rank = self.u_rank[u]
        heapq.heappush(self.ready[n], (rank, u))
        current = self.head[n]
        if current is None or rank < current:
            self.head[n] = rank
            heapq.heappush(self.heads, (rank, n))

    def _classify(self, u: int) -> None:
        """Ready if it fits at its target now, waiting otherwise."""
        n = self.u_target[u]
        if self._fits_now(u, n) and not self._blocked_at(u, n):
            self._push_ready(u)
        else:
            self.waiting[n].append(u)

    def _reexamine(self, n: int) -> None:
        """After guests left node ``n``: move its waiting units that fit now to ready."""
        waiting = self.waiting[n]
        if not waiting:
            return
        ids = np.array(waiting, dtype=np.intp)
        ids = ids[self.state[ids] == _PENDING]
        ids = ids[np.argsort(self.rank_np[ids], kind="stable")]
        fit = np.all(self.committed[n] + self.demand[ids] <= self.bound[n], axis=1)
        keep = ids[~fit].tolist()
        candidates = ids[fit]
        if self.partnered[candidates].any():
            blocked = np.array(
                [bool(self.partnered[u]) and self._blocked_at(u, n) for u in candidates.tolist()],
                dtype=bool,
            )
            keep += candidates[blocked].tolist()
            candidates = candidates[~blocked]
        # Promote, in rank order, only what fits together with the units already ready here:
        # the rest could not join the next step anyway, and would only be looked at in vain.
        room = self.bound[n] - self.committed[n]
        for _rank, r in self.ready[n]:
            # Units that no longer fit will go back to waiting when the step looks at them.
            if self.state[r] == _PENDING and np.all(self.demand[r] <= room):
                room = room - self.demand[r]
        together = np.all(np.cumsum(self.demand[candidates], axis=0) <= room, axis=1)
        count = len(together) if together.all() else int(np.argmin(together))
        for u in candidates[:count].tolist():
            self._push_ready(u)
        keep += candidates[count:].tolist()
        self.waiting[n] = keep

    # ---------------------------------------------------------------------------- setup

    def _build_units(self, requests: list[tuple[int, int]]) -> None:
        cluster, cons = self.cluster, self.cons
        online = np.array([n.online for n in cluster.nodes], dtype=bool)
        not_maint = np.array([not n.maintenance for n in cluster.nodes], dtype=bool)
        bundles: dict[tuple[int, int], list[int]] = {}
        for j, t in requests:
            if self.pos[j] == t:
                continue
            guest = cluster.guests[j]
            where = self.names[t]
            if self.pos[j] < 0:
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
            g = int(cons.group_of[j]) if len(cons.group_of) else -1
            key = (g, t) if g >= 0 else (-1 - j, t)
            bundles.setdefault(key, []).append(j)

        if not bundles:
            return
        # Static constraints, vectorised; only failures are explained.
        flat = [(j, t) for (_key, t), members in bundles.items() for j in members]
        js = np.array([j for j, _t in flat], dtype=np.intp)
        ts = np.array([t for _j, t in flat], dtype=np.intp)
        static = online[ts] & not_maint[ts] & cons.arch_ok[js, ts] & cons.strict_ok[js, ts]
        bad = set(js[~static].tolist())
        # Capacity demand of the moving guests: a guest that loads no node brings its storage only.
        rows = cons.capacity.demand[js].copy()
        idle = np.array([not loaded_nodes(cluster.guests[j]) for j in js.tolist()], dtype=bool)
        if idle.any():
            rows[np.ix_(idle, ~cons.capacity.storage_cols)] = 0.0
        self.gdm[js] = rows
        for j in js.tolist():
            self.gd[j] = self.gdm[j]

        empty = np.zeros((len(cluster.nodes), len(self.dims)))
        units: list[tuple[tuple[int, ...], int]] = []
        for (_key, t), members in bundles.items():
            guests = tuple(sorted(members, key=self.ids.__getitem__))
            failing = [j for j in guests if j in bad]
            if not failing:
                units.append((guests, t))
                continue
            j = failing[0]
            checks = (
                ("offline", online[t]),
                ("maintenance", not_maint[t]),
                ("arch", cons.arch_ok[j, t]),
                ("node-affinity", cons.strict_ok[j, t]),
            )
            name = next(name for name, ok in checks if not ok)
            reason = cons.explain(name, j, t, self.pos, empty, empty[0])
            for m in guests:
                self.unreachable.add((self.ids[m], self.names[t]))
            who = f"guest {self.ids[j]}"
            if len(guests) > 1:
                who = "bundle " + ", ".join(self.ids[m] for m in guests) + f" ({who})"
            self.problems.append(f"{who} cannot move to {self.names[t]}: {reason}")
        if not units:
            return

        # Rank: free the most room on congested nodes, then the busiest targets, then guest id.
        n_nodes, n_dims = len(cluster.nodes), len(self.dims)
        unit_of = np.array([k for k, (guests, _t) in enumerate(units) for _g in guests])
        members = np.array([g for guests, _t in units for g in guests], dtype=np.intp)
        targets = np.array([t for _guests, t in units], dtype=np.intp)
        member_demand = self.gdm[members]
        incoming = np.zeros((n_nodes, n_dims))
        np.add.at(incoming, targets[unit_of], member_demand)
        inflow_count = np.bincount(targets[unit_of], minlength=n_nodes)
        deficit = np.maximum(incoming - (self.limit - self.committed), 0.0)
        norm = np.where(self.limit > 0, self.limit, 1.0)
        sources = self.pos[members]
        freed = (np.minimum(member_demand, deficit[sources]) / norm[sources]).sum(axis=1)
        frees = np.zeros(len(units))
        np.add.at(frees, unit_of, freed)
        unit_demand = np.zeros((len(units), n_dims))
        np.add.at(unit_demand, unit_of, member_demand)
        keys = sorted(
            (-round(float(frees[k]), 9), -int(inflow_count[t]), self.ids[guests[0]], k)
            for k, (guests, t) in enumerate(units)
        )
        for rank, (_f, _c, _id, k) in enumerate(keys):
            guests, t = units[k]
            self._add_unit(guests, t, rank, _MOVE, self._partners(guests), unit_demand[k])
        self._drop_unplaceable()
        # Ready or waiting, vectorised.
        count = len(self.u_guests)
        order = np.array([k for _f, _c, _id, k in keys], dtype=np.intp)
        fits = np.all(
            self.committed[targets[order]] + unit_demand[order] <= self.bound[targets[order]],
            axis=1,
        )
        for u in range(count):
            if self.state[u] != _PENDING:
                continue
            n = self.u_target[u]
            if fits[u] and not self._blocked_at(u, n):
                self._push_ready(u)
            else:
                self.waiting[n].append(u)

    def _drop_unplaceable(self) -> None:
        """Give up the placements that the target state itself cannot hold, lowest rank first.

        No order reaches a target state that puts hard negative partners on one node or fills a
        node beyond a limit, so before ordering anything: of two partners heading for one node the
        lower-ranked stays where it is (a partner staying there wins), and from a node the target
        state overfills, incoming units are given up from the lowest rank until it fits (units
        given up needlessly are taken back). A guest that stays adds to its own node, so this
        repeats until the target state is consistent.
        """
        units = [u for u in range(len(self.u_guests)) if self.state[u] == _PENDING]
        if not units:
            return
        rank = self.u_rank
        final_node: dict[int, int] = {}
        unit_of: dict[int, int] = {}
        for u in units:
            for g in self.u_guests[u]:
                final_node[g] = self.u_target[u]
                unit_of[g] = u
        dropped: dict[int, str] = {}

        def drop(u: int, reason: str) -> None:
            dropped[u] = reason
            for g in self.u_guests[u]:
                del final_node[g]

        def partner_units(u: int) -> list[int]:
            """Pending units of the hard negative partners of ``u``'s guests."""
            out = []
            for g in self.u_guests[u]:
                for r in self.neg.get(g, ()):
                    q = unit_of.get(r, -1)
                    if q >= 0 and q not in dropped:
                        out.append(q)
            return out

        work = deque(u for u in units if self.u_partners[u] is not None)
        while True:
            # 1. Hard anti-affinity in the target state.
            while work:
                u = work.popleft()
                parts = self.u_partners[u]
                if u in dropped or parts is None:
                    continue
                t = self.u_target[u]
                for p in parts.tolist():
                    q = unit_of.get(p, -1)
                    moving = q >= 0 and q not in dropped
                    if self.extra[p] == t:
                        why = "is migrating there"
                    elif moving and final_node[p] == t:
                        why = "goes there too"
                    elif not moving and self.pos[p] == t:
                        why = "stays there"
                    else:
                        continue
                    if moving and rank[q] > rank[u]:
                        loser = q
                        mine = next(g for g in self.u_guests[u] if p in self.neg.get(g, ()))
                        who, why = self.ids[mine], "goes there too"
                        work.append(u)
                    else:
                        loser, who = u, self.ids[p]
                    drop(
                        loser,
                        f"{self._label(loser)} cannot move to {self.names[t]}: its hard "
                        f"anti-affinity partner {who} {why}",
                    )
                    # Its guests stay where they are, where partners may be heading.
                    work.extend(partner_units(loser))
                    break

            # 2. Capacity of the target state.
            alive = [u for u in units if u not in dropped]
            final = self.committed.copy()
            by_target: dict[int, list[int]] = {}
            for u in alive:
                t = self.u_target[u]
                final[t] += self.demand[u]
                by_target.setdefault(t, []).append(u)
                for g in self.u_guests[u]:
                    final[self.pos[g]] -= self.gd[g]
            queue = deque(np.nonzero(np.any(final > self.bound, axis=1))[0].tolist())
            fresh: list[int] = []
            while queue:
                t = queue.popleft()
                if not np.any(final[t] > self.bound[t]):
                    continue
                here: list[int] = []
                for u in sorted(by_target.get(t, ()), key=rank.__getitem__, reverse=True):
                    need = final[t] > self.bound[t]
                    if not need.any():
                        break
                    if u in dropped:
                        continue
                    dims = ", ".join(self.dims[d] for d in np.nonzero(need)[0].tolist())
                    drop(
                        u,
                        f"{self._label(u)} cannot move to {self.names[t]}: the target "
                        f"placement leaves no room for it there ({dims})",
                    )
                    here.append(u)
                    final[t] -= self.demand[u]
                    for g in self.u_guests[u]:
                        final[self.pos[g]] += self.gd[g]
                        queue.append(int(self.pos[g]))
                for u in reversed(here):  # Take back what was given up needlessly, best first.
                    if np.all(final[t] + self.demand[u] <= self.bound[t]):
                        del dropped[u]
                        final[t] += self.demand[u]
                        for g in self.u_guests[u]:
                            final[self.pos[g]] -= self.gd[g]
                            final_node[g] = t
                    else:
                        fresh.append(u)
            if not fresh:
                break
            for u in fresh:
                if u in dropped:
                    work.extend(partner_units(u))
            if not work:
                break
        for u in sorted(dropped, key=rank.__getitem__):
            self._unreachable(u, dropped[u])

    # ---------------------------------------------------------------------------- steps

    def run(self, requests: list[tuple[int, int]]) -> Plan:
        self._build_units(requests)
        step = 0
        while self.n_pending:
            accepted, alone = self._fill_step()
            if accepted:
                step += 1
                if alone is not None:
                    m = len(self.u_guests[alone])
                    over = []
                    if m > self.max_parallel:
                        over.append(f"max_parallel={self.max_parallel}")
                    if m > self.max_inflow:
                        over.append(f"max_node_inflow={self.max_inflow}")
                    self.problems.append(
                        f"{self._label(alone)} moves {m} guests together, more than "
                        f"{' and '.join(over)}: it runs alone in step {step}"
                    )
                self._apply(accepted, step)
            elif not self._break_deadlock():
                # Cannot happen (every stuck state has a hopeless unit or a cycle); stay safe.
                stuck = [u for w in self.waiting for u in w if self.state[u] == _PENDING]
                for u in stuck:
                    self._unreachable(u, f"{self._label(u)}: no safe order found")
                break
        moves = tuple(sorted(self.moves, key=lambda m: (m.step, m.guest)))
        unreachable = tuple(sorted(self.unreachable))
        problems = tuple(dict.fromkeys(self.problems))
        return Plan(moves, not unreachable, unreachable, problems)

    def _fill_step(self) -> tuple[list[int], int | None]:
        """Take ready units in rank order while they are safe: the units of the next step."""
        count = 0
        inflow: dict[int, int] = {}
        step_in: dict[int, np.ndarray] = {}
        step_target: dict[int, int] = {}
        accepted: list[int] = []
        deferred: list[int] = []
        closed: list[int] = []
        misses: dict[int, int] = {}
        alone: int | None = None
        heads = self.heads
        while heads and count < self.max_parallel:
            rank, n = heapq.heappop(heads)
            if self.head[n] != rank:
                continue  # stale entry
            self.head[n] = None
            _rank, u = heapq.heappop(self.ready[n])
            outcome = self._try(u, n, count, inflow, step_in, step_target)
            if outcome == _WAIT:
                self.waiting[n].append(u)
            elif outcome == _DEFER:
                deferred.append(u)
            elif outcome == _DEFER_ROOM:
                # The room left here is taken by the step; a few smaller units may still fit.
                deferred.append(u)
                misses[n] = misses.get(n, 0) + 1
            elif outcome in (_ACCEPT, _ALONE):
                accepted.append(u)
                m = len(self.u_guests[u])
                count += m
                inflow[n] = inflow.get(n, 0) + m
                step_in[n] = step_in.get(n, 0.0) + self.demand[u]
                for g in self.u_guests[u]:
                    step_target[g] = n
                if outcome == _ALONE:
                    alone = u
            if inflow.get(n, 0) < self.max_inflow and misses.get(n, 0) < self.max_inflow:
                self._register(n)
            else:
                closed.append(n)
            if alone is not None:
                break
        for u in deferred:
            self._push_ready(u)
        for n in closed:
            self._register(n)
        return accepted, alone

    def _try(
        self,
        u: int,
        n: int,
        count: int,
        inflow: dict[int, int],
        step_in: dict[int, np.ndarray],
        step_target: dict[int, int],
    ) -> int:
        """Whether unit ``u`` can join the step being filled (see the module's safety model)."""
        if self.state[u] != _PENDING:
            return _SKIP
        guests = self.u_guests[u]
        # The state at the start of the step.
        demand = self.demand[u]
        row = self.committed[n]
        if not np.all(row + demand <= self.bound[n]):
            return _WAIT
        if self._blocked_at(u, n):
            return _WAIT
        # The step so far.
        if any(g in step_target for g in guests):
            return _DEFER
        m = len(guests)
        if m > self.max_parallel or m > self.max_inflow:
            return _ALONE if count == 0 else _DEFER
        if count + m > self.max_parallel or inflow.get(n, 0) + m > self.max_inflow:
            return _DEFER
        extra = step_in.get(n)
        if extra is not None and not np.all(row + extra + demand <= self.bound[n]):
            return _DEFER_ROOM
        parts = self.u_partners[u]
        if parts is not None and step_target:
            for p in parts.tolist():
                if step_target.get(p) == n:
                    return _DEFER
        return _ACCEPT

    def _apply(self, accepted: list[int], step: int) -> None:
        """Run a step: move its guests, then look again at the nodes they left."""
        departed: set[int] = set()
        for u in accepted:
            n = self.u_target[u]
            parking = self.u_kind[u] == _PARK
            for g in self.u_guests[u]:
                s = int(self.pos[g])
                demand = self.gd[g]
                self.committed[s] -= demand
                self.committed[n] += demand
                self.pos[g] = n
                departed.add(s)
                self.moves.append(
                    PlannedMove(self.ids[g], self.names[s], self.names[n], step, parking)
                )
            self._set_state(u, _DONE)
            link = self.u_link[u]
            if self.u_kind[u] != _PARK and link >= 0 and self.state[link] == _PENDING:
                # The guest went straight to its target: its parking move is not needed.
                self._set_state(link, _CANCELLED)
        for s in sorted(departed):
            self._reexamine(s)

    # ---------------------------------------------------------------------------- deadlocks

    def _unreachable(self, u: int, reason: str | None) -> None:
        """Give up unit ``u``; a parked guest goes back where it came from, if it can."""
        kind = self.u_kind[u]
        if kind == _PARK:
            self._set_state(u, _CANCELLED)
            return
        self._set_state(u, _UNREACHABLE)
        guests = self.u_guests[u]
        if kind == _RETURN:
            where = self.names[int(self.pos[guests[0]])]
            self.problems.append(
                f"{self._label(u)} stays on {where}, where it was parked"
                + (f": {reason}" if reason else "")
            )
            return
        target = self.names[self.u_target[u]]
        for g in guests:
            self.unreachable.add((self.ids[g], target))
        if reason:
            self.problems.append(reason)
        link = self.u_link[u]
        if link >= 0 and self.state[link] == _PENDING:
            self._set_state(link, _CANCELLED)
        by_origin: dict[int, list[int]] = {}
        for g in guests:
            if self.pos[g] != self.orig[g]:
                by_origin.setdefault(int(self.orig[g]), []).append(g)
        for origin, members in sorted(by_origin.items()):
            back = self._add_unit(
                tuple(members), origin, self.u_rank[u], _RETURN, self.u_partners[u]
            )
            self._classify(back)

    def _hopeless(self, u: int, leaving: np.ndarray, moving: dict[int, int]) -> str | None:
        """Why unit ``u`` cannot arrive even if every pending move off its target ran first."""
        t = self.u_target[u]
        need = self.committed[t] - leaving[t] + self.demand[u] > self.bound[t]
        label, where = self._label(u), self.names[t]
        if need.any():
            dims = ", ".join(self.dims[d] for d in np.nonzero(need)[0].tolist())
            return (
                f"{label} cannot move to {where}: not enough room there ({dims}) "
                "even after every planned move off it"
            )
        parts = self.u_partners[u]
        if parts is not None:
            for p in parts.tolist():
                if self.extra[p] == t:
                    return (
                        f"{label} cannot move to {where}: its hard anti-affinity partner "
                        f"{self.ids[p]} is migrating there"
                    )
                if self.pos[p] == t and p not in moving:
                    return (
                        f"{label} cannot move to {where}: its hard anti-affinity partner "
                        f"{self.ids[p]} stays there"
                    )
        return None

    def _break_deadlock(self) -> bool:
        """Nothing could move: give up hopeless units, or park a member of a cycle.

        Returns whether anything changed (then the next step can make progress).
        """
        waiting = np.fromiter(itertools.chain.from_iterable(self.waiting), dtype=np.intp, count=-1)
        units = np.unique(waiting[self.state[waiting] == _PENDING])
        # A parking move that no longer fits its spare is dropped; its guest waits where it is.
        for u in units[self.rank_np[units] < 0].tolist():
            self._set_state(u, _CANCELLED)
        units = units[self.rank_np[units] >= 0]
        units = units[np.argsort(self.rank_np[units], kind="stable")]
        pending = units.tolist()
        targets = self.target_np[units]
        fits = np.all(self.committed[targets] + self.demand[units] <= self.bound[targets], axis=1)
        promoted = False
        for u in units[fits].tolist():
            n = self.u_target[u]
            if not self._blocked_at(u, n):
                self.waiting[n].remove(u)
                self._push_ready(u)
                promoted = True
        if promoted:
            return True

        # 1. Hopeless units, until what is left waits only on units that can still move.
        n_nodes = len(self.names)
        mover_units: list[int] = []
        mover_guests: list[int] = []
        for u in pending:
            for g in self.u_guests[u]:
                mover_units.append(u)
                mover_guests.append(g)
        moving = dict(zip(mover_guests, mover_units, strict=True))
        movers = np.array(mover_guests, dtype=np.intp)
        leaving = np.zeros((n_nodes, len(self.dims)))
        np.add.at(leaving, self.pos[movers], self.gdm[movers])
        by_target = _Grouped(targets, units)
        alive = dict.fromkeys(pending)
        suspects = np.any(
            self.committed[targets] - leaving[targets] + self.demand[units] > self.bound[targets],
            axis=1,
        )
        work = deque(
            u
            for u, bad in zip(pending, suspects.tolist(), strict=True)
            if bad or self.u_partners[u] is not None
        )
        removed = False
        while work:
            u = work.popleft()
            if u not in alive:
                continue
            reason = self._hopeless(u, leaving, moving)
            if reason is None:
                continue
            del alive[u]
            sources = set()
            for g in self.u_guests[u]:
                leaving[self.pos[g]] -= self.gd[g]
                moving.pop(g, None)
                sources.add(int(self.pos[g]))
            self._unreachable(u, reason)
            removed = True
            for s in sorted(sources):
                work.extend(v for v in by_target.get(s) if v in alive)
        if removed:
            self._drop_settled()
            return True

        # 2. Cycles: walk "waits for" edges from each unit; park one member of each cycle.
        by_source = _Grouped(self.pos[movers], np.array(mover_units, dtype=np.intp))
        final = self.committed - leaving
        np.add.at(final, targets, self.demand[units])
        round_ = _Round(self.committed.copy(), np.zeros(n_nodes, dtype=np.int64), final)
        # Pass 1 parks one guest per node-disjoint cycle; pass 2 spends what is left of the step
        # on more "holes" in the cycles already opened (at most max_node_inflow per node), which
        # lets long rings move at several places at once.
        excluded: set[int] = set()
        touched: set[int] = set()
        first_unbreakable: list[int] | None = None
        for disjoint in (True, False):
            seen: set[int] = set()
            for start in alive:
                if round_.count >= self.max_parallel:
                    break
                if start in seen or start in excluded:
                    continue
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
                    cur = self._successor(cur, alive, moving, by_source, excluded)
                seen.update(path)
                if cycle is None:
                    continue
                nodes = self._cycle_nodes(cycle)
                if disjoint and nodes & touched:
                    continue
                if self._park(cycle, nodes, alive, by_target, round_, extra_hole=not disjoint):
                    excluded.update(cycle)
                    touched |= nodes
                elif disjoint and first_unbreakable is None:
                    first_unbreakable = cycle
            if not round_.count:
                break
        if round_.count:
            return True
        if first_unbreakable is not None:
            members = ", ".join(
                f"{self._label(u)} ({self._source_names(u)} → {self.names[self.u_target[u]]})"
                for u in first_unbreakable
            )
            self.problems.append(
                f"Cycle {members} cannot be broken: no spare node can take one of its guests safely"
            )
            for u in first_unbreakable:
                self._unreachable(u, None)
            self._drop_settled()
            return True
        return False

    def _drop_settled(self) -> None:
        for n, w in enumerate(self.waiting):
            if w:
                self.waiting[n] = [u for u in w if self.state[u] == _PENDING]

    def _source_names(self, u: int) -> str:
        return "+".join(dict.fromkeys(self.names[int(self.pos[g])] for g in self.u_guests[u]))

    def _successor(
        self,
        u: int,
        alive: dict[int, None],
        moving: dict[int, int],
        by_source: _Grouped,
        excluded: set[int],
    ) -> int | None:
        """The best-ranked pending unit that ``u`` waits for (one leaving ``u``'s target)."""
        t = self.u_target[u]
        if self._blocked_at(u, t):
            parts = self.u_partners[u]
            assert parts is not None
            waits = sorted(
                {moving[p] for p in parts.tolist() if self.pos[p] == t and p in moving},
                key=self.u_rank.__getitem__,
            )
        else:
            waits = by_source.get(t)
        for v in waits:
            if v in alive and v not in excluded and v != u:
                return v
        return None

    def _cycle_nodes(self, cycle: list[int]) -> set[int]:
        """The sources and targets of a cycle's moves."""
        nodes: set[int] = set()
        for u in cycle:
            nodes.add(self.u_target[u])
            nodes.update(int(self.pos[g]) for g in self.u_guests[u])
        return nodes

    def _park(
        self,
        cycle: list[int],
        cycle_nodes: set[int],
        alive: dict[int, None],
        by_target: _Grouped,
        round_: _Round,
        *,
        extra_hole: bool = False,
    ) -> bool:
        """Park one member of ``cycle`` on a spare node; False when none can be parked.

        With ``extra_hole`` the cycle shares nodes with one parked already in this round: only a
        member leaving a node with fewer than ``max_node_inflow`` holes this round is parked.
        """
        candidates = [v for v in cycle if self.u_kind[v] == _MOVE and not self.u_parked[v]]
        if extra_hole:
            candidates = [
                v
                for v in candidates
                if all(
                    round_.holes.get(int(self.pos[g]), 0) < self.max_inflow
                    for g in self.u_guests[v]
                )
            ]
        cost = {v: sum(self._copy_bytes(g) for g in self.u_guests[v]) for v in candidates}
        candidates.sort(
            key=lambda v: (not self._unblocks(v, alive, by_target), cost[v], self.u_rank[v])
        )
        for v in candidates:
            spare = self._spare(v, cycle_nodes, round_)
            if spare is None:
                continue
            guests = self.u_guests[v]
            self.park_counter += 1
            park = self._add_unit(
                guests, spare, _PARK_RANK + self.park_counter, _PARK, self.u_partners[v]
            )
            self.u_link[park] = v
            self.u_link[v] = park
            self.u_parked[v] = True
            # The parked guest moves on last, so the room it left keeps the cycle moving.
            self.u_rank[v] = self.rank_np[v] = _LAST_RANK + self.park_counter
            self._push_ready(park)
            round_.committed[spare] += self.demand[v]
            round_.inflow[spare] += len(guests)
            round_.count += len(guests)
            for g in guests:
                round_.parked_on[g] = spare
            for s in {int(self.pos[g]) for g in guests}:
                round_.holes[s] = round_.holes.get(s, 0) + 1
            return True
        return False

    def _copy_bytes(self, g: int) -> int:
        guest = self.cluster.guests[g]
        running = bool(np.any(self.gd[g][~self.cons.capacity.storage_cols] > 0))
        return (guest.memory if running else 0) + guest.local_disk_bytes

    def _unblocks(self, v: int, alive: dict[int, None], by_target: _Grouped) -> bool:
        """Whether parking unit ``v`` lets a waiting unit into one of ``v``'s sources at once."""
        guests = set(self.u_guests[v])
        for s in dict.fromkeys(int(self.pos[g]) for g in guests):
            freed = self.committed[s].copy()
            for g in guests:
                if self.pos[g] == s:
                    freed -= self.gd[g]
            for w in by_target.get(s):
                if w == v or w not in alive:
                    continue
                if not np.all(freed + self.demand[w] <= self.bound[s]):
                    continue
                parts = self.u_partners[w]
                if parts is not None and any(
                    p not in guests and (self.pos[p] == s or self.extra[p] == s)
                    for p in parts.tolist()
                ):
                    continue
                return True
        return False

    def _spare(self, v: int, cycle_nodes: set[int], round_: _Round) -> int | None:
        """The spare node for parking unit ``v`` (most headroom after the move, then name)."""
        guests = self.u_guests[v]
        m = len(guests)
        oversize = m > self.max_parallel or m > self.max_inflow
        if oversize and round_.count:
            return None
        if not oversize and round_.count + m > self.max_parallel:
            return None
        demand = self.demand[v]
        ok = self.usable.copy()
        for g in guests:
            ok &= self.cons.arch_ok[g]
            # A guest that already sits outside its strict node affinity (it is moving to
            # comply) may wait outside it too: that is no worse than now.
            if self.cons.strict_ok[g, self.orig[g]]:
                ok &= self.cons.strict_ok[g]
            ok[self.pos[g]] = False
        ok[sorted(cycle_nodes)] = False
        if not oversize:
            ok &= round_.inflow + m <= self.max_inflow
        ok &= np.all(round_.committed + demand <= self.bound, axis=1)
        parts = self.u_partners[v]
        if parts is not None:
            for p in parts.tolist():
                ok[self.pos[p]] = False
                if self.extra[p] >= 0:
                    ok[self.extra[p]] = False
                if p in round_.parked_on:
                    ok[round_.parked_on[p]] = False
        candidates = np.nonzero(ok)[0]
        if not candidates.size:
            return None
        limit = self.limit[candidates]
        peak = np.maximum(round_.committed[candidates], round_.final[candidates]) + demand
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(limit > 0, (limit - peak) / np.where(limit > 0, limit, 1.0), np.inf)
        room = frac.min(axis=1)
        best = min(
            range(len(candidates)),
            key=lambda i: (-room[i], self.names[candidates[i]]),
        )
        return int(candidates[best])


class _Grouped:
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
class _Round:
    """Reservations of the parking moves chosen in one deadlock round (they share a step)."""

    committed: np.ndarray
    inflow: np.ndarray
    #: Committed capacity once every pending move has run (the spare's load to come).
    final: np.ndarray
    count: int = 0
    #: Guest -> the spare it is parked on in this round.
    parked_on: dict[int, int] = field(default_factory=dict)
    #: Node -> parking moves leaving it in this round.
    holes: dict[int, int] = field(default_factory=dict)


__all__ = ["Plan", "PlannedMove", "plan_moves", "plan_with_retries"]
