"""``balance`` — opendrs's own rebalancing strategy, one module per phase.

Goal: reach a target balance (every resource's spread — max − min of the usable nodes' load
fractions — at most ``target_spread``) with the fewest and smallest migrations, never breaking a
hard constraint, never making the objective worse, deterministically and fast.

**Objective.** The capacity-weighted variance of the node load fractions, per resource, combined
with the cluster's weights: ``J = Σ_r w_r · Σ_n C_nr (f_nr − f̄_r)² / Σ_n C_nr``
(:func:`~opendrs.engine.imbalance.balance_objective`, its one definition). It is zero exactly
when every node has the same fraction, for nodes of any size, and a move's effect is exact and
cheap: moving demand ``d`` from node ``a`` to node ``b`` changes it by
``Σ_r w_r (d²(1/C_a + 1/C_b) − 2d(f_a − f_b)) / Σ_n C_nr``
(:meth:`.state.BalanceState.gains`, checked against the definition) — the ``d²`` term is what
prevents overshoot: a move that would swap the roles of ``a`` and ``b`` scores worse than a
smaller one. Every balancing move lowers ``J``.

**The band.** The target is met once every usable node's fraction lies within ``goal / 2`` of the
cluster mean, per weighted resource (the *band*; the goal is ``target_spread``, or one guest's
step on the smallest node where that is coarser). How far a node is from it, counted in typical
guests (its load outside the band over the mean movable guest's demand, summed over the weighted
resources), is the *band distance*: it says how much is left to move, and a move that brings a
node exactly into the band is worth as much as it moves, where the variance would rather halve
the gap between two nodes and leave both to be fixed again. Moves are therefore *chosen* by how
much band distance they remove per guest they migrate (a bundle of hard-affinity guests is as
many migrations; the variance, also per guest, decides when no move shortens it), and *allowed*
only when they also lower ``J``.

**Shedding plan.** A node above the band in every weighted resource must shed its excess; the
fewest guests that do it carry cpu and memory in the proportions of that excess, not the biggest
ones (which are memory-heavy: they balance memory long before cpu, and the node then takes guests
back). For each such node the plan sweeps directions in the (cpu, memory) plane: units in the
order of their projection on the direction per guest, each taken if it does not overshoot the
excess by more than half the band, until the excess is covered; the direction needing the fewest
migrations (a bundle counts each of its guests; a shortfall counts as extra guests) wins — a
rounding of the linear relaxation behind :func:`opendrs.engine.bounds.migration_lower_bound`.
Where one to three of the node's units land it in the band with fewer migrations (every such
choice tried, on nodes whose units are of few kinds), they are the plan instead. Until the
planned guests have left (or none of them helps any more), the rounds below move only them, each
to where it removes the most band distance per guest it migrates.

**Rounds of moves.** What the plan leaves is finished by rounds of greedy moves over a vectorised
(unit × node) matrix — a *unit* is a guest, or a bundle of guests kept together by hard affinity.
In each round every candidate unit gets its best allowed target; then moves are taken in order of
score, at most one per node, so moves in a round touch disjoint nodes and their gains stay exact.
Among scores within 1 % of each other the cheaper migration wins. A move is made only if it pays
for itself — the balance σ (the square root of the objective) falls by at least ``margin``
percentage points per percent of the cluster's total migration cost that the move spends (moving
a guest that has already moved, or back home, spends nothing) — and the search stops as soon as
every weighted resource is within its goal: no moves while balanced. When no single move helps,
units are exchanged between the nodes that deviate most (four, or one in 64 on big clusters) and
nodes that deviate the other way, on disjoint pairs of nodes, the exchange with the largest gain
per migration it adds first (one between guests that have both moved already adds none; a bundle
adds one per guest). When no exchange of two pays either, one unit is exchanged against a set of
another node's units, all its moves evaluated together (:mod:`.set_exchange`).

**Held resources.** With ``hold``, and wherever the vCPU commitments' goal is looser than
``target_spread`` (``cpu_commit_spread``, static mode: 100 pp by default), each round a resource
already within its goal is held there (:mod:`.hold`): it has no weight in what chooses the moves
(the objective gain, the band distance, the exchanges, the shedding plan, the price) — it only
breaks ties between moves of scores within 1 % of each other, before their cost — and no move or
exchange may take its spread above its goal. While resources are held, a round first makes the
exchanges of two units that gain three times as much per migration as its best single move per
guest: one big unit out and one back in, where single moves that keep the held resources within
their goal would be many small ones.

**The vCPU goal's price.** Where the vCPU commitments start outside their looser goal, a second
search holds them at their spread at the start (``cpu_commit_spread`` widened to it) and its plan
is proposed where the first one's takes more than ``cpu_commit_moves`` times its migrations
(:func:`.strategy.propose_balance`; clusters of up to 5,000 guests, and only where the first
plan takes more than that many times the memory-only lower bound: elsewhere it cannot win) and
the second one ends balanced — or, where neither ends balanced (a goal out of reach: guests that
may not move yet hold too much of a node) and the first one leaves the vCPUs outside their goal
too, where the second leaves every other weighted resource's spread no wider: vCPU moves that do
not reach their goal are no reason to leave memory less even (the lower bound is then for the
memory spread the first plan reached).

**Idle windows.** A move's gain depends only on its two nodes' loads, and whether it is allowed
only on its unit and its target: a window in which a round found no move that lowers the
objective stays so for every pair of nodes no move has changed since. A round looks first at
the pairs that changed (:class:`.picks.IdleWindows`); when they offer none either, it knows the
whole window offers none (the same answer as the whole search, found at a fraction of its cost).

**Repair first.** Guests that break a hard constraint now — on a node in maintenance, on a node
their strict node affinity excludes, sharing a node with a hard anti-affinity partner, split from
their hard-affinity partners, or on a node over capacity — are moved first, to their best allowed
node, whatever the cost. A bundle split over several nodes is on all of them until it is gathered
(on any node, one of its own included, with room there for the members not there yet): no hard
anti-affinity partner of any member may go to any of them, and a gathered bundle is not split
again by pruning. Split bundles are gathered by repairs only, not moved by balancing. A bundle
with members that cannot move (*anchored*) may be gathered only on their node — its other members
join them there — and nowhere when they are on several nodes.

**Exact repair.** The greedy repair moves only the units that break something; when one can go
nowhere — its only possible node must first shed a small guest, two full nodes must swap — the
exact model (:func:`~opendrs.engine.strategies.exact_repair.solve_repair`, CP-SAT, on a
deterministic budget: repeatable; cut by its wall-clock safety net, or skipped once the plan's
shared deadline is spent: not used) places the stuck
units and the units that may make room for them at the least migration cost (see
:func:`.exact.exact_repair` for which units and nodes it holds).
Its moves are made all together, or not at all when they would exceed ``max_moves`` (the policy
then asks for the whole repair and keeps the first steps of its plan); what is left is noted as
not repaired, and ``Proposal.options["repair"]`` says what the exact repair found.

**Pruning.** Afterwards, every move is tried undone (most expensive first): if the cluster still
meets the target and the constraints without it, it is dropped.

**Below the grain.** A resource whose goal was one step on the smallest node, coarser than
``target_spread``, is then brought within ``target_spread`` in whole steps where the nodes' whole
steps can add up inside one such window (:mod:`.grain_window`, :mod:`.polish`); where
they cannot, or the polish does not get every node in, it keeps the grain as its goal and the
stop reason says why.

**Compaction.** Then pairs of moves that pass load on — a unit from ``a`` to ``b`` and another
from ``b`` to ``c``, or two units from ``a`` to ``b`` — are replaced by one move of a unit of
``a`` to ``c`` (or ``b``) that adds fewer migrations (none for a unit that has moved already),
where every weighted resource stays within its goal — and no wider than ``target_spread`` or
than it is already, so a resource whose goal is one step on the smallest node keeps the spread
reached — and the objective at most what it was when balancing began (:mod:`.compact`, within
a budget of tries per move).

**Consolidation.** Then every two moves that share a node (as source or target) — a swap, a big
unit out and a small one back, two top-ups of one node — are undone together where the goal, the
ceiling and the hard constraints hold without them, or else replaced by one move of a unit of one
of their nodes to another of them or to a node far from the mean, adding fewer migrations
(:mod:`.consolidate`, within a budget of tries per move); where it saved a move, compaction
runs once more.

**Cheaper twins.** Last, a moved guest whose place a cheaper guest that balances alike could
take gives it that place (:mod:`.twins`): a guest left at home on the same source node, with the
same balance load, a lower migration cost (no local disk to copy), in no rule and free to move,
goes to the target where the hard constraints allow, and the first one stays home. The loads, the
spreads and the moves are the same; the cost falls.

**A second path.** With few, big guests per node the search above can end short of the target,
where no move or exchange pays for itself. Then, on a cluster of at most
:data:`.strategy.PLAIN_GUESTS` guests, the plain search — no plan, moves chosen by objective
gain — runs from the start, and its answer is kept if it reaches the target, or if it ends
nearer the target (the largest weighted spread over its goal smaller) when neither does.

On large clusters (more than ``wide`` nodes) each round looks only at the ``wide`` most loaded
sources and ``wide`` least loaded targets, which keeps a round cheap at 1,000 nodes.

**The modules.** :mod:`.state` (the search state, :class:`~.state.BalanceState`; its units in
:mod:`.units`, exchange kinds in :mod:`.kinds`), :mod:`.steps` (the history of typed steps), one
module per phase — :mod:`.repair` (with :mod:`.exact`), :mod:`.shed_plan` and
:mod:`.rounds` (with :mod:`.picks` and :mod:`.set_exchange`), :mod:`.prune`, :mod:`.polish`
(with :mod:`.grain_window`), :mod:`.compact`, :mod:`.consolidate`, :mod:`.twins` — and
:mod:`.strategy`, which runs them in order (:func:`~.strategy.propose_balance`, the registry's
:class:`~.strategy.Balance`). The phases import the state, the strategy imports the phases.
"""
