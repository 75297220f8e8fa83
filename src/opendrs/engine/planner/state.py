"""The planner's working state: the units, where every guest is, and the queues of pending units.

A **unit** is one move that runs within one step: a guest, or the members of a hard-positive
bundle that share a target node. The scheduler (:mod:`.scheduler`), the check of the target state
(:mod:`.target`) and the deadlock breaker (:mod:`.parking`) all work on the three objects defined
here:

* :class:`Units` — every unit of the run: its guests, target, rank, kind and state, as parallel
  lists (quick to read one unit at a time) and growable arrays (for the vectorised checks);
* :class:`Occupancy` — the state at the start of the next step: the node of every guest, and what
  every node holds against its limits;
* :class:`Queues` — the pending units by target node: ready (they fit there now) or waiting.
"""

from __future__ import annotations

import heapq
from typing import Final

import numpy as np

from opendrs.model.cluster import Cluster

from ..constraints import Constraints, current_assign
from ..usage import tolerance


class UnitState:
    """What has become of a unit: the values of :attr:`Units.state`.

    Plain integers rather than an ``enum.IntEnum``: the states live in a numpy array, and numpy
    compares an array or one of its elements with an enum member many times more slowly than with
    an int.
    """

    #: Still to move.
    PENDING: Final = 0
    #: Moved.
    DONE: Final = 1
    #: Given up: no safe order reaches its target.
    UNREACHABLE: Final = 2
    #: Not needed any more: a parking move whose guest went straight on, or that no longer fits.
    CANCELLED: Final = 3


class UnitKind:
    """Why a unit moves: the values of :attr:`Units.kind`."""

    #: A requested placement.
    MOVE: Final = 0
    #: A temporary move to a spare node, which breaks a cycle of waiting units.
    PARK: Final = 1
    #: A parked guest going back where it came from, its own target having proved unreachable.
    RETURN: Final = 2


#: Parking units rank before every other unit, in the order they were created.
PARK_RANK: Final = -(10**12)
#: The final move of a parked guest ranks after every other unit.
LAST_RANK: Final = 10**12


class Units:
    """Every unit of one planning run, by index: the order in which they were added."""

    def __init__(
        self, guest_ids: list[str], guest_demand: np.ndarray, guest_labels: list[str] | None = None
    ) -> None:
        self.guest_ids = guest_ids
        #: How an operator knows each guest (``name (id)``), for messages; the ids by default.
        self.guest_labels = guest_ids if guest_labels is None else guest_labels
        #: Capacity demand of each moving guest (guests × dimensions), shared with
        #: :class:`Occupancy`; a unit's demand is its guests' sum.
        self.guest_demand = guest_demand
        self.n_dims = guest_demand.shape[1]
        # One entry per unit.
        self.guests: list[tuple[int, ...]] = []
        self.target: list[int] = []
        #: Lower ranks move first.
        self.rank: list[int] = []
        #: A :class:`UnitKind`.
        self.kind: list[int] = []
        #: The hard negative partners of the unit's guests (never one of them), None if none.
        self.partners: list[np.ndarray | None] = []
        #: A parked unit's parking unit, and a parking unit's parked unit (else -1).
        self.link: list[int] = []
        #: Whether the unit has been parked (a guest is parked at most once).
        self.parked: list[bool] = []
        # The same as arrays, grown as units are added (a unit's row of ``demand`` is its demand).
        self.demand = np.zeros((16, self.n_dims))
        #: A :class:`UnitState`.
        self.state = np.zeros(16, dtype=np.int8)
        self.target_array = np.zeros(16, dtype=np.intp)
        self.rank_array = np.zeros(16, dtype=np.int64)
        #: Whether the unit has hard negative partners.
        self.partnered = np.zeros(16, dtype=bool)
        #: How many units are pending.
        self.pending_count = 0

    def __len__(self) -> int:
        return len(self.guests)

    def add(
        self,
        guests: tuple[int, ...],
        target: int,
        rank: int,
        kind: int,
        partners: np.ndarray | None,
        demand: np.ndarray | None = None,
    ) -> int:
        """Add a pending unit (``demand`` defaults to its guests' sum); returns its index."""
        u = len(self.guests)
        if u >= len(self.state):
            grow = max(16, len(self.state))
            self.demand = np.vstack([self.demand, np.zeros((grow, self.n_dims))])
            self.state = np.concatenate([self.state, np.zeros(grow, dtype=np.int8)])
            self.target_array = np.concatenate([self.target_array, np.zeros(grow, dtype=np.intp)])
            self.rank_array = np.concatenate([self.rank_array, np.zeros(grow, dtype=np.int64)])
            self.partnered = np.concatenate([self.partnered, np.zeros(grow, dtype=bool)])
        self.guests.append(guests)
        self.target.append(target)
        self.rank.append(rank)
        self.kind.append(kind)
        self.partners.append(partners)
        self.link.append(-1)
        self.parked.append(False)
        if demand is None:
            demand = sum((self.guest_demand[g] for g in guests), np.zeros(self.n_dims))
        self.demand[u] = demand
        self.state[u] = UnitState.PENDING
        self.target_array[u] = target
        self.rank_array[u] = rank
        self.partnered[u] = partners is not None
        self.pending_count += 1
        return u

    def set_state(self, u: int, state: int) -> None:
        """Settle unit ``u`` (``state`` is a :class:`UnitState`)."""
        if self.state[u] == UnitState.PENDING:
            self.pending_count -= 1
        self.state[u] = state

    def label(self, u: int) -> str:
        """``guest NAME (ID)`` or ``bundle NAME (ID), …``, for messages."""
        guests = self.guests[u]
        if len(guests) == 1:
            return f"guest {self.guest_labels[guests[0]]}"
        return "bundle " + ", ".join(self.guest_labels[g] for g in guests)


class Occupancy:
    """Where every guest is and what every node holds, at the start of the next step."""

    def __init__(self, cluster: Cluster, constraints: Constraints, node_names: list[str]) -> None:
        capacity = constraints.capacity
        self.node_names = node_names
        #: The hard capacity dimensions.
        self.dimensions = capacity.dimensions
        #: What every node may hold (nodes × dimensions), and the same with the capacity model's
        #: rounding tolerance: what the checks compare with.
        self.limit = capacity.limit
        self.bound = capacity.limit + tolerance(capacity.limit)
        #: Committed capacity (nodes × dimensions).
        self.committed = capacity.committed()
        #: The node of every guest (and, in :attr:`origin`, before the plan).
        self.position = current_assign(cluster)
        self.origin = self.position.copy()
        #: The migration target of every guest already migrating when the plan starts (else -1).
        self.migrating_to = np.full(len(cluster.guests), -1, dtype=np.intp)
        for j, guest in enumerate(cluster.guests):
            if guest.migrating_to is not None and guest.migrating_to != guest.node:
                self.migrating_to[j] = cluster.node_index.get(guest.migrating_to, -1)
        #: The hard negative partners of every guest that has any, made symmetric (never itself).
        self.anti_partners: dict[int, set[int]] = {}
        for j in constraints.hard_neg.having().tolist():
            for p in constraints.hard_neg[j].tolist():
                if p != j:
                    self.anti_partners.setdefault(j, set()).add(p)
                    self.anti_partners.setdefault(p, set()).add(j)
        #: Capacity demand each guest brings to its target (guests × dimensions), read-only:
        #: the capacity model's :attr:`~opendrs.engine.usage.CapacityModel.moving`.
        self.guest_demand = capacity.moving

    def fits(self, demand: np.ndarray, n: int) -> bool:
        """Whether ``demand`` fits on node ``n`` now."""
        return bool(np.all(self.committed[n] + demand <= self.bound[n]))

    def holds_partner(self, partners: np.ndarray | None, n: int) -> bool:
        """Whether one of ``partners`` occupies node ``n`` now (as its node or migration target)."""
        if partners is None:
            return False
        return bool(
            (self.position[partners] == n).any() or (self.migrating_to[partners] == n).any()
        )


class Queues:
    """The pending units by target node, ready or waiting.

    Ready units — those that fit at their target now — sit in a heap per target node (by rank),
    with one global heap over the heads of those heaps; waiting units in a list per target node.
    """

    def __init__(self, units: Units, n_nodes: int) -> None:
        self.units = units
        #: Per node, a heap of (rank, unit) of its ready units.
        self.ready: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes)]
        #: Per node, its waiting units.
        self.waiting: list[list[int]] = [[] for _ in range(n_nodes)]
        #: Global heap of (rank of the head of ready[n], n); ``head_rank[n]`` is the live entry.
        self.heads: list[tuple[int, int]] = []
        self.head_rank: list[int | None] = [None] * n_nodes

    def push_ready(self, u: int) -> None:
        """Make unit ``u`` ready at its target."""
        n = self.units.target[u]
        rank = self.units.rank[u]
        heapq.heappush(self.ready[n], (rank, u))
        current = self.head_rank[n]
        if current is None or rank < current:
            self.head_rank[n] = rank
            heapq.heappush(self.heads, (rank, n))

    def promote(self, u: int) -> None:
        """Move waiting unit ``u`` to ready."""
        self.waiting[self.units.target[u]].remove(u)
        self.push_ready(u)

    def register(self, n: int) -> None:
        """Put node ``n``'s best ready unit in the global heap (if it is not there already)."""
        heap = self.ready[n]
        if heap:
            rank = heap[0][0]
            if self.head_rank[n] != rank:
                self.head_rank[n] = rank
                heapq.heappush(self.heads, (rank, n))
        else:
            self.head_rank[n] = None

    def pop_best(self) -> tuple[int, int] | None:
        """(node, unit) of the best-ranked ready unit, taken off the queues; None if none is.

        The node leaves the global heap until :meth:`register` puts it back.
        """
        heads = self.heads
        while heads:
            rank, n = heapq.heappop(heads)
            if self.head_rank[n] != rank:
                continue  # stale entry
            self.head_rank[n] = None
            _rank, u = heapq.heappop(self.ready[n])
            return n, u
        return None

    def drop_settled(self) -> None:
        """Forget the waiting units that are no longer pending."""
        state = self.units.state
        for n, waiting in enumerate(self.waiting):
            if waiting:
                self.waiting[n] = [u for u in waiting if state[u] == UnitState.PENDING]
