"""``drs-pressure``: the DRS-like pressure balancer proposed for Proxmox, fixed and safe.

A. Derumier's never-merged ``[PATCH pve-ha-manager 4/8] add vm loadbalancing`` (2022,
``Balancer/Services.pm``) looks at *bad* VMs rather than at the spread
of the nodes, ranks them with TOPSIS and moves the worst one for which a node exists to the node
Proxmox would pick to recover it. One move per iteration; the cluster is re-evaluated after each.

**Bad guests** (``get_bad_vms``). A candidate is a VM — containers are skipped, they cannot
live-migrate — that may move for balancing (:func:`~opendrs.engine.constraints.movability`:
running, not locked, no local devices or disks, …), has been up for ``min_uptime`` seconds
(default 300), is not ``last_moved`` (the guest the previous run moved) and has not been moved by
this proposal already (its measured pressure describes it before the move, not after: the RFC's
"not the guest moved last" rule, extended to the whole proposal). Guests kept together by a hard
positive affinity are one candidate (their criteria summed; the highest cpu pressure). It is bad if:

* its **cpu pressure** is above ``cpu_pressure`` (default 0.75). The RFC compares the guest's
  ``cpu_pressure`` with 0.75 without saying its unit; we read it as a fraction of time stalled
  (``some`` PSI / 100), so the default means "stalled more than 75 % of the time". opendrs keeps
  PSI in percent, hence ``guest.pressure.cpu / 100 > cpu_pressure``. Whoever reads the RFC's 0.75
  as a PSI percentage sets ``cpu_pressure=0.0075``;
* it sits on a node above its **memory threshold**: 85 % of the node's memory, or 80 % when the
  node's KSM-shared memory exceeds 20 % of it (``check_pseudo_mem_pressure``). A node's KSM-shared
  memory is :attr:`~opendrs.model.cluster.Node.ksm_shared` (Proxmox's ``ksm.shared``, the
  snapshot's ``ksm``); the ``ksm`` option maps node names to KSM-shared bytes (a number, or a size
  such as ``"25GiB"``) and overrides it for the nodes it names. Node memory
  is the node's memory load in the cluster's usage mode (measured in dynamic mode, configured in
  static mode) against its memory net of reserves, as everywhere in opendrs. Every VM on such a
  node is bad; its **mem_pseudo_pressure** is ``(node_mem − threshold) / vm_mem`` when removing it
  alone brings the node below the threshold, 0 otherwise (the RFC's formula);
* its **affinity** — which the RFC leaves as a stub that always returns 0, so that its 0.67 weight
  never decides anything — is positive. opendrs defines it as the number of placement rules the
  guest's current node breaks: strict or non-strict node affinity not met, a soft or hard negative
  partner on the same node, a soft or hard positive partner elsewhere.

**Ranking.** TOPSIS (:func:`~opendrs.engine.mcdm.topsis_scores`) over the bad guests with the
criteria ``affinity`` (+), ``cpu_pressure`` (+), ``mem_pseudo_pressure`` (+), ``mem`` (−, small
guests first) and ``totalcpu`` (−), weighted by the principal eigenvector of the RFC's AHP matrix
(:data:`AHP_PAIRWISE`, λmax ≈ 5.414, CR ≈ 0.092). The RFC's preference table spells the last
criterion ``total_cpu`` while its data says ``totalcpu``, so that weight never matched: here every
criterion has one name. ``mem`` and ``totalcpu`` are the guest's memory and cpu in the node
accounting (the measured use in dynamic mode, as the RFC's stats). Ties keep the guests' id order.

**Target** (``find_node_target``, "same as for service recovery"). Among the allowed nodes (every
hard constraint of opendrs, capacity included) other than the guest's own, opendrs keeps those that
relieve the guest rather than move its trouble — the RFC has no such check, and would happily
migrate a guest onto another overloaded node:

* the target's memory after the move stays at or below its own memory threshold;
* for a guest bad by cpu pressure, the target's cpu fraction after the move is below the source's
  cpu fraction before it;
* the target breaks no more placement rules than the current node (strictly fewer when breaking
  rules is the guest's only trouble), and among those, the nodes that break the fewest — Proxmox
  only considers its node-affinity's highest-priority class.

The survivors are scored as Proxmox scores nodes to (re)start a service
(``score_nodes_to_start_service``): one TOPSIS alternative per node, the cluster as if the guest
ran there (taken off its source, it is moving), ``[1+RMS cpu, 1+max cpu, 1+RMS mem, 1+max mem]``
with weights −1, −2, −5, −10 (scaled by the cluster's resource weights as in ``pve-topsis``: a
proxlb-solver scenario with ``method: memory`` scores memory alone); the best closeness wins, ties
by node name. Bad guests are tried best
ranked first; the first that has a target moves. Basic mode counts guests, not memory or CPU: the
strategy does not run in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from opendrs.engine.constraints import Constraints
from opendrs.engine.mcdm import ahp_weights, topsis_scores
from opendrs.engine.pve_selection import (
    fraction_shift,
    fractions_of,
    pve_weights,
    topsis_alternatives,
    topsis_weights,
)
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster
from opendrs.model.units import UnitError, parse_bytes

from .base import (
    Proposal,
    ProposedMove,
    Request,
    Start,
    Stop,
    Strategy,
    StrategyOptions,
    bundle_moves,
    start,
)
from .pve import Bundle, movable_bundles

NAME = "drs-pressure"

DEFAULT_MAX_MOVES = 10
DEFAULT_MIN_UPTIME = 300
DEFAULT_CPU_PRESSURE = 0.75
DEFAULT_MEMORY_THRESHOLD = 0.85
DEFAULT_MEMORY_THRESHOLD_KSM = 0.80
#: KSM-shared memory above this fraction of a node's memory lowers its memory threshold.
KSM_SHARE = 0.2

#: The bad-guest criteria, in the order of :data:`AHP_PAIRWISE` and of the TOPSIS matrix.
CRITERIA: tuple[str, ...] = ("affinity", "cpu_pressure", "mem_pseudo_pressure", "mem", "totalcpu")
#: Whether each criterion is maximised (``+``) or minimised (``−``) (``$bestorder`` of the RFC).
MAXIMISE: tuple[bool, ...] = (True, True, True, False, False)

#: The RFC's pairwise preferences (``compute_ahp_weights``), row vs column, reciprocals below.
AHP_PAIRWISE: tuple[tuple[float, ...], ...] = (
    (1.0, 9.0, 9.0, 9.0, 9.0),
    (1 / 9, 1.0, 3.0, 3.0, 5.0),
    (1 / 9, 1 / 3, 1.0, 3.0, 3.0),
    (1 / 9, 1 / 3, 1 / 3, 1.0, 2.0),
    (1 / 9, 1 / 5, 1 / 3, 1 / 2, 1.0),
)

#: AHP principal-eigenvector weights of :data:`AHP_PAIRWISE`.
AHP = ahp_weights(AHP_PAIRWISE, "eigenvector")
#: Signed TOPSIS weights: positive to maximise, negative to minimise.
BAD_GUEST_WEIGHTS: tuple[float, ...] = tuple(
    float(w) if up else -float(w) for w, up in zip(AHP.weights, MAXIMISE, strict=True)
)


@dataclass(frozen=True)
class BadGuest:
    """A bad candidate (a guest, or a bundle that moves together) and its TOPSIS criteria."""

    bundle: Bundle
    affinity: float
    cpu_pressure: float
    mem_pseudo_pressure: float
    mem: float
    totalcpu: float
    #: Why it is bad (cpu pressure, node memory, affinity), as phrases.
    why: tuple[str, ...]
    cpu_bad: bool
    affinity_only: bool

    @property
    def criteria(self) -> tuple[float, float, float, float, float]:
        return (self.affinity, self.cpu_pressure, self.mem_pseudo_pressure, self.mem, self.totalcpu)


def broken_rules(
    cons: Constraints, j: int, assign: np.ndarray, inside: np.ndarray | None = None
) -> np.ndarray:
    """(N,) how many placement rules guest ``j`` breaks on each node, hard and soft alike.

    Counted: a strict node affinity that excludes the node, a non-strict one that does not prefer
    it, each soft or hard negative partner on the node and each soft or hard positive partner
    elsewhere. ``assign`` places the partners; partners marked in ``inside`` (G,) move with the
    guest and count as on every node.
    """
    n_nodes = len(cons.cluster.nodes)
    inside = np.zeros(len(assign), dtype=bool) if inside is None else inside

    def on(partners: np.ndarray) -> np.ndarray:
        if not partners.size:
            return np.zeros(n_nodes)
        inner = inside[partners]
        where = assign[partners[~inner]]
        where = where[where >= 0]
        return np.bincount(where, minlength=n_nodes).astype(np.float64) + float(inner.sum())

    count = (~cons.strict_ok[j]).astype(np.float64) + (~cons.preferred[j]).astype(np.float64)
    count = count + on(cons.soft_neg[j]) + (cons.soft_pos[j].size - on(cons.soft_pos[j]))
    count = count + on(cons.hard_neg[j]) + (cons.hard_pos[j].size - on(cons.hard_pos[j]))
    return count


def ksm_overrides(ksm: object) -> dict[str, int]:
    """The ``ksm`` option checked: node name -> KSM-shared bytes (a number or a size).

    Raises :class:`ValueError` (one line, ``ksm: …``) for anything else. Node names are not
    checked against a cluster: an override for a node the cluster lacks is not used.
    """
    if ksm is None:
        return {}
    if not isinstance(ksm, Mapping):
        raise ValueError(
            "ksm: expected a mapping of node name to KSM-shared bytes or a size "
            f'(e.g. {{"pve1": "25GiB"}}), got {type(ksm).__name__}'
        )
    out: dict[str, int] = {}
    for name, value in ksm.items():
        if not isinstance(name, str):
            raise ValueError(f"ksm: node names are text, got {name!r}")
        try:
            out[name] = parse_bytes(value)
        except UnitError as exc:
            raise ValueError(f"ksm: {name}: {exc}") from None
    return out


def memory_thresholds(
    cluster: Cluster,
    capacity: np.ndarray,
    ksm: Mapping[str, float | str] | None,
    memory_threshold: float,
    memory_threshold_ksm: float,
) -> np.ndarray:
    """(N,) memory each node may use before its guests turn bad (``check_pseudo_mem_pressure``).

    A node's KSM-shared memory is its measured :attr:`~opendrs.model.cluster.Node.ksm_shared`,
    unless ``ksm`` names the node (see :func:`ksm_overrides`).
    """
    overrides = ksm_overrides(ksm)
    shared = np.array([float(overrides.get(n.name, n.ksm_shared)) for n in cluster.nodes])
    fraction = np.where(shared > KSM_SHARE * capacity, memory_threshold_ksm, memory_threshold)
    return fraction * capacity


@dataclass(frozen=True)
class Choice:
    """The bad guest a drs-pressure iteration moves: its ``rank`` and TOPSIS ``closeness``
    among the bad guests, its ``target`` node, that node's closeness and how many nodes were
    scored."""

    rank: int
    candidate: BadGuest
    closeness: float
    target: int
    node_closeness: float
    scored: int


class _Pressure:
    """One drs-pressure run: the evolving placement and what makes guests bad in it."""

    def __init__(self, begun: Start, options: PressureOptions, thresholds: np.ndarray) -> None:
        self.cluster = begun.cluster
        self.state = begun.state
        self.cons = begun.state.constraints
        self.cap = begun.state.loads.capacity
        self.usable = begun.usable
        self.min_uptime = options.min_uptime
        self.cpu_pressure = options.cpu_pressure
        self.thresholds = thresholds
        self.last_moved = options.last_moved
        self.moved: set[int] = set()
        #: (G,) guests some placement rule names (the others never break one).
        cons = self.cons
        self.ruled = (
            ~cons.strict_ok.row_all()
            | ~cons.preferred.row_all()
            | (cons.soft_neg.counts() > 0)
            | (cons.soft_pos.counts() > 0)
            | (cons.hard_neg.counts() > 0)
            | (cons.hard_pos.counts() > 0)
        )
        #: How many candidates the last :meth:`bad_guests` call looked at.
        self.candidates = 0

    def eligible(self) -> list[Bundle]:
        """The RFC's candidates: movable VMs, up long enough, not moved last or already."""
        guests = self.cluster.guests
        out = []
        for bundle in movable_bundles(self.state, self.cluster):
            members = bundle.members.tolist()
            if any(
                guests[m].kind != "vm"
                or guests[m].uptime < self.min_uptime
                or guests[m].id == self.last_moved
                or m in self.moved
                for m in members
            ):
                continue
            out.append(bundle)
        return out

    def demand(self, members: np.ndarray) -> np.ndarray:
        """Balance load (R,) of a bundle's running members: cpu, memory."""
        return self.state.loads.demand[members[self.state.running[members]]].sum(axis=0)

    def affinity(self, members: np.ndarray) -> np.ndarray:
        """(N,) rules the bundle breaks on each node (its members summed)."""
        total = np.zeros(len(self.cluster.nodes))
        ruled = [j for j in members.tolist() if self.ruled[j]]
        if not ruled:
            return total
        inside = np.zeros(len(self.state.assign), dtype=bool)
        inside[members] = True
        for j in ruled:
            total = total + broken_rules(self.cons, j, self.state.assign, inside)
        return total

    def bad_guests(self) -> list[BadGuest]:
        """The bad candidates in the current state, leaders sorted."""
        guests = self.cluster.guests
        node_mem = self.state.node_load[:, 1]
        out: list[BadGuest] = []
        eligible = self.eligible()
        self.candidates = len(eligible)
        for bundle in eligible:
            src = bundle.src
            members = bundle.members
            cpu, mem = (float(v) for v in self.demand(members))
            pressure = max(guests[m].pressure.cpu for m in members.tolist()) / 100.0
            affinity = float(self.affinity(members)[src])
            why: list[str] = []
            cpu_bad = pressure > self.cpu_pressure
            if cpu_bad:
                why.append(f"cpu pressure {pressure:.0%} > {self.cpu_pressure:.0%}")
            pseudo = 0.0
            limit = float(self.thresholds[src])
            mem_bad = node_mem[src] > limit and self.cap[src, 1] > 0
            if mem_bad:
                if node_mem[src] - mem < limit:
                    pseudo = (float(node_mem[src]) - limit) / mem
                why.append(
                    f"{self.cluster.nodes[src].name} memory {node_mem[src] / self.cap[src, 1]:.0%}"
                    f" > {limit / self.cap[src, 1]:.0%}"
                )
            if affinity > 0:
                why.append(f"breaks {affinity:g} placement rule{'s' if affinity != 1 else ''}")
            if not why:
                continue
            out.append(
                BadGuest(
                    bundle=bundle,
                    affinity=affinity,
                    cpu_pressure=pressure,
                    mem_pseudo_pressure=pseudo,
                    mem=mem,
                    totalcpu=cpu,
                    why=tuple(why),
                    cpu_bad=cpu_bad,
                    affinity_only=not cpu_bad and not mem_bad,
                )
            )
        return out

    def ranked(self, bad: list[BadGuest]) -> list[tuple[BadGuest, float]]:
        """Bad guests best first by TOPSIS with the AHP weights; ties keep their order."""
        if not bad:
            return []
        scores = topsis_scores([b.criteria for b in bad], BAD_GUEST_WEIGHTS)
        order = sorted(range(len(bad)), key=lambda i: -float(scores[i]))
        return [(bad[i], float(scores[i])) for i in order]

    def target(self, bad: BadGuest) -> tuple[int, float, int] | None:
        """The best node for a bad guest: (node, closeness, nodes scored), or None."""
        state, cap = self.state, self.cap
        members, src = bad.bundle.members, bad.bundle.src
        ok = state.allowed(members)
        ok[src] = False
        demand = self.demand(members)
        ok &= state.node_load[:, 1] + demand[1] <= self.thresholds + 1e-9 * np.maximum(cap[:, 1], 1)
        if bad.cpu_bad:
            fractions = fractions_of(state.node_load, cap)
            cpu_after = fraction_shift(demand, cap)[:, 0] + fractions[:, 0]
            ok &= cpu_after < fractions[src, 0]
        rules = self.affinity(members)
        ok &= rules < rules[src] if bad.affinity_only else rules <= rules[src]
        if not ok.any():
            return None
        ok &= rules == rules[ok].min()
        names = [self.cluster.nodes[n].name for n in np.nonzero(ok)[0].tolist()]
        targets = np.nonzero(ok)[0][np.argsort(np.array(names, dtype=object), kind="stable")]
        shift = fraction_shift(demand, cap)
        matrix = topsis_alternatives(
            fractions_of(state.node_load, cap),
            self.usable,
            np.full(len(targets), src, dtype=np.intp),
            targets,
            np.repeat(shift[src][None, :], len(targets), axis=0),
            shift[targets],
        )
        scores = topsis_scores(matrix, topsis_weights(pve_weights(self.cluster)))
        best = int(np.argmax(scores))  # the first (by name) of equal scores
        return int(targets[best]), float(scores[best]), len(targets)

    def relieve(self, max_moves: int) -> tuple[list[ProposedMove], tuple[str, Stop]]:
        """Move the best ranked bad guest that has a target, one at a time, until none is bad,
        none has a target or ``max_moves`` are made: the moves and why the run stopped (a
        sentence and a :class:`~.base.Stop`)."""
        moves: list[ProposedMove] = []
        bad = self.bad_guests()
        while True:
            if not bad and not self.candidates:
                return moves, (
                    "no candidate: no running VM may move (containers, guests up for less than "
                    f"{self.min_uptime} s, the last moved guest and guests already moved are "
                    "skipped)",
                    Stop("no_movable_guest"),
                )
            if not bad:
                return moves, (
                    f"no bad guest: none has cpu pressure above {self.cpu_pressure:.0%}, sits on "
                    "a node above its memory threshold or breaks a placement rule",
                    Stop("no_bad_guest", {"cpu_pressure": self.cpu_pressure}),
                )
            if len(moves) >= max_moves:
                stop = Stop("move_limit", {"max_moves": max_moves})
                return moves, (f"move limit {max_moves} reached", stop)
            ranked = self.ranked(bad)
            chosen = self.choose(ranked)
            if chosen is None:
                return moves, (
                    f"no bad guest has a node that relieves it ({_count(bad)} bad: "
                    + ", ".join(b.bundle.leader for b, _ in ranked)
                    + ")",
                    Stop(
                        "nothing_relieves",
                        {
                            "bad": _count(bad),
                            "guests": " ".join(b.bundle.leader for b, _ in ranked),
                        },
                    ),
                )
            count_before = _count(bad)
            bundle = chosen.candidate.bundle
            self.state.commit(bundle.members, chosen.target)
            self.moved.update(bundle.members.tolist())
            bad = self.bad_guests()
            moves += self.moves_of(chosen, len(ranked), count_before, _count(bad))

    def choose(self, ranked: list[tuple[BadGuest, float]]) -> Choice | None:
        """The first of the ranked bad guests that has a target, or None."""
        for rank, (candidate, closeness) in enumerate(ranked, start=1):
            found = self.target(candidate)
            if found is not None:
                return Choice(rank, candidate, closeness, *found)
        return None

    def moves_of(self, chosen: Choice, ranked: int, before: int, after: int) -> list[ProposedMove]:
        """The moves of the chosen bundle, the bad guests counted ``before`` and ``after``."""
        bundle = chosen.candidate.bundle
        nodes = self.cluster.nodes
        target = nodes[chosen.target].name
        reason = (
            "; ".join(chosen.candidate.why)
            + f"; rank {chosen.rank} of {ranked} bad (closeness {chosen.closeness:.3f})"
            + f"; {target} best of {chosen.scored} (closeness {chosen.node_closeness:.3f})"
        )
        return bundle_moves(
            self.cluster,
            bundle.members.tolist(),
            bundle.leader,
            nodes[bundle.src].name,
            target,
            metric="bad-guests",
            before=float(before),
            after=float(after),
            reason=reason,
        )


def _count(bad: list[BadGuest]) -> int:
    return sum(len(b.bundle.members) for b in bad)


def propose_pressure(view: CycleView, request: Request, options: PressureOptions) -> Proposal:
    """Relieve bad VMs one move at a time, worst first (see the module docstring).

    Reads the view's constraints, with the request's forbidden placements refused, and its
    loads in the usage mode (:attr:`~opendrs.engine.view.CycleView.usage_loads`: drs-pressure
    reads its own signals, memory use and CPU pressure, whatever the balance source).
    ``max_moves`` is the option when set, else the request's, else the option's default: moves
    at most (one bundle per iteration). The other options (:class:`PressureOptions`):
    ``min_uptime``, seconds a guest must have run (the RFC's 300 s), on top of the cluster's own
    ``min_uptime`` setting; ``cpu_pressure``, a guest is bad above this cpu pressure, as a
    fraction (PSI % / 100); ``memory_threshold``, the fraction of a node's memory above which
    its guests are bad, ``memory_threshold_ksm`` the same for a node whose KSM-shared memory
    exceeds 20 % of it; ``ksm``, KSM-shared bytes (or sizes such as ``"25GiB"``) per node name,
    overriding the nodes' measured ``ksm_shared`` for the nodes it names; ``last_moved``, the
    guest the previous run moved, not moved again now.
    """
    ksm_overrides(options.ksm)  # a bad option is refused before anything else
    max_moves: int = options.pick("max_moves", request.max_moves)
    record: dict[str, object] = {
        **options.values(),
        "max_moves": max_moves,
        "ksm": dict(sorted((options.ksm or {}).items())),
    }
    begun = start(view, request.forbidden, view.usage_loads)
    cluster = begun.cluster
    notes = begun.notes
    source = cluster.settings.balance_source
    if source != "usage":
        notes += (
            f"drs-pressure reads memory use and CPU pressure itself: balance_source {source} "
            "does not change what it does",
        )
    if cluster.settings.mode == "basic":
        stopped = "basic mode counts guests, not memory or CPU: drs-pressure does not run in it"
        stop = Stop("basic_mode")
        return Proposal(NAME, (), begun.before, begun.before, stopped, notes, record, stop)
    thresholds = memory_thresholds(
        cluster,
        begun.state.loads.capacity[:, 1],
        options.ksm,
        options.memory_threshold,
        options.memory_threshold_ksm,
    )
    moves, (stopped, stop) = _Pressure(begun, options, thresholds).relieve(max_moves)
    after = begun.imbalance()
    return Proposal(NAME, tuple(moves), begun.before, after, stopped, notes, record, stop)


@dataclass(frozen=True)
class PressureOptions(StrategyOptions):
    """``drs-pressure``'s options (see :func:`propose_pressure`)."""

    fractions: ClassVar[frozenset[str]] = frozenset(
        {"cpu_pressure", "memory_threshold", "memory_threshold_ksm"}
    )

    max_moves: int = DEFAULT_MAX_MOVES
    min_uptime: int = DEFAULT_MIN_UPTIME
    cpu_pressure: float = DEFAULT_CPU_PRESSURE
    memory_threshold: float = DEFAULT_MEMORY_THRESHOLD
    memory_threshold_ksm: float = DEFAULT_MEMORY_THRESHOLD_KSM
    ksm: Mapping[str, float | str] | None = None
    last_moved: str | None = None

    def check(self) -> None:
        ksm_overrides(self.ksm)
        if self.last_moved is not None and not isinstance(self.last_moved, str):
            raise ValueError(f"last_moved: expected a guest id, got {self.last_moved!r}")


class Pressure:
    """The strategy as the registry lists it (see :class:`.base.Strategy`)."""

    name = NAME
    summary = "DRS-like: move the worst bad VM (cpu pressure, node memory, rules), TOPSIS+AHP"
    Options = PressureOptions

    def propose(self, view: CycleView, request: Request, options: PressureOptions) -> Proposal:
        return propose_pressure(view, request, options)


STRATEGIES: tuple[Strategy, ...] = (Pressure(),)
