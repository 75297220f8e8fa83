"""Policy: *when* to act — turns a stream of observations into decisions, without flapping.

A strategy says where guests should run; the policy says whether to move them now. It is a pure
function of explicit immutable values: :func:`decide` takes the observed cluster (and its
smoothed usage), the time, a :class:`PolicyConfig`, the previous :class:`PolicyState` and what
the controller's history knows (:class:`PastMigrations`), and returns a :class:`Decision` with
the next state. Every guard the peers use against flapping is here, each one configurable:

* **Smoothing** (:class:`UsageWindow`) — the measured usage of each guest (and each node's own
  load) is averaged over the last ``smoothing`` seconds, so that a one-observation spike does not
  look like an imbalance. The controller adds each observation to the window and passes its
  :meth:`UsageWindow.average` (arrays, which the cycle's view builds its loads on) as
  ``average``. Capacity is checked on usage that rises faster: each value at the higher of its
  mean and its mean over the hold (:func:`overload_span`), which the controller passes as
  ``recent`` — an overload that lasts the hold is repaired, and no plan puts more on a
  node than its recent usage leaves room for, however empty the long average shows it. With a
  ``hot`` level each value is raised to the observation's own where that is higher
  (:func:`~.smoothing.with_last`): a node above the hot level is relieved at the first
  observation that sees it, and never refilled by a plan while it counts as having run hot
  (:attr:`PolicyState.hot_seen`), nor by a relief while another node has room. The controller
  also raises, on a node whose load rises steadily — or did within the hour and has not fallen
  from its peak since —, each value to its forecast one interval ahead (:mod:`.trend`): such a
  node is relieved before it crosses the hot level.
* **Demand per time of day** (off by default: ``daily_profile``; :mod:`.profile`,
  :mod:`.dayplan`) — the controller also keeps each guest's usage per hour of the day
  (:class:`~opendrs.engine.policy.profile.DailyProfile`) and, once it has seen a day, passes the
  24 hours' usage as ``daily``: the metric is the worst hour's, and the plan moves guests where
  they lower the imbalance summed over every hour, pairing guests whose peaks do not coincide.
* **Threshold** — nothing happens while the imbalance ``metric`` is at or below ``threshold``:
  ``spread`` (opendrs: the largest max − min of the weighted resources' load fractions,
  :func:`~opendrs.engine.imbalance.balance_spread`), ``cv`` (Proxmox's test logs: population
  σ / mean of the combined load ``(cpu + memory) / 2``), ``pve-imbalance`` (Proxmox VE 9.1+: that
  CV divided by √(N−1), proxmox-resource-scheduling 2.1.0), ``memory-spread`` (ProxLB: max − min
  of the memory fractions) — all on the usable nodes — or ``none`` (the strategy's own trigger
  decides).
* **Hold** — the metric must be above the threshold for ``hold`` observations in a row (Proxmox's
  hold duration). As in Proxmox the count restarts at every attempt, acted on or not, so a plan
  refused by the margin is not asked for again before ``hold`` more observations.
* **Margin** — a plan is carried out only if it improves the metric by at least ``margin``,
  relative: ``(metric − predicted) / metric ≥ margin`` (Proxmox's rule), the prediction being the
  metric of the cluster after the plan's moves. ``margin`` 0 turns the check off (ProxLB, Incus).
* **Cooldown** — a guest moved less than ``cooldown`` seconds ago is not moved again (Incus's 6 h);
  **no return** — a guest never goes back to a node it left less than ``no_return`` seconds ago;
  **avoid** — after a failed migration, that target is kept off for ``avoid_after_failure``
  seconds. All three come from :class:`PastMigrations` and become *forbidden placements*, which
  every strategy honours and the planner's own retries add to.
* **Minimum uptime** — guests up for less than ``min_uptime`` seconds stay where they are.
* **Batch** — at most ``batch`` migrations per decision: asked of the strategy as ``max_moves``
  (strategies that take it); every proposal is then cut to the first ``batch`` migrations in
  proposal order, hard-affinity bundles whole, and the cut target is planned again.
* **Budget** — with ``max_migrations_per_day``, at most that many balancing migrations (plans,
  and reliefs of nodes that only run hot) start in any 24 hours (:data:`BUDGET_WINDOW`) — or,
  with a fraction below 1 such as ``0.5``, one in any ``1 / budget`` days
  (:func:`budget_window`); with ``migration_budget_window`` W, the budget × W's days (rounded
  down, :func:`budget_allowance`) in any W, free to be spent together; the controller gives
  their start times
  (:attr:`PastMigrations.budget_spent`). Spent, the strategy is not asked (code ``budget``);
  partly spent, a plan that clears the margin but needs more than is left is asked for again
  with at most what is left, and that part is made. Repairs of maintenance, capacity and hard
  rules, and returns from maintenance, are exempt. A budget above one migration per
  ``smoothing`` window spends what it leaves on a faster reaction
  (:mod:`~opendrs.engine.policy.spending`): balancing reads usage closer to its plain mean over
  the hold, which the controller passes as ``latest``, and the hold shrinks, both by the share
  of the budget left.
* **Windows** (off by default: ``windows``, ``blackouts``; :mod:`.windows`) — balancing starts
  migrations only within its migration windows and none in a blackout, read at ``now`` in the
  policy's explicit time zone; a repair, an evacuation for maintenance or a return from it as
  ``windows_apply_to`` and ``blackouts_apply_to`` say (by default windows hold back balancing
  only, blackouts all but the repair of hard rules and capacity). Held back, the decision says
  so (codes ``outside-window``, ``blackout``) and when it may start next; balancing's hold counts
  on meanwhile.
* **Busy** — while a plan is executing nothing is decided and the hold count stands still (Proxmox
  skips its rounds without counting while a service migrates); with ``wait_for_motions``, likewise
  while any guest of the cluster moves — a migration opendrs did not start, an HA migrate or
  relocate under way or queued (``Manager.pm`` ``any_resource_motion_queued_or_running``).

**Repairs** come before all of that: a guest that breaks a hard constraint now and may move — on a
node in maintenance, outside its strict node affinity, with a hard anti-affinity partner on its
node, split from its hard-affinity bundle, or on a node over a capacity limit — is moved at once,
bypassing threshold, hold and margin but never a forbidden placement. The repair is opendrs's,
whatever the strategy (the peers rely on their own evacuation — Proxmox HA's maintenance mode,
``incus cluster evacuate``): :func:`repair`, which ``opendrs plan`` and ``opendrs place
--evacuate`` use as well — ``balance``'s repair phase, asked for nothing else, greedy first and
then the exact model where a guest can go nowhere, ordered by the planner with parking moves; an
exact repair longer than ``batch`` is carried out a few steps per decision (``opendrs plan``
makes it first too, with any strategy, and shows it whole). A guest no repair can move is logged
at WARNING at every decision, naming what stops it (:attr:`Decision.stuck`) — and so is every
guest left on a node in maintenance because it may not move (:func:`left_in_maintenance`), which
the reason of a decision that moves nothing counts. Maintenance overrides ``min_uptime``, the
policy's and the cluster's.
Guests on an offline node cannot be migrated; recovering them is the HA stack's job.

**Back from maintenance.** With ``maintenance_return`` the policy remembers which guests left a
node in maintenance (:class:`PolicyState` ``evacuated``) and moves them back at once when it leaves
maintenance, as Proxmox HA and ``incus cluster restore`` do. Off by default (nothing is
remembered): the balance decides what the node gets.

**Presets** (:data:`PRESETS`) emulate the peers for the simulator's side-by-side report:

* ``opendrs`` — the defaults: spread above 15 pp for 6 observations, a plan must cut it by 25 %,
  balanced to 8 pp by ``balance``, at most 30 migrations, 6 h cooldown, 24 h no-return, 10 min
  minimum uptime, usage averaged over 6 h, failed targets avoided for 1 h.
* ``proxmox`` — Proxmox VE 9.1+'s auto-rebalance (pve-ha-manager 5.2.0 ``Manager.pm``
  ``load_balance``, proxmox-resource-scheduling 2.1.0): the ``pve-imbalance`` above 30 %, held for
  3 CRM rounds of about 10 s — within one observation of a minute, so ``hold`` 1 —, the move must
  improve it by 10 % relative, one move per trigger by ``pve-bruteforce`` (started HA resources
  only, on the top tier of their node affinity), one migration at a time, nothing while any guest
  moves (``wait_for_motions``); no cooldown ("there is no per-guest cooldown"), no no-return
  window, no smoothing, no minimum uptime. Guests evacuated for maintenance go back to their node
  when it leaves maintenance (HA's ``maintenance_node``).
* ``incus`` — Incus's automatic rebalancing (``cluster.rebalance.*``):
  every 15 minutes the ``incus`` strategy applies its own trigger (a 20 % gap relative to the
  busiest member), one move per run (``batch`` 1), a 6 h cooldown; no hold, margin or smoothing.
  Evacuated guests go back when the member is restored (``incus cluster restore``).
* ``proxlb`` — ProxLB 2.3.0: every 12 h (its default schedule), the memory
  spread above 10 pp (balanciness 10) triggers ``proxlb-greedy``, which moves as many guests as its
  run decides (no batch), five migrations at a time (``parallel_jobs``) and no inflow limit; no
  hold, margin, cooldown or smoothing (ProxLB reads the current memory use).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opendrs.engine.policy.config import METRICS, PRESETS, Metric, PolicyConfig
    from opendrs.engine.policy.decide import decide
    from opendrs.engine.policy.decision import Decision, DecisionCode, DecisionKind
    from opendrs.engine.policy.guards import forbidden_placements
    from opendrs.engine.policy.maintenance import track_evacuations
    from opendrs.engine.policy.metrics import (
        format_by_arch,
        format_metric,
        measure,
        measure_by_arch,
    )
    from opendrs.engine.policy.planning import truncate
    from opendrs.engine.policy.reading import POLICY_KEYS, parse_policy, strategy_problem
    from opendrs.engine.policy.repair import (
        Repair,
        first_moves,
        left_in_maintenance,
        may_need_repair,
        repair,
        repairs_needed,
        stuck_after,
        stuck_now,
        warn_stuck,
    )
    from opendrs.engine.policy.smoothing import UsageWindow, overload_span
    from opendrs.engine.policy.state import (
        BUDGET_WINDOW,
        PastMigrations,
        PolicyState,
        budget_allowance,
        budget_window,
    )
    from opendrs.engine.policy.why import WhyNot, why_not

#: Each name of the package and the module that defines it, imported when the name is first asked
#: for (:func:`__getattr__`): ``opendrs plan`` needs the repair, not the decisions and their
#: guards, whose dataclasses cost a tenth of its start-up.
_DEFINED_IN: dict[str, str] = {
    "METRICS": "config",
    "PRESETS": "config",
    "Metric": "config",
    "PolicyConfig": "config",
    "decide": "decide",
    "Decision": "decision",
    "DecisionCode": "decision",
    "DecisionKind": "decision",
    "forbidden_placements": "guards",
    "track_evacuations": "maintenance",
    "format_by_arch": "metrics",
    "format_metric": "metrics",
    "measure": "metrics",
    "measure_by_arch": "metrics",
    "truncate": "planning",
    "POLICY_KEYS": "reading",
    "parse_policy": "reading",
    "strategy_problem": "reading",
    "Repair": "repair",
    "first_moves": "repair",
    "left_in_maintenance": "repair",
    "may_need_repair": "repair",
    "repair": "repair",
    "repairs_needed": "repair",
    "stuck_after": "repair",
    "stuck_now": "repair",
    "warn_stuck": "repair",
    "UsageWindow": "smoothing",
    "overload_span": "smoothing",
    "BUDGET_WINDOW": "state",
    "PastMigrations": "state",
    "PolicyState": "state",
    "budget_allowance": "state",
    "budget_window": "state",
    "WhyNot": "why",
    "why_not": "why",
}

__all__ = [
    "BUDGET_WINDOW",
    "METRICS",
    "POLICY_KEYS",
    "PRESETS",
    "Decision",
    "DecisionCode",
    "DecisionKind",
    "Metric",
    "PastMigrations",
    "PolicyConfig",
    "PolicyState",
    "Repair",
    "UsageWindow",
    "WhyNot",
    "budget_allowance",
    "budget_window",
    "decide",
    "first_moves",
    "forbidden_placements",
    "format_by_arch",
    "format_metric",
    "left_in_maintenance",
    "may_need_repair",
    "measure",
    "measure_by_arch",
    "overload_span",
    "parse_policy",
    "repair",
    "repairs_needed",
    "strategy_problem",
    "stuck_after",
    "stuck_now",
    "track_evacuations",
    "truncate",
    "warn_stuck",
    "why_not",
]


def __getattr__(name: str) -> Any:
    """A name of :data:`_DEFINED_IN`, from its module, imported now (then kept here)."""
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_DEFINED_IN})


class _Package(ModuleType):
    """This package, whose functions :func:`decide` and :func:`repair` have the names of their
    modules: importing a module sets it as an attribute of its package, which would hide the
    function of that name; the module is not set (it stays in ``sys.modules``), so the name is
    the function's, imported or not yet."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and _DEFINED_IN.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
