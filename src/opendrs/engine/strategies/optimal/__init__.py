"""``optimal`` — exact placement with CP-SAT (proxlb-solver's model, on opendrs's).

**Variables.** One Boolean ``y[b][n]`` per *unit* ``b`` and allowed node ``n``, with
``Σ_n y[b][n] = 1``. A unit is a guest, or a bundle of guests kept together by hard positive
affinity (merged transitively): one set of variables per bundle, so its members share a node by
construction. A movable unit gets a variable for each node that passes the static constraints of
every member (usable, architecture, strict node affinity and pins, not forbidden); a unit that may
not move (ignored, locked, local devices, …; see :func:`~opendrs.engine.constraints.movability`) is
fixed on its node.

**Hard constraints.**

* Capacity, per node and per :class:`~opendrs.engine.usage.CapacityModel` dimension (configured
  vCPUs against cores × overcommit, configured memory, measured use in dynamic mode, each local
  storage pool — all net of reserves and of the host's own load). The integers are chosen so that
  an answer CP-SAT accepts is truly feasible: vCPUs and cores are counted in thousandths, bytes in
  the largest unit that divides every size of the dimension (exact in practice: sizes are whole
  MiB); whenever a value is not a whole number of units, a guest's demand is rounded **up** and a
  node's room **down**. Stopped guests commit only their disks.
* Hard anti-affinity: at most one member of a rule per node. Implicit negatives (a bundle inherits
  its members' negative partners) follow from the shared unit variables.
* Maintenance and offline nodes, pins and strict node affinity: through the variables' domains.

**Objective** (all integers)::

    w_balance · spread + w_stickiness · migration cost + 1,000,000 · broken soft rules

``spread`` is the max − min, over the usable nodes, of each node's load fraction scaled to 10,000
(100 %) and rounded down, summed over the method's terms with their weights:

* ``balance`` (opendrs's default) — the cpu and memory fractions of the cluster's usage mode
  (:class:`~opendrs.engine.usage.LoadModel`: basic, static or dynamic, net of reserves, the host's
  own load included), or of its guests' pressure with ``Settings.balance_source = "pressure"``,
  each scaled by its share of ``Settings.weight_cpu/weight_memory``.
* proxlb-solver's methods, exactly as its model (their terms, weights and levels are
  :mod:`opendrs.engine.objective`): ``memory`` (configured memory in
  MiB), ``cpu`` (measured use, or vCPUs with ``usage="assigned"``), ``disk`` (local disks against
  the node's storage), ``cpu_psi``/``memory_psi``/``io_psi`` (the guests' pressure against 100),
  ``cpu_smart``/``memory_smart``/``io_smart`` (``w_X_usage · usage + w_X_psi · psi``) and
  ``global_smart`` (``Σ w_global_R · smart_R``). Each guest's footprint is multiplied by its
  ``priority`` (1–3), and ``usage="psi"`` makes the single methods use pressure.

The migration cost of a guest is :func:`~opendrs.engine.strategies.base.migration_cost`; a soft
rule is broken when a soft positive rule's guests use more than one node, when two guests of a soft
negative rule share one, or (per guest) when a non-strict node affinity is not met.

**Balanciness** 1–5 sets ``(w_balance, w_stickiness, gap threshold)``: 1 (0, 1, 100 %),
2 (1, 50, 25 %), 3 (10, 10, 15 %), 4 (50, 5, 5 %), 5 (100, 1, 0). ``w_balance`` becomes 0 — only
forced moves remain — when the initial spread (as proxlb-solver computes it: priority-weighted,
real-valued) is below the threshold, or when utilisation thresholds are given and no usable node
exceeds one.

**Warm start and determinism.** The default strategy's answer (run with the same ``forbidden``) is
given to CP-SAT as a hint, or the current placement when that fails. With one worker (the default)
the search is deterministic: a fixed seed, and the budget counted in CP-SAT's deterministic time,
which does not depend on machine load: ``time_limit / 5`` units, which take about 40–80 % of
``time_limit`` in seconds on one core. ``time_limit`` itself is a hard wall-clock cap; only if it
strikes first (a slow or busy machine) can two runs differ, and ``options["solver"]
["deterministic"]`` then says False. With ``workers > 1`` CP-SAT runs its parallel portfolio
(with large-neighbourhood search) under the wall-clock limit only: better on large clusters, but
**not** deterministic. Whatever CP-SAT
returns, the answer is never worse than the hint or the current placement when those are feasible.

**Ties.** Among placements with the same objective, a second CP-SAT pass (run only once the first
is proven optimal) prefers the least migration effort — the migration cost, then how busy (CPU) the
moved guests are — and then placing busy guests on nodes that report less pressure.

**Strictness.** By default contradictory rules are dropped with a message (as Proxmox does), and a
guest that cannot go anywhere allowed, or may not move, stays where it is (with a note). With
``strict=True`` (proxlb-solver's semantics) each of these makes the problem INFEASIBLE.

The result is reported in ``Proposal.options["solver"]``: status (OPTIMAL, FEASIBLE, INFEASIBLE or
UNKNOWN), objective, proven bound, gap, wall time and the objective's parts.

**The modules.** :mod:`.strategy` (the options, the objective's weights, :func:`propose_optimal`),
:mod:`.terms` (the spread terms), :mod:`.units` (guests cut into units, with the rules' notes),
:mod:`.problem` (the problem as integers, and the exact evaluation of a placement), :mod:`.model`
(the CP-SAT model and its objective), :mod:`.search` (the two passes and the reference
placements), :mod:`.answer` (the proposal and the solver's report), :mod:`.explain` (why no
placement exists). The exact repair ``balance`` falls back on is a model of its own
(:mod:`opendrs.engine.strategies.exact_repair`).
"""

from __future__ import annotations

from .answer import STRATEGY
from .strategy import DEFAULT_TIME_LIMIT, STRATEGIES, Optimal, OptimalOptions, propose_optimal
from .terms import METHODS, initial_spread, thresholds_exceeded

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "METHODS",
    "STRATEGIES",
    "STRATEGY",
    "Optimal",
    "OptimalOptions",
    "initial_spread",
    "propose_optimal",
    "thresholds_exceeded",
]
