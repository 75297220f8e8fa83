"""Constraints: hard filters as vectorised (guest, node) masks, soft rules as penalties.

Hard filters, in the order they are reported when a node is rejected:

1. ``offline`` / ``maintenance`` — the node cannot take guests;
2. ``arch`` — the node's CPU architecture differs from the guest's;
3. ``platform`` — the platform cannot move the guest there (:attr:`Guest.limits
   <opendrs.model.cluster.Guest.limits>`: a replicated VM outside its replication targets, a
   mapped device the node lacks), with the platform's reason;
4. ``node-affinity`` — a strict rule allows only its nodes of the highest priority that can take
   the guest: usable, of its architecture, with room for it (pins too;
   :func:`~.node_affinity.affinity_tiers`); so does a non-strict rule for an HA guest with
   ``failback`` on (:func:`~.node_affinity.binding`), whom the HA manager would move back to its
   highest-priority nodes whatever a plan does;
5. ``forbidden`` — the placement was ruled out (no safe migration order reaches it);
6. ``anti-affinity`` — a hard negative partner runs on (or is moving to) the node;
7. ``affinity`` — hard positive partners run elsewhere;
8. ``capacity`` — vCPUs × overcommit, memory, measured use, or a local storage pool would overflow.

Whether a guest may move at all (:func:`movability`) is separate: ignored, HA states the HA manager
or an operator handles (:data:`HA_HELD`), locked, local devices, local disks, containers without
restart migration, stopped guests, minimum uptime.

Soft rules become penalties (:data:`SOFT_PENALTY` each): a non-strict node affinity not met, a
soft positive partner elsewhere, a soft negative partner on the same node.

Rules that contradict each other are found up front (:func:`check_rules`) and dropped with a
message naming them, as Proxmox's HA rule checks do: once per decision (a
:class:`~opendrs.engine.view.CycleView`'s ``rule_check``, a :class:`RuleCheck`), handed to what
reads the rules kept rather than checked again.

The (guest, node) masks are stored by distinct row (:class:`~opendrs.engine.sparse_rows.RowMask`)
and the partner lists as one flat array (:class:`~opendrs.engine.sparse_rows.Partners`), built
from the guests the rules name: at 100,000 guests and 1,000 nodes a dense mask is 100 MB, most of
it the same row.

**The modules.** :mod:`.rule_checks` (the rules kept), :mod:`.node_affinity` (tiers and binding),
:mod:`.masks` (the tables), :mod:`.rejection` (why not this node), :mod:`.held` (why not this
guest) and :mod:`.constraint_set` (the :class:`~.constraint_set.Constraints` built from them).
This file is only the package's public face: the names the rest of opendrs uses.
"""

from __future__ import annotations

from .constraint_set import SOFT_PENALTY, Constraints, committed_for, current_assign
from .held import HA_HELD, Held, Purpose, movability, platform_balancer
from .masks import hard_groups
from .node_affinity import fails_back
from .rejection import Rejection, RejectionCode, Shortfall, nodes_by_reason, reasons_text
from .rule_checks import RuleCheck, RuleProblem, check_rules

__all__ = [
    "HA_HELD",
    "SOFT_PENALTY",
    "Constraints",
    "Held",
    "Purpose",
    "Rejection",
    "RejectionCode",
    "RuleCheck",
    "RuleProblem",
    "Shortfall",
    "check_rules",
    "committed_for",
    "current_assign",
    "fails_back",
    "hard_groups",
    "movability",
    "nodes_by_reason",
    "platform_balancer",
    "reasons_text",
]
