"""Each stop code the engine gives is said in words (``report.words``), whatever its details;
a stop the policy cuts to its batch keeps the strategy's stop as its part."""

from __future__ import annotations

import pytest

from opendrs.backends.simgen import demo_cluster
from opendrs.engine.policy.decision import (
    Decision,
    Measurement,
    NoProposal,
    Planned,
    Returned,
    Trigger,
)
from opendrs.engine.policy.planning import truncate
from opendrs.engine.policy.state import PolicyState
from opendrs.engine.policy.why import WhyNot
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.base import STOP_CODES, Proposal, Stop
from opendrs.report import words
from opendrs.report.reasons import explain
from opendrs.report.words import decision_words, stop_sentence, stop_words

#: A value for each detail a code may carry, as the engine gives them.
_VALUES: dict[str, float | str] = {
    "measure": "imbalance",
    "unit": "%",
    "scope": "ha",
    "guest": "101",
    "target": "pve2",
    "node": "pve1",
    "arch": "x86_64",
    "guests": "101 102",
    "thresholds": "cpu 80%",
    "reasons": "101 needs 64.0 GiB, no node has it",
    "metric": "spread",
    "limit": "batch",
    "strategy": "pve-topsis",
}


def _stop(code: str) -> Stop:
    details = {key: _VALUES.get(key, 3.0) for key in STOP_CODES[code]}
    return Stop(code, details)


def test_every_code_has_its_words_and_no_words_are_for_no_code() -> None:
    assert set(words._STOP_WORDS) == set(STOP_CODES)


@pytest.mark.parametrize("code", sorted(STOP_CODES))
def test_each_code_is_said_with_its_details(code: str) -> None:
    said = stop_words(_stop(code), lambda g: f"db ({g})")
    assert said and "{" not in said and ("_" not in code or code not in said)
    if "guest" in STOP_CODES[code] or "guests" in STOP_CODES[code]:
        assert "db (101)" in said


def _proposal(stop: Stop | None) -> Proposal:
    level = propose_balance(demo_cluster()).before
    return Proposal("x", (), level, level, "the engine's sentence", stop=stop)


def test_a_stop_without_a_code_or_with_an_unknown_one_is_the_engines_sentence() -> None:
    assert stop_sentence(_proposal(None)) == "the engine's sentence"
    assert stop_sentence(_proposal(Stop("from_a_newer_engine"))) == "the engine's sentence"
    inner = Stop("by_arch", {}, (Stop("unknown"),))
    assert stop_sentence(_proposal(inner)) == "the engine's sentence"


def test_the_parts_are_said_in_order_each_with_its_architecture() -> None:
    parts = (_stop("idle"), Stop("too_few_nodes", {"arch": "aarch64"}))
    said = stop_words(Stop("by_arch", {}, parts))
    assert said == (
        "x86_64: the busiest node, pve1, is idle; "
        "aarch64: fewer than 2 usable nodes: nothing to balance between"
    )


def test_a_proposal_cut_to_the_batch_keeps_why_the_strategy_stopped() -> None:
    cluster = demo_cluster()
    proposal = propose_balance(cluster)
    cut = truncate(cluster, proposal, 2)
    assert cut.stop is not None and cut.stop.code == "batch_cut"
    assert cut.stop.parts == (proposal.stop,)
    assert cut.stop.as_dict()["parts"] == [proposal.stop.as_dict()]
    assert {k: cut.stop.details[k] for k in ("kept", "limit", "batch")} == {
        "kept": 2,
        "limit": "batch",
        "batch": 2,
    }
    said = stop_sentence(cut)
    assert said.startswith(stop_sentence(proposal) + "; cut to 2 of ")
    assert said.endswith("migrations by the policy's batch of 2")


# -- a decision's reason in words ---------------------------------------------------------------


def _decision(facts: object) -> Decision:
    return Decision(facts, 0.3, None, None, None, frozenset(), PolicyState())  # type: ignore[arg-type]


_TRIGGER = Trigger(Measurement("spread", (("x86_64", 0.3),)), 0.15, 1, 1, "pve-topsis")
_BEST = Stop(
    "gain_below_margin",
    {
        "measure": "imbalance",
        "unit": "",
        "value": 0.3,
        "after": 0.29,
        "margin": 0.1,
        "guest": "101",
        "target": "pve2",
    },
)


def test_a_decision_says_where_the_strategy_stopped_in_words_and_the_engine_its_sentence() -> None:
    engine = "best move 101 -> pve2: imbalance 0.300 -> 0.290"
    facts = NoProposal(_TRIGGER, engine, WhyNot(3, 3, ()), _BEST)
    decision = _decision(facts)
    said = decision_words(decision, lambda g: {"101": "db (101)"}.get(g, g))
    assert (
        "strategy pve-topsis proposes no migration (the best move, db (101) to pve2, would "
        "bring the imbalance of the nodes' loads (their coefficient of variation) from 0.300 to "
        "0.290: less than the policy.options.margin 0.1 asks); 3 candidates, all may move"
    ) in said
    assert stop_words(_BEST).endswith("less than the --margin 0.1 asks")
    assert f"proposes no migration ({engine}); " in explain(decision)
    assert decision.as_dict()["stop"] == {"code": "gain_below_margin", **_BEST.details}


def test_an_acting_plan_says_its_stop_after_it_where_the_engine_says_nothing() -> None:
    cut = Stop(
        "batch_cut",
        {"kept": 2, "proposed": 5, "limit": "batch", "batch": 2},
        (Stop("passes_done", {"passes": 1}),),
    )
    limit = _decision(Planned(_TRIGGER, 3, 0.2, "move limit 3", stop=_stop("move_limit")))
    assert decision_words(limit).endswith(
        "(the limit of 3 migrations (policy.batch, or what the budget leaves) stopped the search)"
    )
    decision = _decision(Planned(_TRIGGER, 2, 0.2, "1 pass; cut to 2 of 5", stop=cut))
    assert explain(decision).endswith("plan brings it to 20.0 pp with 2 migrations")
    assert decision_words(decision).endswith(
        "with 2 migrations (1 pass over the guests done; cut to 2 of 5 migrations by the "
        "policy's batch of 2)"
    )
    back = _decision(Returned(2, ("pve1",), Stop("returned", {"migrations": 2})))
    assert decision_words(back) == (
        "2 guests back to pve1, out of maintenance, bypassing threshold, hold and margin "
        "(the evacuated guests go back to their nodes after maintenance)"
    )


def test_a_stop_with_no_words_leaves_the_engines_sentence() -> None:
    facts = Planned(_TRIGGER, 2, None, "the engine's own", stop=Stop("not-a-code"))
    assert decision_words(_decision(facts)).endswith("it proposes 2 migrations (the engine's own)")
