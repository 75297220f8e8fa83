"""Placement: where one guest (or a bundle of guests kept together) should go.

Used for a new guest, for a guest to recover from a failed node, for guests to evacuate from a node
in maintenance, and to ask where an existing guest would be best. Kubernetes-style: every node is
filtered by the hard constraints (each rejected node keeps the reason), the rest are scored, and
the ranking is sorted by score, then the current node first, then by name.

The score of a node is the cluster's balance after the placement — the capacity-weighted standard
deviation of the node load fractions, resources combined with the cluster's weights (lower is
better) — plus :data:`~opendrs.engine.constraints.SOFT_PENALTY` for each soft rule the placement
breaks. Only usable nodes (online, not in maintenance) take part in the balance figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from opendrs.model.cluster import Cluster, Guest, Move

from .constraints import (
    Constraints,
    Purpose,
    Rejection,
    RejectionCode,
    committed_for,
    current_assign,
    movability,
    reasons_text,
)
from .imbalance import normalise_weights
from .usage import RESOURCES, LoadModel, loaded_nodes


@dataclass(frozen=True, slots=True)
class NodeScore:
    """A node that can take the guest, with its score (lower is better)."""

    node: str
    score: float
    balance: float
    penalty: float
    #: Load fraction per resource on this node after the placement.
    fractions: dict[str, float]
    current: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "score": self.score,
            "balance": self.balance,
            "penalty": self.penalty,
            "fractions": self.fractions,
            "current": self.current,
        }


@dataclass(frozen=True)
class Placement:
    """The answer to "where should this guest go?"."""

    guest: str
    members: tuple[str, ...]
    purpose: str
    ranking: tuple[NodeScore, ...]
    rejected: tuple[Rejection, ...]
    #: Why the guest may not move at all (then ``ranking`` is empty), or None.
    blocked: str | None = None
    current: str | None = None

    @property
    def best(self) -> str | None:
        return self.ranking[0].node if self.ranking else None

    def as_dict(self) -> dict[str, object]:
        return {
            "guest": self.guest,
            "members": list(self.members),
            "purpose": self.purpose,
            "current": self.current,
            "best": self.best,
            "blocked": self.blocked,
            "ranking": [s.as_dict() for s in self.ranking],
            "rejected": [r.as_dict() for r in self.rejected],
        }


@dataclass
class PlacementState:
    """A placement in progress: constraints plus the evolving assignment and loads."""

    constraints: Constraints
    loads: LoadModel
    assign: np.ndarray
    #: Balance loads (N, R) under ``assign``.
    node_load: np.ndarray
    #: Capacity committed (N, D) under ``assign``.
    committed: np.ndarray
    #: (G,) guests that load the node they are placed on (running or paused).
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    weights: np.ndarray = field(default_factory=lambda: np.ones(len(RESOURCES)) / len(RESOURCES))
    #: (G,) whether each guest's balance load is counted on ``assign[j]`` in ``node_load``.
    counted: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @classmethod
    def build(
        cls,
        cluster: Cluster,
        constraints: Constraints | None = None,
        forbidden: Iterable[tuple[str, str]] = (),
        loads: LoadModel | None = None,
    ) -> PlacementState:
        """The current placement of ``cluster``: ``constraints`` (None: built with ``forbidden``)
        say what is allowed, ``loads`` (None: built) are its balance loads."""
        constraints = constraints or Constraints.build(cluster, forbidden)
        loads = loads if loads is not None else LoadModel.build(cluster)
        assign = current_assign(cluster)
        settings = cluster.settings
        return cls(
            constraints=constraints,
            loads=loads,
            assign=assign,
            node_load=loads.loads(),
            committed=constraints.capacity.committed(),
            running=np.array([bool(loaded_nodes(g)) for g in cluster.guests], dtype=bool),
            counted=loads.active.copy(),
            weights=normalise_weights(
                [settings.weight_cpu, settings.weight_memory], len(RESOURCES)
            ),
        )

    @property
    def cluster(self) -> Cluster:
        return self.constraints.cluster

    def bundle(self, j: int) -> np.ndarray:
        """Guest ``j`` and its hard positive partners: the set that moves together."""
        return self.constraints.unit_members(j)

    def _without(self, members: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """assign, balance loads and committed capacity with ``members`` taken off their nodes."""
        assign = self.assign.copy()
        node_load = self.node_load.copy()
        committed = self.committed.copy()
        cons = self.constraints
        for j in members.tolist():
            n = int(assign[j])
            if n >= 0:
                if self.counted[j]:
                    node_load[n] -= self.loads.demand[j]
                committed[n] -= cons.guest_demand(j)
            assign[j] = -1
        return assign, node_load, committed

    def allowed(self, members: np.ndarray) -> np.ndarray:
        """(N,) nodes that pass every hard filter for the bundle ``members`` (no explanations)."""
        cons = self.constraints
        saved = self.assign[members].copy()
        committed = self.committed.copy()
        for j, n in zip(members.tolist(), saved.tolist(), strict=True):
            if n >= 0:
                committed[n] -= cons.guest_demand(j)
        self.assign[members] = -1
        try:
            headroom = cons.capacity.limit - committed
            demand = sum(
                (cons.guest_demand(j) for j in members.tolist()),
                np.zeros(len(cons.capacity.dimensions)),
            )
            ok = np.ones(len(self.cluster.nodes), dtype=bool)
            for j in members.tolist():
                ok &= cons.allowed(j, self.assign, headroom, demand)
            return ok
        finally:
            self.assign[members] = saved

    def evaluate(
        self, members: np.ndarray
    ) -> tuple[list[tuple[int, float, float, float]], list[Rejection]]:
        """Score every node for a bundle: ([(node, score, balance, penalty)], [Rejection])."""
        cons = self.constraints
        cluster = self.cluster
        n_nodes = len(cluster.nodes)
        assign, base_load, committed = self._without(members)
        headroom = cons.capacity.limit - committed
        demand_cap = sum(
            (cons.guest_demand(j) for j in members.tolist()),
            np.zeros(len(cons.capacity.dimensions)),
        )
        demand_bal = np.zeros(len(RESOURCES))
        for j in members.tolist():
            if self.running[j]:
                demand_bal = demand_bal + self.loads.demand[j]
        ok = np.ones(n_nodes, dtype=bool)
        first_fail: dict[int, tuple[int, RejectionCode]] = {}
        for j in members.tolist():
            for name, mask in cons.hard_masks(j, assign, headroom, demand_cap):
                bad = np.nonzero(ok & ~mask)[0]
                for n in bad.tolist():
                    first_fail.setdefault(n, (j, name))
                ok &= mask
        rejected = [
            cons.rejection(first_fail[n][1], first_fail[n][0], n, assign, headroom, demand_cap)
            for n in sorted(first_fail)
        ]
        balance = self._balance_after(base_load, demand_bal)
        penalty = np.zeros(n_nodes)
        for j in members.tolist():
            penalty = penalty + cons.soft_penalty(j, assign)
        scored = []
        for n in np.nonzero(ok)[0].tolist():
            scored.append((n, float(balance[n] + penalty[n]), float(balance[n]), float(penalty[n])))
        # Lower score first; on a tie the node the bundle is on now, then the name.
        here = int(self.assign[members[0]])
        scored.sort(key=lambda t: (round(t[1], 12), t[0] != here, cluster.nodes[t[0]].name))
        return scored, rejected

    def _balance_after(self, base_load: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """(N,) capacity-weighted std of the usable nodes' fractions if ``demand`` went to each."""
        cons = self.constraints
        cap = self.loads.capacity
        usable = cons.usable & np.all(cap > 0, axis=1)
        c = np.where(usable[:, None], cap, 0.0)
        load = np.where(usable[:, None], base_load, 0.0)
        total_c = c.sum(axis=0)
        safe_c = np.where(c > 0, c, 1.0)
        s0 = np.where(c > 0, load**2 / safe_c, 0.0).sum(axis=0)  # (R,)
        # Each candidate node adds ``demand`` to its own row only.
        delta = np.where(c > 0, (2 * load * demand[None, :] + demand[None, :] ** 2) / safe_c, 0.0)
        s = s0[None, :] + delta  # (N, R)
        total_l = load.sum(axis=0)[None, :] + np.where(usable[:, None], demand[None, :], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(total_c > 0, total_l / np.where(total_c > 0, total_c, 1.0), 0.0)
            var = np.where(total_c > 0, s / np.where(total_c > 0, total_c, 1.0) - mean**2, 0.0)
        var = np.maximum(var, 0.0)
        return np.sqrt(var @ self.weights)

    def fractions_on(self, n: int, members: np.ndarray) -> dict[str, float]:
        """Load fractions of node ``n`` if ``members`` went there."""
        return self._fractions_after(n, members, self._without(members)[1])

    def _fractions_after(
        self, n: int, members: np.ndarray, base_load: np.ndarray
    ) -> dict[str, float]:
        """:meth:`fractions_on`, ``base_load`` the balance loads without ``members``."""
        load = base_load[n].copy()
        for j in members.tolist():
            if self.running[j]:
                load += self.loads.demand[j]
        cap = self.loads.capacity[n]
        return {
            r: (float(load[i] / cap[i]) if cap[i] > 0 else 0.0) for i, r in enumerate(RESOURCES)
        }

    def commit(self, members: np.ndarray, n: int) -> None:
        """Move ``members`` to node ``n`` in this state."""
        assign, node_load, committed = self._without(members)
        cons = self.constraints
        for j in members.tolist():
            assign[j] = n
            if self.running[j]:
                node_load[n] += self.loads.demand[j]
            committed[n] += cons.guest_demand(j)
        self.assign, self.node_load, self.committed = assign, node_load, committed
        self.counted[members] = self.running[members]

    def place(self, j: int, purpose: Purpose = "balance") -> Placement:
        """Rank the nodes for guest ``j`` (with its bundle) in this state."""
        cluster = self.cluster
        guest = cluster.guests[j]
        members = self.bundle(j)
        member_ids = tuple(cluster.guests[m].id for m in members.tolist())
        current_idx = int(self.assign[j])
        current = cluster.nodes[current_idx].name if current_idx >= 0 else None
        for m in members.tolist():
            reason = movability(cluster.guests[m], cluster, purpose)
            if reason is not None:
                who = "" if m == j else f"partner {cluster.guests[m].id}: "
                return Placement(guest.id, member_ids, purpose, (), (), who + str(reason), current)
        scored, rejected = self.evaluate(members)
        base_load = self._without(members)[1]
        ranking = tuple(
            NodeScore(
                node=cluster.nodes[n].name,
                score=score,
                balance=balance,
                penalty=penalty,
                fractions=self._fractions_after(n, members, base_load),
                current=n == current_idx,
            )
            for n, score, balance, penalty in scored
        )
        return Placement(guest.id, member_ids, purpose, ranking, tuple(rejected), None, current)

    def violations(self) -> list[str]:
        return self.constraints.violations(self.assign)

    def capacity_ok(self) -> bool:
        return not self.constraints.capacity.over(
            committed_for(self.constraints, self.assign)
        ).any()


# --------------------------------------------------------------------------------------------
# Entry points


def place_guest(cluster: Cluster, guest_id: str, purpose: Purpose = "balance") -> Placement:
    """Where should existing guest ``guest_id`` be? Its current node is ranked too, unless
    ``purpose="recover"``: its node has failed, so it is offline and never ranked."""
    if guest_id not in cluster.guest_index:
        raise KeyError(f"no guest {guest_id!r} in the cluster")
    if purpose == "recover":
        cluster = _failed(cluster, cluster.guests[cluster.guest_index[guest_id]].node)
    state = PlacementState.build(cluster)
    return state.place(cluster.guest_index[guest_id], purpose)


def _failed(cluster: Cluster, node: str) -> Cluster:
    """The cluster with ``node`` failed: offline (and so out of every ranking)."""
    nodes = tuple(replace(n, online=False) if n.name == node else n for n in cluster.nodes)
    return replace(cluster, nodes=nodes)


NEW_GUEST_ID = "new"


def fresh_id(cluster: Cluster, wanted: str) -> str:
    """``wanted`` (or :data:`NEW_GUEST_ID`), primed until no guest of ``cluster`` has it."""
    gid = wanted or NEW_GUEST_ID
    while gid in cluster.guest_index:
        gid += "'"
    return gid


def place_new(cluster: Cluster, guest: Guest) -> Placement:
    """Where should a new guest start? ``guest.node`` is ignored; it is not counted anywhere yet.
    Its id is :func:`fresh_id`'s; rules of ``cluster`` that name that id apply to it."""
    grown = replace(cluster, guests=(*cluster.guests, newcomer(cluster, guest)))
    state = PlacementState.build(grown)
    return state.place(len(grown.guests) - 1, "new")


def newcomer(cluster: Cluster, guest: Guest) -> Guest:
    """``guest`` as :func:`place_new` adds it to ``cluster``: its :func:`fresh_id`, running on a
    node name no real node has (so it loads no real node yet), of its architecture or else the
    most common one among usable nodes (ties: alphabetical)."""
    arch = guest.arch
    if arch is None:
        usable = [n.arch for n in cluster.nodes if n.usable]
        arch = min(set(usable), key=lambda a: (-usable.count(a), a)) if usable else "x86_64"
    gid = fresh_id(cluster, guest.id)
    return replace(guest, id=gid, node="\0new", state="running", migrating_to=None, arch=arch)


@dataclass(frozen=True)
class Evacuation:
    """Moves that empty a node, and the guests that could not be placed (with the reason)."""

    node: str
    moves: tuple[Move, ...]
    stuck: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "moves": [
                {"guest": m.guest, "source": m.source, "target": m.target} for m in self.moves
            ],
            "stuck": [{"guest": g, "reason": r} for g, r in self.stuck],
        }


def evacuate(cluster: Cluster, node: str, purpose: Purpose = "evacuate") -> Evacuation:
    """Place every guest of ``node`` elsewhere, biggest first, each placement seen by the next.

    The node is treated as in maintenance (``purpose="evacuate"``) or failed
    (``purpose="recover"``: it is also offline, and only what blocks a restart elsewhere counts).
    """
    if node not in cluster.node_index:
        raise KeyError(f"no node {node!r} in the cluster")
    nodes = tuple(
        replace(n, maintenance=True, online=n.online and purpose != "recover")
        if n.name == node
        else n
        for n in cluster.nodes
    )
    drained = replace(cluster, nodes=nodes)
    state = PlacementState.build(drained)
    src = drained.node_index[node]
    on_node = [j for j, g in enumerate(drained.guests) if state.assign[j] == src]
    moves, stuck = place_biggest_first(state, on_node, purpose)
    return Evacuation(node, moves, stuck)


def place_biggest_first(
    state: PlacementState, guests: Sequence[int], purpose: Purpose
) -> tuple[tuple[Move, ...], tuple[tuple[str, str], ...]]:
    """Place ``guests`` (indices) one after another on the best node each, biggest first
    (configured memory, then vCPUs, then id: big guests are hardest to fit), each placement
    committed to ``state`` and so seen by the next; a guest takes its bundle along.

    Returns the moves made and the guests that found no node, each with why.
    """
    cluster = state.cluster
    biggest = [(-g.memory, -g.cpu, g.id) for g in cluster.guests]
    order = sorted(guests, key=biggest.__getitem__)
    moves: list[Move] = []
    stuck: list[tuple[str, str]] = []
    done: set[int] = set()
    for j in order:
        if j in done:
            continue
        members = state.bundle(j)
        done.update(members.tolist())
        blocked = next(
            (
                f"{'' if m == j else f'partner {cluster.guests[m].label}: '}{held}"
                for m in members.tolist()
                if (held := movability(cluster.guests[m], cluster, purpose)) is not None
            ),
            None,
        )
        if blocked is not None:
            stuck.extend((cluster.guests[m].id, blocked) for m in members.tolist())
            continue
        # The best node alone: what :meth:`PlacementState.place` ranks, without each node's
        # load fractions (the ranking is not shown).
        scored, rejected = state.evaluate(members)
        if purpose == "recover":  # a failed node is offline: that it cannot take a guest is moot
            rejected = [r for r in rejected if r.code is not RejectionCode.OFFLINE]
        if not scored:
            why = reasons_text(rejected)
            stuck.extend(
                (cluster.guests[m].id, f"no node can take it ({why or 'no node'})")
                for m in members.tolist()
            )
            continue
        target = scored[0][0]
        for m in members.tolist():
            if 0 <= int(state.assign[m]) != target:
                moves.append(
                    Move(
                        cluster.guests[m].id,
                        cluster.nodes[int(state.assign[m])].name,
                        cluster.nodes[target].name,
                    )
                )
        state.commit(members, target)
    return tuple(moves), tuple(stuck)


__all__: Sequence[str] = (
    "Evacuation",
    "NodeScore",
    "Placement",
    "PlacementState",
    "evacuate",
    "fresh_id",
    "newcomer",
    "place_biggest_first",
    "place_guest",
    "place_new",
)
