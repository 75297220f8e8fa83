"""Manual mode in the daemon: decisions become proposals, approved proposals become plans.

The :class:`~opendrs.controller.loop.Controller` asks :class:`ManualMode`, each cycle:

* :meth:`ManualMode.take_approved` — before deciding, when the executor is idle: each proposal an
  operator approved since, checked again on this cycle's observation
  (:func:`~opendrs.controller.approval.recheck`), becomes the plan handed to the executor, or
  expires with the reason;
* :meth:`ManualMode.expire_stale` — each open proposal older than ``proposal_ttl``, or whose
  moves no longer fit the cluster (a guest moved or is gone, a target left, the guards now forbid
  it), expires;
* :meth:`ManualMode.propose` — a decision to act that is not ``automatic`` is stored as an open
  proposal. The same moves as an open proposal of its kind keep that proposal (and its id), the
  same moves as a rejected one are not proposed again (while the history keeps it); other moves
  supersede the open proposal of their kind.
"""

from __future__ import annotations

import logging

from opendrs.controller.approval import recheck, still_placed
from opendrs.controller.history import History
from opendrs.controller.history_file import HistoryError
from opendrs.controller.proposals import ProposalRecord, ProposedMove, proposal_id
from opendrs.engine.planner import Plan
from opendrs.engine.policy import Decision
from opendrs.engine.policy.decision import DecisionCode
from opendrs.model.cluster import Cluster
from opendrs.model.units import format_duration
from opendrs.report.words import decision_words

log = logging.getLogger(__name__)

__all__ = ["ManualMode", "decision_kind"]

_KIND_OF_CODE = {
    DecisionCode.PLAN: "balance",
    DecisionCode.REPAIR: "repair",
    DecisionCode.RETURN: "return",
}


def decision_kind(decision: Decision) -> str:
    """The proposal kind of a decision that acts: its activity as migration windows name it
    (``balance``, ``maintenance``, ``return``, ``repair``)."""
    return decision.activity or _KIND_OF_CODE.get(decision.code, "repair")


class ManualMode:
    """The proposals of one daemon, kept in its history."""

    def __init__(self, history: History) -> None:
        self.history = history

    def pending(self) -> bool:
        """Whether a proposal is open or approved (else a cycle has nothing to check)."""
        try:
            return bool(self.history.proposals("open", "approved"))
        except HistoryError as exc:
            log.warning("cannot read the proposals: %s", exc)
            return False

    def propose(
        self, decision: Decision, decision_id: int, cluster: Cluster, now: float
    ) -> ProposalRecord:
        """Store the plan of ``decision`` (recorded as ``decision_id``) as an open proposal."""
        assert decision.plan is not None
        guests = cluster.guest_index
        moves = tuple(
            ProposedMove(
                m.guest,
                cluster.guests[guests[m.guest]].name if m.guest in guests else "",
                m.source,
                m.target,
            )
            for m in decision.plan.moves
        )
        kind = decision_kind(decision)
        for known in self.history.proposals("open", "rejected"):
            if known.kind == kind and known.moves == moves:
                return known
        proposal = ProposalRecord(
            id=proposal_id(now, moves),
            decision=decision_id,
            at=now,
            kind=kind,
            reason=decision_words(decision, cluster.guest_label),
            imbalance=decision.metric,
            predicted=decision.predicted,
            moves=moves,
        )
        self.history.add_proposal(proposal)
        log.info(
            "proposal %s (%s) waits for approval: %s",
            proposal.id,
            kind,
            "; ".join(m.label() for m in moves),
        )
        return proposal

    def expire_stale(
        self, cluster: Cluster, forbidden: frozenset[tuple[str, str]], now: float, ttl: float
    ) -> None:
        """Expire each open proposal made ``ttl`` seconds or more before ``now``, or whose moves
        no longer fit ``cluster``."""
        for proposal in self.history.proposals("open"):
            if now - proposal.at >= ttl:
                problem: str | None = f"older than {format_duration(ttl)} (proposal_ttl)"
            else:
                problem = still_placed(proposal.moves, cluster, forbidden)
            if problem is not None:
                self._expire(proposal, problem, was=("open",))

    def take_approved(
        self,
        cluster: Cluster,
        metric: str,
        forbidden: frozenset[tuple[str, str]],
        keep_failover: int = 0,
        failover_recovery: str = "auto",
    ) -> tuple[ProposalRecord, Plan] | None:
        """The oldest approved proposal that still holds on ``cluster`` (:func:`recheck`), with
        its plan, marked started; each approved one before it that no longer holds expires."""
        for proposal in self.history.proposals("approved"):
            checked = recheck(
                proposal, cluster, metric, forbidden, keep_failover, failover_recovery
            )
            if checked.plan is None:
                self._expire(proposal, checked.problem or "", was=("approved",))
                continue
            note = f"{len(checked.plan.moves)} migrations handed to the executor"
            if self.history.settle_proposal(proposal.id, "started", was=("approved",), note=note):
                log.info(
                    "proposal %s approved by %s: checked again, starting %s",
                    proposal.id,
                    proposal.by,
                    "; ".join(m.label() for m in proposal.chosen_moves()),
                )
                return proposal, checked.plan
        return None

    def _expire(self, proposal: ProposalRecord, why: str, *, was: tuple[str, ...]) -> None:
        if self.history.settle_proposal(proposal.id, "expired", was=was, note=why):
            log.warning("proposal %s expired: %s", proposal.id, why)
