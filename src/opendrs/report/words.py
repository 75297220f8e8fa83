"""The operator's words for what the engine decided: a move as "moves db-main (101) off pve1
(cpu 89 %) to pve4 (cpu 6 %)", a strategy's stop as a sentence, a move's cost as the bytes it
copies, a placement's penalty as the rules behind it.

The engine gives codes and figures (a move's reason code, :class:`Stop`, a penalty); they are
turned into words here, at the edge, for ``plan``, ``place`` and the reports. Its own figures stay
in ``--format json`` and ``--verbose``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np

from opendrs.engine.breaks import rule_breaks
from opendrs.engine.strategies.base import Proposal, ProposedMove, Stop
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest
from opendrs.model.units import format_bytes

__all__ = [
    "copied_bytes",
    "move_sentences",
    "penalty_rules",
    "purpose_words",
    "stop_sentence",
]

#: What a move's reason code means, said after the loads it evens out ("" : balancing alone).
_PURPOSES = {
    "balance": "",
    "balance (swap)": "in an exchange of two guests",
    "balance (set exchange)": "in an exchange of guests",
    "balance (below the grain)": "to even out the last small differences",
    "repair: rules": "to mend a broken hard rule",
    "repair: capacity": "to relieve a node over its capacity",
    "repair: maintenance": "to empty a node in maintenance",
    "repair (exact)": "to mend a broken hard constraint",
    "repair: maintenance (exact)": "to empty a node in maintenance",
    "repair: makes room (exact)": "to make room for a repair",
    "back from maintenance": "back to its node after maintenance",
    "balances the day's hours (daily profile)": "to even out the day's hours",
}


def copied_bytes(guest: Guest) -> int:
    """What a migration of ``guest`` copies: its memory and its local disks."""
    return guest.memory + guest.local_disk_bytes


def move_sentences(cluster: Cluster, moves: Sequence[ProposedMove]) -> list[str]:
    """Each move of a proposal in words, in order, the loads read as each move finds them:
    ``moves NAME (ID) off SOURCE (cpu 89 %) to TARGET (cpu 6 %)`` (the resource where the
    source is furthest above the target, every resource when it is above in none), why when
    it is not balancing alone, and what it copies (memory and local disks)."""
    loads = LoadModel.build(cluster)
    assign = loads.assign.copy()
    weights = np.array([cluster.settings.weight_cpu, cluster.settings.weight_memory])
    sentences = []
    for move in moves:
        j = cluster.guest_index.get(move.guest)
        s, t = cluster.node_index.get(move.source), cluster.node_index.get(move.target)
        if j is None or s is None or t is None:
            sentences.append(f"moves {move.guest} off {move.source} to {move.target}")
            continue
        fractions = loads.fractions(assign)
        shown = _shown(fractions[s], fractions[t], weights)
        sentence = (
            f"moves {cluster.guests[j].label} off {move.source} ({_loads(fractions[s], shown)}) "
            f"to {move.target} ({_loads(fractions[t], shown)})"
        )
        purpose = purpose_words(move.reason, cluster.guest_label)
        sentences.append(
            sentence + (f" {purpose}" if purpose else "") + f"; copies "
            f"{format_bytes(copied_bytes(cluster.guests[j]))}"
        )
        assign[j] = t
    return sentences


def _shown(source: np.ndarray, target: np.ndarray, weights: np.ndarray) -> list[int]:
    """The resources a move's sentence names: the one where the source is furthest above the
    target, or every weighted one when the source is above in none (a move that evens out
    the two resources together)."""
    gap = np.where(weights > 0, source - target, -np.inf)
    r = int(np.argmax(gap))
    return [r] if gap[r] > 0 else [k for k in range(len(RESOURCES)) if weights[k] > 0]


def _loads(node: np.ndarray, shown: list[int]) -> str:
    return ", ".join(f"{RESOURCES[r]} {_percent(node[r])}" for r in shown)


def purpose_words(reason: str, label: Callable[[str], str] = str) -> str:
    """A move's reason code in words ("" for balancing alone, and for another strategy's own
    sentence, whose figures are for ``--verbose``), with the guest it moves with (``(with
    ID)``, named by ``label``)."""
    code, _, partner = reason.partition(" (with ")
    words = _PURPOSES.get(code, "")
    if partner:
        words = f"{words} together with {label(partner.rstrip(')'))}".strip()
    return words


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %" if np.isfinite(fraction) else "no capacity"


def stop_sentence(proposal: Proposal) -> str:
    """Why the strategy stopped, in words (its own sentence where it gives no code)."""
    stop = proposal.stop
    if stop is None:
        return proposal.stopped
    return _STOP_WORDS.get(stop.code, lambda _stop: proposal.stopped)(stop)


def _balanced(stop: Stop) -> str:
    spreads = ", ".join(f"{r} {stop.details[f'{r}_spread'] * 100:.1f} pp" for r in RESOURCES)
    goal = stop.details["target_spread"] * 100
    commit = stop.details.get("cpu_commit_spread")
    vcpus = "" if commit is None else f", their vCPU commitments within {commit * 100:g}"
    return (
        f"the cluster is balanced: the nodes' loads are within {goal:g} percentage points "
        f"of each other{vcpus} ({spreads})"
    )


def _no_move_pays(stop: Stop) -> str:
    return (
        "no other allowed move evens the loads out enough to be worth the memory it copies "
        f"(--margin {stop.details['margin']:g})"
    )


def _move_limit(stop: Stop) -> str:
    return f"the limit of {stop.details['max_moves']:g} migrations is reached (--max-moves)"


_STOP_WORDS = {"balanced": _balanced, "no_move_pays": _no_move_pays, "move_limit": _move_limit}


def penalty_rules(cluster: Cluster, members: Iterable[str], node: str) -> list[str]:
    """The soft rules ``members`` (a guest and the guests it moves with) would break on
    ``node``: what a placement's penalty stands for."""
    moving = set(members)
    guests = tuple(replace(g, node=node) if g.id in moving else g for g in cluster.guests)
    breaks = rule_breaks(replace(cluster, guests=guests))
    return sorted({b.rule for b in breaks if not b.hard and moving & set(b.guests)})
