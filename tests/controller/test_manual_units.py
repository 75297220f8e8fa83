"""Manual mode's pieces: the ``automatic`` key, the history's proposals (and the upgrade of a
version 4 file), and the re-check of an approved proposal on a changed cluster."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from fakes import FakeBackend, FakeClock, guest, node
from fakes import cluster as fake_cluster
from opendrs.controller.approval import recheck
from opendrs.controller.config import BackendConfig, Config, ConfigError, parse_config
from opendrs.controller.history import History
from opendrs.controller.history_file import SCHEMA_VERSION, UPGRADES
from opendrs.controller.loop import Controller
from opendrs.controller.proposals import ProposalRecord, ProposedMove, proposal_id
from opendrs.engine.policy import PolicyConfig
from opendrs.model.cluster import Cluster, Guest, Node

BACKEND = {"backend": {"type": "file", "path": "c.yaml"}}


def test_manual_mode_and_automatic_are_read() -> None:
    config = parse_config({**BACKEND, "mode": "manual"})
    assert config.mode == "manual" and config.migrates and not config.active
    assert config.automatic == ("maintenance", "return", "repair")
    assert config.acts_alone("repair") and not config.acts_alone("balance")
    config = parse_config({**BACKEND, "mode": "manual", "automatic": []})
    assert not config.acts_alone("repair")
    shadow = parse_config({**BACKEND, "automatic": ["balance"]})
    assert not shadow.migrates and not shadow.acts_alone("balance")
    assert parse_config({**BACKEND, "mode": "active", "automatic": []}).acts_alone("balance")


@pytest.mark.parametrize(
    ("automatic", "reason"),
    [
        (["balance", "balance"], r"automatic\[1\]: balance is listed twice"),
        (["repairs"], "automatic\\[0\\]: unknown value 'repairs' \\(did you mean 'repair'\\?\\)"),
        ("repair", "automatic: expected a list"),
    ],
)
def test_a_bad_automatic_is_one_line(automatic: object, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_config({**BACKEND, "mode": "manual", "automatic": automatic})


def test_proposal_ttl_is_read_with_an_hour_by_default() -> None:
    assert parse_config({**BACKEND, "mode": "manual"}).proposal_ttl == 3600
    config = parse_config({**BACKEND, "mode": "manual", "proposal_ttl": "2h 30m"})
    assert config.proposal_ttl == 9000 and "expires after 2h 30m" in config.manual_words()
    with pytest.raises(ConfigError, match=r"proposal_ttl: must be at least 1s, got 0$"):
        parse_config({**BACKEND, "mode": "manual", "proposal_ttl": 0})


def _decision(h: History, at: float, mode: str = "manual") -> int:
    return h.record_decision(
        at=at,
        cluster="lab",
        mode=mode,  # type: ignore[arg-type]
        policy="balance",
        action="plan",
        reason="r",
        imbalance=0.4,
        predicted=0.1,
        summary={},
        plan=[],
    )


def _proposal(decision: int, at: float = 10.0) -> ProposalRecord:
    moves = (ProposedMove("101", "web", "a", "b"), ProposedMove("102", "", "a", "c"))
    return ProposalRecord(proposal_id(at, moves), decision, at, "balance", "r", 0.4, 0.1, moves)


def test_proposals_are_kept_settled_once_and_pruned(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        first = _proposal(_decision(h, 10.0))
        h.add_proposal(first)
        h.add_proposal(first)  # the same one again: kept once
        assert [p.id for p in h.proposals("open")] == [first.id]
        assert h.settle_proposal(first.id, "approved", by="ann@cli", decided=5.0, chosen=[2])
        assert not h.settle_proposal(first.id, "rejected")  # no longer open
        second = replace(_proposal(_decision(h, 20.0), at=20.0), kind="repair")
        h.add_proposal(second)
    with History(path, readonly=True) as h:  # a restart finds them as they were
        approved, still_open = h.proposals()
        assert approved.state == "approved" and approved.by == "ann@cli"
        assert approved.chosen_moves() == (ProposedMove("102", "", "a", "c"),)
        assert approved.moves[0].label() == "web (101) a → b"
        assert still_open.id == second.id and still_open.state == "open"
    with History(path) as h:
        third = replace(second, id="0000cafe", at=30.0)
        h.add_proposal(third)  # another repair supersedes the open one
        states = {p.id: (p.state, p.note) for p in h.proposals()}
        assert states[second.id] == ("expired", "superseded by proposal 0000cafe")
        pruned = h.prune(25.0)
        assert pruned["proposals"] == 2 and [p.id for p in h.proposals()] == ["0000cafe"]


def test_a_version_4_file_is_upgraded_with_its_decisions_and_migrations(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for step in UPGRADES[:4]:
        for statement in step:
            db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    db.execute(
        "INSERT INTO decisions (id, at, cluster, mode, policy, action, reason, moves, summary, "
        "plan, code) VALUES (7, 1.0, 'lab', 'active', 'p', 'plan', 'r', 1, '{}', '[]', 'plan')"
    )
    db.execute(
        "INSERT INTO migrations (decision, guest, source, target, handle, started) "
        "VALUES (7, '101', 'a', 'b', 't', 1.0)"
    )
    db.close()
    with History(path) as h:
        assert [d.id for d in h.decisions()] == [7]
        assert [m.decision for m in h.in_flight()] == [7]
        _decision(h, 2.0, mode="manual")
        with pytest.raises(Exception, match="FOREIGN KEY"):
            h.add_proposal(_proposal(99))  # no decision 99: the foreign keys hold again
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    db.close()


def _cluster(placement: dict[str, str]) -> Cluster:
    nodes = tuple(Node(n, cpu=8, memory=32 * 2**30) for n in ("a", "b", "c"))
    guests = tuple(
        Guest(g, node=n, cpu=2, memory=4 * 2**30, cpu_used=1.5, memory_used=3 * 2**30)
        for g, n in placement.items()
    )
    return Cluster(nodes=nodes, guests=guests)


def test_recheck_starts_what_still_holds_and_says_why_not() -> None:
    proposal = _proposal(1)
    packed = _cluster({"101": "a", "102": "a", "103": "a"})
    checked = recheck(proposal, packed, "spread", frozenset())
    assert checked.problem is None and checked.plan is not None
    assert {(m.guest, m.target) for m in checked.plan.moves} == {("101", "b"), ("102", "c")}
    moved = _cluster({"101": "c", "102": "a", "103": "a"})
    assert recheck(proposal, moved, "spread", frozenset()).problem == (
        "web (101) a → b: the guest is on c now"
    )
    guarded = recheck(proposal, packed, "spread", frozenset({("102", "c")}))
    assert guarded.problem == "102 a → c: the guards keep the guest off c now"
    spread = _cluster({"101": "a", "102": "a", "103": "b", "104": "c", "105": "b", "106": "c"})
    worse = recheck(replace(proposal, chosen=(1,)), spread, "spread", frozenset())
    assert worse.problem == "these moves would now raise the imbalance from 0.0 pp to 37.5 pp"


def test_recheck_starts_a_part_that_leaves_the_spread_and_does_not_spread_the_load() -> None:
    # d busiest, c and e idle: moves between a, b and c touch neither the max nor the min.
    nodes = tuple(Node(n, cpu=8, memory=32 * 2**30) for n in "abcde")
    placement = {"101": "a", "102": "a", "103": "b", "104": "b"}
    placement |= {g: "d" for g in ("201", "202", "203", "204")}
    guests = tuple(
        Guest(g, node=n, cpu=2, memory=4 * 2**30, cpu_used=1.5, memory_used=3 * 2**30)
        for g, n in placement.items()
    )
    cluster = Cluster(nodes=nodes, guests=guests)
    moves = (
        ProposedMove("101", "web", "a", "c"),
        ProposedMove("102", "db", "a", "b"),
        ProposedMove("201", "", "d", "e"),
    )
    proposal = ProposalRecord(proposal_id(1.0, moves), 1, 1.0, "balance", "r", 0.4, 0.2, moves)
    evener = recheck(replace(proposal, chosen=(1,)), cluster, "spread", frozenset())
    assert evener.problem is None and evener.plan is not None
    assert [(m.guest, m.target) for m in evener.plan.moves] == [("101", "c")]
    uneven = recheck(replace(proposal, chosen=(2,)), cluster, "spread", frozenset())
    assert uneven.problem == (
        "these moves would now spread the load more unevenly: its σ from 22.2 pp to 24.1 pp "
        "(the imbalance stays 75.0 pp)"
    )
    lower = recheck(replace(proposal, chosen=(3, 1)), cluster, "spread", frozenset())
    assert lower.problem is None and lower.plan is not None
    # All the moves of a proposal must still lower the imbalance, as they did when proposed.
    alone = replace(proposal, moves=moves[:1])
    assert recheck(alone, cluster, "spread", frozenset()).problem == (
        "the moves no longer lower the imbalance (75.0 pp now, 75.0 pp after)"
    )


def test_recheck_starts_a_balancing_proposal_that_gives_failover_headroom_back() -> None:
    # If a fails, db (101) of 20 GiB fits nowhere; scratch (103) to a makes room for it on c.
    # The move raises the imbalance: only keep_failover's headroom lets it start.
    nodes = tuple(Node(n, cpu=8, memory=32 * 2**30) for n in ("a", "b", "c"))
    guests = tuple(
        Guest(g, node=n, cpu=1, memory=gib * 2**30, ha=ha, uptime=86_400)
        for g, n, gib, ha in (
            ("101", "a", 20, True),
            ("102", "b", 20, True),
            ("103", "c", 10, False),
            ("104", "c", 4, True),
        )
    )
    short = Cluster(nodes=nodes, guests=guests)
    moves = (ProposedMove("103", "scratch", "c", "a"),)
    proposal = ProposalRecord(proposal_id(1.0, moves), 1, 1.0, "balance", "r", 0.2, 0.2, moves)
    plain = recheck(proposal, short, "spread", frozenset())
    assert plain.problem is not None and plain.problem.startswith("the moves no longer lower")
    kept = recheck(proposal, short, "spread", frozenset(), keep_failover=1)
    assert kept.problem is None and kept.plan is not None
    assert [(m.guest, m.target) for m in kept.plan.moves] == [("103", "a")]
    moved = Cluster(
        nodes=nodes, guests=tuple(replace(g, node="b") if g.id == "104" else g for g in guests)
    )
    # Already covered (104 gone to b): the move gives nothing back, and is refused.
    again = recheck(proposal, moved, "spread", frozenset(), keep_failover=1)
    assert again.problem is not None and again.problem.endswith(
        "nor bring the failover headroom closer"
    )
    # The same move chosen alone from a proposal of two: held to the same headroom.
    pair = replace(proposal, moves=(*moves, ProposedMove("102", "", "b", "c")), chosen=(1,))
    assert recheck(pair, short, "spread", frozenset(), keep_failover=1).problem is None
    refused = recheck(pair, moved, "spread", frozenset(), keep_failover=1).problem
    assert refused is not None and refused.startswith("these moves would now raise the imbalance")
    assert refused.endswith("; they would not bring the failover headroom closer")


def test_http_write_is_off_by_default_and_never_without_a_token() -> None:
    http = {"listen": "127.0.0.1:0"}
    config = parse_config({**BACKEND, "http": http})
    assert config.http is not None and not config.http.write
    with pytest.raises(ConfigError, match=r"http\.write: needs http\.token_file"):
        parse_config({**BACKEND, "http": {**http, "write": True}})
    config = parse_config(
        {**BACKEND, "http": {**http, "write": True, "token_file": "t", "token_name": "ops"}}
    )
    assert config.http is not None and config.http.write and config.http.token_name == "ops"


# -- the controller in manual mode, on the scripted backend -------------------------------------


def _manual(automatic: tuple[str, ...] = ("maintenance", "return", "repair")) -> Config:
    policy = PolicyConfig(interval=60, hold=1, smoothing=0, min_uptime=0, maintenance_return=True)
    return Config(
        file="<test>",
        backend=BackendConfig("file", path="x"),
        history=":memory:",
        lock="",
        mode="manual",
        automatic=automatic,
        policy=policy,
    )


def _maintenance_cluster() -> Cluster:
    guests = [guest("x", "a", memory_gib=2, used=0.5), guest("y", "b", memory_gib=2, used=0.5)]
    guests += [guest("m", "c", memory_gib=2, used=0.5), guest("k", "c", memory_gib=2, used=0.5)]
    return fake_cluster([node("a"), node("b"), node("c")], guests)


def test_manual_mode_evacuates_and_returns_on_its_own_by_default() -> None:
    clock = FakeClock()
    fake = FakeBackend(_maintenance_cluster(), clock)
    history = History(":memory:")
    fake.set_maintenance("c", True)
    Controller(_manual(), fake, clock, history).run(once=True)
    assert {g.node for g in fake.cluster.guests if g.id in "mk"} <= {"a", "b"}
    fake.set_maintenance("c", False)
    clock.sleep(60)
    Controller(_manual(), fake, clock, history).run(once=True)
    assert {g.node for g in fake.cluster.guests if g.id in "mk"} == {"c"}
    assert history.proposals() == [] and {d.mode for d in history.decisions()} == {"manual"}


def test_manual_mode_without_automatic_proposes_the_evacuation() -> None:
    clock = FakeClock()
    fake = FakeBackend(_maintenance_cluster(), clock)
    history = History(":memory:")
    fake.set_maintenance("c", True)
    Controller(_manual(automatic=()), fake, clock, history).run(once=True)
    assert fake.starts == []
    (proposal,) = history.proposals("open")
    assert proposal.kind == "maintenance" and {m.guest for m in proposal.moves} == {"m", "k"}
    history.settle_proposal(proposal.id, "approved", by="test@cli", decided=0.0)
    clock.sleep(60)
    Controller(_manual(automatic=()), fake, clock, history).run(once=True)
    assert {g.node for g in fake.cluster.guests if g.id in "mk"} <= {"a", "b"}
    assert [p.state for p in history.proposals()] == ["started"]
    assert {m.decision for m in history.migrations()} == {proposal.decision}
