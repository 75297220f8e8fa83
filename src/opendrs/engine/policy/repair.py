"""Repairs: what breaks a hard constraint now, the one :func:`repair` of ``opendrs plan``,
``opendrs place --evacuate`` and the daemon (greedy, then the exact model and parking), and
what a repair leaves stuck, with why."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from opendrs.engine.constraints import (
    Constraints,
    Rejection,
    RejectionCode,
    Shortfall,
    committed_for,
    current_assign,
    movability,
)
from opendrs.engine.distinct import distinct
from opendrs.engine.planner import Plan, PlannedMove, not_repeatable, unrepeatable
from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.policy.needs import Broken, BrokenKind, need_sentence
from opendrs.engine.policy.planning import Limits, plan_within, truncate
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.base import (
    Proposal,
    Stop,
)
from opendrs.engine.strategies.exact_repair import (
    REPAIR_SHARED_CAP,
    REPAIR_WALL_CAP,
    repair_deadline,
)
from opendrs.engine.usage import (
    CapacityModel,
    LoadModel,
    loaded_nodes,
    measured_capacity_factor,
    net_capacity,
    tolerance,
    usage_loads,
)
from opendrs.model.cluster import Cluster, Node

#: ``target_spread`` that asks ``balance`` for its repairs only.
_REPAIR_ONLY = 1e6
#: Rounds of :func:`_returns_last` at most: each keeps off the returns the last plan chose.
RETURN_ROUNDS = 3

log = logging.getLogger(__name__)


def _rules_may_break(cluster: Cluster) -> bool:
    """Whether a hard or strict rule may be broken now (conservatively)."""
    rules = cluster.rules
    guest_index = cluster.guest_index
    usable = frozenset(n.name for n in cluster.nodes if n.usable)
    for rule in rules.node_affinity:
        if not rule.strict:
            continue
        allowed = rule.top_nodes(usable)
        for gid in rule.guests:
            j = guest_index.get(gid)
            if j is not None and cluster.guests[j].node not in allowed:
                return True
    for affinity in rules.guest_affinity:
        if not affinity.hard:
            continue
        members = [cluster.guests[guest_index[g]] for g in affinity.guests if g in guest_index]
        places = [{g.node, g.migrating_to} - {None} for g in members]
        if affinity.positive:
            if len({g.node for g in members}) > 1:
                return True
        else:
            seen: set[str | None] = set()
            for where in places:
                if where & seen:
                    return True
                seen |= where
    return False


def may_need_repair(
    cluster: Cluster, loads: LoadModel | None = None, hot: float | None = None
) -> bool:
    """A cheap, conservative screen for :func:`repairs_needed`: False only when none can be.

    Building the full constraints takes milliseconds per hundred guests, and the controller asks
    at every observation; this screen looks only at what can break a hard constraint: guests on
    a node in maintenance, hard or strict rules, guests that need an architecture, local disks,
    and nodes whose configured (all guests counted, migrating ones on both nodes) or measured
    load is over a limit — for measured load, the ``hot`` level of capacity when given.
    """
    if _rules_may_break(cluster):
        return True
    nodes, guests = cluster.nodes, cluster.guests
    n_nodes = len(nodes)
    index = cluster.node_index
    where = np.empty(len(guests), dtype=np.intp)
    extra: list[tuple[int, int]] = []
    for j, g in enumerate(guests):
        if g.arch is not None or (g.disks and g.local_disk_bytes):
            return True
        n = index.get(g.node, -1)
        where[j] = n
        if g.migrating_to is not None:
            t = index.get(g.migrating_to, -1)
            if t >= 0:
                extra.append((j, t))
    placed = where >= 0
    maintenance = np.array([n.maintenance and n.online for n in nodes], dtype=bool)
    if np.any(maintenance[where[placed]]):
        return True
    settings = cluster.settings
    cpu = np.array([g.cpu for g in guests], dtype=np.float64)
    memory = np.array([g.memory for g in guests], dtype=np.float64)
    idx = np.concatenate([where[placed], np.array([t for _, t in extra], dtype=np.intp)])
    rows = np.concatenate([np.nonzero(placed)[0], np.array([j for j, _ in extra], dtype=np.intp)])
    vcpus = np.bincount(idx, weights=cpu[rows], minlength=n_nodes)
    configured = np.bincount(idx, weights=memory[rows], minlength=n_nodes)
    net = net_capacity(cluster)
    cpu_limit = net[:, 0] * settings.cpu_overcommit
    ram_limit = net[:, 1] * settings.memory_overcommit
    if np.any(vcpus > cpu_limit + tolerance(cpu_limit)):
        return True
    if np.any(configured > ram_limit + tolerance(ram_limit)):
        return True
    if settings.mode == "dynamic":
        model = usage_loads(cluster, loads)
        capacity = model.capacity * np.array(measured_capacity_factor(settings, hot))
        if np.any(model.loads() > capacity + tolerance(capacity)):
            return True
    return False


def repairs_needed(cluster: Cluster, constraints: Constraints | None = None) -> tuple[Broken, ...]:
    """What breaks a hard constraint now and can be repaired by migrating, as typed facts.

    A guest that may move (:func:`~opendrs.engine.constraints.movability` for balancing) and sits
    on a node in maintenance, on a node its architecture or strict node affinity excludes, with a
    hard anti-affinity partner, apart from its hard-affinity partners, or on a node over a
    capacity limit (named once for the node). Empty when nothing needs repair.
    """
    cons = constraints if constraints is not None else Constraints.build(cluster)
    why = _broken(cluster, cons, current_assign(cluster), cons.capacity.committed())
    return tuple(dict.fromkeys(why[j] for j in sorted(why)))


def _broken(
    cluster: Cluster, cons: Constraints, assign: np.ndarray, committed: np.ndarray
) -> dict[int, Broken]:
    """Guest index → what it breaks with the guests placed as ``assign`` (``committed``: the
    capacity that placement commits), for the guests that may move; the first thing found."""
    guests, nodes = cluster.guests, cluster.nodes
    placed = np.nonzero(assign >= 0)[0]
    where = assign[placed]
    why: dict[int, Broken] = {}

    def found(j: int, kind: BrokenKind) -> None:
        why.setdefault(j, Broken(kind, guests[j].label, nodes[assign[j]].name))

    maintenance = np.array([n.maintenance and n.online for n in nodes], dtype=bool)
    for j in placed[maintenance[where]].tolist():
        found(j, BrokenKind.MAINTENANCE)
    outside = ~cons.arch_ok[placed, where] | ~cons.strict_ok[placed, where]
    for j in placed[outside].tolist():
        found(j, BrokenKind.RULES)
    for j in range(len(guests)):
        partners = cons.hard_neg[j]
        if assign[j] >= 0 and partners.size and np.any(assign[partners] == assign[j]):
            found(j, BrokenKind.ANTI_AFFINITY)
    for group in cons.groups:
        if distinct(assign[group]).size > 1:
            for j in group.tolist():
                found(j, BrokenKind.AFFINITY)
    for n, broken in _over(cons.capacity, committed, nodes):
        for j in placed[where == n].tolist():
            why.setdefault(j, broken)
    return {j: b for j, b in why.items() if movability(guests[j], cluster, "balance") is None}


def _over(
    capacity: CapacityModel, committed: np.ndarray, nodes: tuple[Node, ...]
) -> list[tuple[int, Broken]]:
    """Each node over a capacity limit, and what that breaks: ``hot`` when only measured usage
    is over and its limit is the hot level (the capacity itself is not reached), else
    ``capacity``."""
    over = capacity.over(committed)
    out: list[tuple[int, Broken]] = []
    for n in np.nonzero(over.any(axis=1))[0].tolist():
        cols = np.nonzero(over[n])[0]
        dims = tuple(str(capacity.dimensions[d]) for d in cols.tolist())
        if capacity.measured_limit < 1.0 and capacity.measured_cols[cols].all():
            full = capacity.limit[n, cols] / capacity.measured_limit
            if not np.any(committed[n, cols] > full + tolerance(full)):
                level, forecast = float(capacity.measured_limit), n in capacity.forecast
                hot = Broken(BrokenKind.HOT, None, nodes[n].name, dims, level, forecast)
                out.append((n, hot))
                continue
        out.append((n, Broken(BrokenKind.CAPACITY, None, nodes[n].name, dims)))
    return out


#: At most this many stuck guests are named one by one in the log.
STUCK_SHOWN = 10


@dataclass(frozen=True)
class Repair:
    """A repair: what breaks a hard constraint, the plan that repairs it, and what it leaves.

    ``stuck`` holds, per guest the plan leaves breaking a hard constraint, its id and one
    sentence naming it: what it breaks, and what stops it on every other node.
    """

    needed: tuple[Broken, ...]
    proposal: Proposal | None = None
    plan: Plan | None = None
    stuck: tuple[tuple[str, str], ...] = ()


def repair(
    cluster: Cluster,
    *,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
    constraints: Constraints | None = None,
    batch: int = 0,
    max_parallel: int | None = None,
    max_node_inflow: int | None = None,
) -> Repair:
    """Repair what breaks a hard constraint in ``cluster``, never onto a ``forbidden`` placement.

    ``balance``'s repair: each guest that must move goes to its best allowed node; when one can
    go nowhere, the exact model moves other guests to make room (bounded in time, repeatable),
    and the planner orders it all, parking a guest on a spare node where a cycle needs it. At most
    ``batch`` migrations (0: no limit): the greedy repair asks for no more, an exact repair is
    planned whole and its first steps kept. ``stuck`` names what even the whole plan leaves, and
    always the guests left on a node in maintenance that may not move
    (:func:`left_in_maintenance`).
    """
    cons = constraints if constraints is not None else Constraints.build(cluster)
    needed = repairs_needed(cluster, cons)
    if not needed:
        return Repair((), stuck=left_in_maintenance(cluster))

    def proposer(most: int | None) -> Callable[[frozenset[tuple[str, str]]], Proposal]:
        """``balance``'s repairs only, at most ``most`` migrations (None: all it needs)."""

        def propose(forb: frozenset[tuple[str, str]]) -> Proposal:
            found = propose_balance(
                cluster,
                BalanceOptions(target_spread=_REPAIR_ONLY, max_moves=most),
                forbidden=forb,
                constraints=cons,
            )
            found = replace(found, stopped="repairs only", stop=Stop("repairs_only"))
            return found if "repair" in found.options else truncate(cluster, found, batch, cons)

        return propose

    limits = Limits(max_parallel, max_node_inflow)
    with repair_deadline():  # its exact repairs share one deadline (or its caller's)
        proposal, plan = plan_within(cluster, proposer(batch or None), forbidden, limits, cons)
        if "needs" in proposal.options.get("repair", {}):  # an exact repair past the batch
            proposal, plan = plan_within(cluster, proposer(None), forbidden, limits, cons)
    exact = "repair" in proposal.options
    stuck = left_in_maintenance(cluster)
    if exact or not batch or len(proposal.net_moves()) < batch:
        stuck = stuck_after(cluster, cons, proposal, plan, forbidden)
    if exact:
        plan = first_moves(plan, batch, cluster, cons)
    return Repair(needed, proposal, plan, stuck)


def stuck_now(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    """What a repair of ``cluster`` now (no policy guards, the cluster's own usage) leaves
    breaking a hard constraint — its :attr:`Repair.stuck` — or nothing when the cheap screen
    (:func:`may_need_repair`) says no repair can be needed: what ``opendrs show`` and ``opendrs
    status`` report."""
    return repair(cluster).stuck if may_need_repair(cluster) else ()


def repair_within_guards(
    cluster: Cluster,
    cons: Constraints,
    config: PolicyConfig,
    guarded: frozenset[tuple[str, str]],
    failed: frozenset[tuple[str, str]],
    returns: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """The repair within the policy's guards (``guarded``: cooldown, minimum uptime, no-return
    and failed targets); when that leaves guests stuck, the repair kept off only the ``failed``
    targets, if it leaves fewer — a guest must leave a node in maintenance or a broken rule
    whatever its cooldown —, and a return the last resort (:func:`_returns_last`: ``returns``,
    the no-return's placements). Not for a node that only runs hot: relieving it is worth no
    flapping, so the guards hold there (the policy may lift the cooldown and the memory of
    nodes seen running hot for it: ``decide._last_resort_relief``). Also the placements the
    repair kept off. The one chosen is repeatable (its searches' ``deterministic``) only if
    every attempt was: all of them chose it."""
    attempts: list[Repair] = []

    def attempt(forbidden: frozenset[tuple[str, str]]) -> Repair:
        attempts.append(repair_kept_off(cluster, cons, config, forbidden))
        return attempts[-1]

    fixed = attempt(guarded)
    if not fixed.needed or not fixed.stuck or guarded == failed or only_hot(cluster, cons):
        return fixed, guarded
    relaxed = attempt(failed)
    chosen, kept_off = (
        (fixed, guarded)
        if len(relaxed.stuck) >= len(fixed.stuck)
        else _returns_last(attempt, (relaxed, failed), returns)
    )
    made = [r.proposal for r in attempts if r.proposal is not None]
    unsure = set().union(*(unrepeatable(p) for p in made))
    if chosen.proposal is not None:
        chosen = replace(chosen, proposal=not_repeatable(chosen.proposal, unsure))
    return chosen, kept_off


def _returns_last(
    attempt: Callable[[frozenset[tuple[str, str]]], Repair],
    relaxed: tuple[Repair, frozenset[tuple[str, str]]],
    returns: frozenset[tuple[str, str]],
) -> tuple[Repair, frozenset[tuple[str, str]]]:
    """``relaxed`` (a repair with the guards lifted, and what it kept off), its moves that send a
    guest back to a node it left (in ``returns``) kept off in turn while that leaves no more
    guests stuck: a guest goes back only where no other node takes it. Each round keeps off only
    the returns the last plan chose, so the repair is the same wherever it needs none; at most
    :data:`RETURN_ROUNDS` rounds, and a round only with returns not yet kept off."""
    made, kept = relaxed
    for _round in range(RETURN_ROUNDS):
        back = returning_moves(made, returns) - kept
        if not back:
            return made, kept
        tried = attempt(kept | back)
        if len(tried.stuck) > len(made.stuck):
            return made, kept
        made, kept = tried, kept | back
    return made, kept


def returning_moves(
    made: Repair, returns: frozenset[tuple[str, str]]
) -> frozenset[tuple[str, str]]:
    """The (guest, target) moves of ``made``'s plan in ``returns``: guests sent back to a node
    they left within the no-return."""
    moves = made.plan.moves if made.plan is not None else ()
    return frozenset((m.guest, m.target) for m in moves) & returns


def repair_kept_off(
    cluster: Cluster, cons: Constraints, config: PolicyConfig, forbidden: frozenset[tuple[str, str]]
) -> Repair:
    """The repair with the placements ``forbidden`` kept off, whatever it leaves stuck."""
    return repair(
        cluster,
        forbidden=forbidden,
        constraints=cons,
        batch=config.batch,
        max_parallel=config.max_parallel,
        max_node_inflow=config.max_node_inflow,
    )


def only_hot(cluster: Cluster, cons: Constraints) -> bool:
    """Whether all that breaks now is nodes running hot (no hard constraint): relieving them is
    balancing, and it counts against the migration budget."""
    return broken_kinds(cluster, cons) <= {"hot"}


def broken_kinds(cluster: Cluster, cons: Constraints) -> frozenset[str]:
    """What breaks now (:attr:`Broken.kind` of each guest that may move)."""
    broken = _broken(cluster, cons, current_assign(cluster), cons.capacity.committed())
    return frozenset(b.kind for b in broken.values())


def repair_activity(cluster: Cluster, cons: Constraints) -> str:
    """What a repair of ``cluster`` is, as migration windows name it: ``balance`` (nodes that
    only run hot), ``maintenance`` (nothing but nodes in maintenance, and hot ones), else
    ``repair`` (a hard rule or a capacity limit)."""
    kinds = broken_kinds(cluster, cons) - {"hot"}
    if not kinds:
        return "balance"
    return "maintenance" if kinds == {"maintenance"} else "repair"


def first_moves(plan: Plan, batch: int, cluster: Cluster, cons: Constraints) -> Plan:
    """``plan`` cut to at most ``batch`` migrations (0: whole): its first steps, whole; when the
    first step alone has more, its first guests (hard-affinity bundles whole, at least one)."""
    if batch <= 0 or len(plan.moves) <= batch:
        return plan
    kept: list[PlannedMove] = []
    for step in plan.by_step():
        if len(kept) + len(step) > batch:
            if not kept:
                kept = _first_units(step, batch, cluster, cons)
            break
        kept.extend(step)
    note = f"Cut to the first {len(kept)} of {len(plan.moves)} migrations (batch {batch})."
    return replace(plan, moves=tuple(kept), problems=(*plan.problems, note))


def _first_units(
    step: tuple[PlannedMove, ...], batch: int, cluster: Cluster, cons: Constraints
) -> list[PlannedMove]:
    """The moves of one step, a guest (or a bundle going to one node) at a time, up to
    ``batch`` migrations and at least one unit."""
    units: dict[tuple[int, str], list[PlannedMove]] = {}
    for move in step:
        unit = cons.unit_of(cluster.guest_index[move.guest])
        units.setdefault((unit, move.target), []).append(move)
    kept: list[PlannedMove] = []
    for moves in units.values():
        if kept and len(kept) + len(moves) > batch:
            break
        kept.extend(moves)
    return kept


def stuck_after(
    cluster: Cluster,
    cons: Constraints,
    proposal: Proposal | None,
    plan: Plan,
    forbidden: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[tuple[str, str], ...]:
    """The guests that still break a hard constraint once ``plan`` has run, each with one
    sentence: where it is, what it breaks, what stops it on each other node, and — when the
    proposal says — what the exact repair found; with them, in guest order, the guests left on a
    node in maintenance that may not move (:func:`left_in_maintenance`)."""
    assign = current_assign(cluster)
    for move in plan.moves:
        assign[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    moved = {cluster.guest_index[move.guest] for move in plan.moves}
    committed = committed_for(cons, assign) + _still_migrating(cons, moved)
    broken = _broken(cluster, cons, assign, committed)
    held = _held_in_maintenance(cluster)
    if not broken:
        return tuple((cluster.guests[j].id, text) for j, text in held.items())
    verdict = _verdict(proposal.options.get("repair") if proposal is not None else None)
    unreachable = {g for g, _t in plan.unreachable}
    room = cons.capacity.limit - committed
    out = []
    for j in sorted({*broken, *held}):
        guest = cluster.guests[j]
        if j in held:
            out.append((guest.id, held[j]))
            continue
        what = broken[j]
        text = need_sentence(what)
        said = f"{guest.id}: {text}" if what.guest is None else text
        text = f"{said}; " + _rejections(cons, j, assign, room, forbidden)
        if guest.id in unreachable:
            text += "; no safe migration order reaches its target"
        out.append((guest.id, text + verdict))
    return tuple(out)


def _still_migrating(cons: Constraints, moved: set[int]) -> np.ndarray:
    """(N, D) what the migrations in progress that the plan leaves alone (guests not in
    ``moved``) commit on their targets besides their nodes: such a guest loads both while it
    migrates, and its target once it is done, so a node it overloads stays over either way."""
    cluster, capacity = cons.cluster, cons.capacity
    out = np.zeros_like(capacity.limit)
    compute = np.where(capacity.storage_cols[None, :], 0.0, capacity.demand)
    for j, guest in enumerate(cluster.guests):
        if guest.migrating_to is None or j in moved:
            continue
        for name in loaded_nodes(guest):
            if name != guest.node:
                out[cluster.node_index[name]] += compute[j]
    return out


class Refusal(NamedTuple):
    """Why a guest's unit may not go to some nodes: the rejection (of ``who``, one of the unit's
    guests, on one of them — for capacity the closest) and the nodes it stands for."""

    rejection: Rejection
    who: int
    nodes: list[int]


def _rejections(
    cons: Constraints,
    j: int,
    assign: np.ndarray,
    room: np.ndarray,
    forbidden: frozenset[tuple[str, str]],
) -> str:
    """``elsewhere: …``: what stops guest ``j`` on each other node (:func:`_refusals`), nodes
    with the same reason together; capacity with the numbers of the closest node."""
    guests = cons.cluster.guests
    groups: dict[str, list[int]] = {}
    for refusal in _refusals(cons, j, assign, room, forbidden):
        why = str(refusal.rejection)
        if refusal.rejection.code is RejectionCode.CAPACITY and len(refusal.nodes) > 1:
            why += f" on {refusal.rejection.node}, the closest"
        elif refusal.who != j:
            why = f"{guests[refusal.who].label}: {why}"
        groups.setdefault(why, []).extend(refusal.nodes)
    members = cons.unit_members(j)
    partners = ", ".join(guests[m].label for m in members.tolist() if m != j)
    together = f", with its hard-affinity partners {partners}" if members.size > 1 else ""
    if not groups:
        return f"elsewhere{together}: no other node"
    reasons = "; ".join(f"{_names(cons, where)}: {why}" for why, where in groups.items())
    return f"elsewhere{together}: {reasons}"


def _refusals(
    cons: Constraints,
    j: int,
    assign: np.ndarray,
    room: np.ndarray,
    forbidden: frozenset[tuple[str, str]],
) -> list[Refusal]:
    """What stops guest ``j`` on each other node, in reporting order: the first of the node's
    own filters that fails there (offline, maintenance, architecture, platform: no other move
    and no policy changes them), then — when every other node is too small for it even empty —
    that capacity, then the policy's placements, then the
    first other hard filter (capacity once, on the closest node), then what keeps its
    hard-affinity group off a node every filter allows (``room``: each node's free capacity
    with ``j`` placed as ``assign``). A guest with hard affinity partners moves with them: its
    unit is judged whole — their rules, their summed demand — so that a group that fits nowhere
    says which room it lacks."""
    nodes, guests = cons.cluster.nodes, cons.cluster.guests
    members = cons.unit_members(j)
    headroom = room.copy()  # without the unit's guests
    demand = np.zeros(room.shape[1])
    for m in members.tolist():
        headroom[int(assign[m])] += cons.guest_demand(m)
        demand += cons.guest_demand(m)
    apart = assign.copy()
    apart[members] = -1  # the unit's own partners move with it: no affinity filter among them
    left = np.ones(len(nodes), dtype=bool)
    left[int(assign[j])] = False
    filters = _unit_masks(cons, members, apart, headroom, demand)
    node_own = [(code, masks) for code, masks in filters if code in _NODE_OWN_FILTERS]
    out = _failing(cons, j, node_own, left, (apart, headroom, demand))
    out += _too_small(cons, j, left, demand)
    ids = [guests[m].id for m in members.tolist()]
    kept = np.array([any((g, n.name) in forbidden for g in ids) for n in nodes], dtype=bool)
    kept &= left
    if kept.any():
        policy = Rejection(RejectionCode.POLICY, nodes[int(np.argmax(kept))].name)
        out.append(Refusal(policy, j, np.nonzero(kept)[0].tolist()))
        left &= ~kept
    others = [(code, masks) for code, masks in filters if code not in _NODE_OWN_FILTERS]
    out += _failing(cons, j, others, left, (apart, headroom, demand))
    # Nodes every filter allows the unit: what stops its group there (a partner that cannot
    # move, one the policy keeps off), never "allowed" without a reason.
    for n in np.nonzero(left)[0].tolist():
        out.append(Refusal(_group_blocks(cons, j, n, assign, headroom, forbidden), j, [n]))
    return out


def _too_small(cons: Constraints, j: int, left: np.ndarray, demand: np.ndarray) -> list[Refusal]:
    """When not one node still ``left`` could hold guest ``j``'s unit (``demand``) even empty,
    that says it all: no policy and no rule could open one. Capacity once, on every such node
    (``left`` loses them), with the figures of the closest node in all; else nothing."""
    limit = cons.capacity.limit
    short = demand[None, :] > limit + tolerance(limit)
    small = np.nonzero(left & short.any(axis=1))[0]
    if not small.size or small.size < np.count_nonzero(left):
        return []
    left[small] = False
    closest = int(small[np.argmax(_room_share(limit[small], demand))])
    shortfalls = tuple(
        Shortfall(
            cons.capacity.dimensions[d], float(demand[d]), float(limit[closest, d]), whole=True
        )
        for d in np.nonzero(short[closest])[0].tolist()
    )
    rejection = Rejection(RejectionCode.CAPACITY, cons.cluster.nodes[closest].name, "", shortfalls)
    return [Refusal(rejection, j, small.tolist())]


#: The hard filters that depend on the node alone (and the guest), not on where the others are
#: (a node affinity's tier does: it moves down when the higher one is full): reported before
#: the policy, which could not put the guest there even if it let it.
_NODE_OWN_FILTERS = frozenset(
    {
        RejectionCode.OFFLINE,
        RejectionCode.MAINTENANCE,
        RejectionCode.ARCH,
        RejectionCode.PLATFORM,
    }
)


def _failing(
    cons: Constraints,
    j: int,
    filters: list[tuple[RejectionCode, list[tuple[int, np.ndarray]]]],
    left: np.ndarray,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[Refusal]:
    """The refusals of ``filters`` (in order) on the nodes still ``left``, which loses them:
    each node refused by the first filter that fails there, capacity once on the closest
    node (``state``: the unit's assignment apart, the headroom without it, its demand)."""
    apart, headroom, demand = state
    out: list[Refusal] = []
    for code, masks in filters:
        mask = np.logical_and.reduce([mask for _m, mask in masks])
        failing = np.nonzero(left & ~mask)[0]
        left &= mask
        if failing.size and code is RejectionCode.CAPACITY:
            closest = int(failing[np.argmax(_room_share(headroom[failing], demand))])
            rejection = cons.rejection(code, j, closest, apart, headroom, demand)
            out.append(Refusal(rejection, j, failing.tolist()))
            continue
        for n in failing.tolist():
            who = next(m for m, mask in masks if not mask[n])
            rejection = cons.rejection(code, who, n, apart, headroom, demand)
            out.append(Refusal(rejection, who, [n]))
    return out


def _unit_masks(
    cons: Constraints,
    members: np.ndarray,
    assign: np.ndarray,
    headroom: np.ndarray,
    demand: np.ndarray,
) -> list[tuple[RejectionCode, list[tuple[int, np.ndarray]]]]:
    """The hard filters of a unit's ``members`` in reporting order, each with every member's
    (N,) mask (``demand``: the unit's)."""
    out: dict[RejectionCode, list[tuple[int, np.ndarray]]] = {}
    for m in members.tolist():
        for code, mask in cons.hard_masks(m, assign, headroom, demand):
            out.setdefault(code, []).append((m, mask))
    return list(out.items())


def left_in_maintenance(cluster: Cluster) -> tuple[tuple[str, str], ...]:
    """The guests on an online node in maintenance that may not move (ignored, HA state, lock,
    local devices or disks, a container without restart migration, not running), in guest
    order, each with one sentence: where it is and what keeps it there. A repair never moves
    them, so every report of what a repair leaves names them. A guest migrating is on its way
    and not listed."""
    return tuple((cluster.guests[j].id, text) for j, text in _held_in_maintenance(cluster).items())


def _held_in_maintenance(cluster: Cluster) -> dict[int, str]:
    """:func:`left_in_maintenance` by guest index."""
    held = {n.name for n in cluster.nodes if n.maintenance and n.online}
    if not held:
        return {}
    out: dict[int, str] = {}
    for j, guest in enumerate(cluster.guests):
        if guest.node not in held or guest.migrating_to is not None:
            continue
        why = movability(guest, cluster, "balance")
        if why is not None:
            out[j] = f"{guest.label} is on {guest.node}, in maintenance, and stays there: {why}"
    return out


def _group_blocks(
    cons: Constraints,
    j: int,
    n: int,
    assign: np.ndarray,
    headroom: np.ndarray,
    forbidden: frozenset[tuple[str, str]],
) -> Rejection:
    """Why node ``n``, which every hard filter allows guest ``j`` alone, does not take it: its
    hard-affinity partners cannot join it there (one cannot move, the policy keeps one off, a
    filter refuses one, or there is no room for them all), else that the repair left it."""
    cluster = cons.cluster
    group = int(cons.group_of[j]) if cons.group_of.size else -1
    others = [] if group < 0 else [k for k in cons.groups[group].tolist() if k != j]
    away = [k for k in others if assign[k] != n]
    node = cluster.nodes[n].name
    for k in away:
        partner = cluster.guests[k]
        held = movability(partner, cluster, "balance")
        if held is not None:
            where = cluster.nodes[int(assign[k])].name
            detail = f"its hard-affinity partner {partner.label} cannot move from {where} ({held})"
            return Rejection(RejectionCode.GROUP, node, detail)
        if (partner.id, node) in forbidden:
            detail = f"the policy keeps its hard-affinity partner {partner.label} off it"
            return Rejection(RejectionCode.GROUP, node, detail)
    demand = cons.guest_demand(j) + sum((cons.guest_demand(k) for k in away), start=0.0)
    lacking = demand > headroom[n] + tolerance(cons.capacity.limit[n])
    if away and lacking.any():
        dims = ", ".join(str(cons.capacity.dimensions[d]) for d in np.nonzero(lacking)[0].tolist())
        detail = f"no room for its hard-affinity group there ({dims})"
        return Rejection(RejectionCode.GROUP, node, detail)
    for k in away:
        for code, mask in cons.hard_masks(k, assign, headroom):
            if code not in (RejectionCode.AFFINITY, RejectionCode.CAPACITY) and not mask[n]:
                why = cons.rejection(code, k, n, assign, headroom, cons.guest_demand(k))
                detail = f"its hard-affinity partner {cluster.guests[k].label}: {why}"
                return Rejection(RejectionCode.GROUP, node, detail)
    detail = "every hard rule allows it, but the repair moved it nowhere"
    return Rejection(RejectionCode.GROUP, node, detail)


def _room_share(headroom: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """How much of ``demand`` the least roomy dimension of each row of ``headroom`` holds."""
    need = np.where(demand > 0, demand, 1.0)
    share = np.where(demand[None, :] > 0, np.maximum(headroom, 0.0) / need[None, :], np.inf)
    return share.min(axis=1)


def _names(cons: Constraints, nodes: list[int], shown: int = 6) -> str:
    """``a, b, c`` — at most ``shown`` node names, then how many more."""
    names = [cons.cluster.nodes[n].name for n in nodes]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _verdict(info: object) -> str:
    """What the exact repair says about a guest it leaves (empty when it did not run)."""
    if not isinstance(info, Mapping):
        return ""
    status = info.get("exact")
    if "needs" in info:
        return (
            f" — the exact repair takes {info['needs']} migrations, more than max_moves "
            f"{info['max_moves']}"
        )
    if info.get("cut") == "deadline":
        return (
            f" — the exact repair was skipped: the plan's {REPAIR_SHARED_CAP:g} s of exact repair"
            " were spent (a busy machine) or the daemon is stopping"
        )
    if "cut" in info:
        return (
            f" — the exact repair ran past its wall-clock cap (at most {REPAIR_WALL_CAP:g} s; a"
            " busy machine) and is not used, as it would not repeat"
        )
    if status == "INFEASIBLE" and info.get("complete"):
        return " — no placement repairs it, even moving other guests"
    if status == "INFEASIBLE":
        return (
            f" — no repair moving the guests of the {info.get('nodes')} nodes the exact "
            "repair looked at"
        )
    if status in ("UNKNOWN", "MODEL_INVALID"):
        return " — the exact repair found none within its search budget"
    return ""


def warn_stuck(stuck: tuple[tuple[str, str], ...], logger: logging.Logger | None = None) -> None:
    """Each stuck guest at WARNING (the first :data:`STUCK_SHOWN`, then how many more)."""
    out = logger if logger is not None else log
    for _guest, why in stuck[:STUCK_SHOWN]:
        out.warning("repair stuck: %s", why)
    if len(stuck) > STUCK_SHOWN:
        out.warning("repair stuck: %d more guests", len(stuck) - STUCK_SHOWN)
