"""``balance``'s move limit (``max_moves``): the plan never has more migrations than it, and a
limit the plan made without one fits gives no longer plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import GiB, clusters
from opendrs.engine.policy.repair import repair
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.repair import ExactRepairMemo
from opendrs.engine.strategies.balance.strategy import _search, propose_balance
from opendrs.engine.strategies.base import constraints_for
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules
from opendrs.model.snapshot import dump
from opendrs.report.words import stop_words

ROOT = Path(__file__).resolve().parents[3]


def _generated(generator: str, seed: int) -> Cluster:
    """The benchmarks' ``generator`` shape at S, with rules."""
    if str(ROOT) not in sys.path:  # however pytest is started
        sys.path.insert(0, str(ROOT))
    from bench.clusters import generated

    return generated(generator, "S", seed=seed, rules=True)


def _pairs() -> Cluster:
    """Two pairs of guests kept together on ``a``, nothing but a little on ``b``: a pair is
    one step of the search and two migrations."""
    nodes = (Node("a", 16, 64 * GiB), Node("b", 16, 64 * GiB))
    guests = (
        *(Guest(name, "a", cpu=2, memory=8 * GiB) for name in ("x1", "x2", "y1", "y2")),
        Guest("z", "b", cpu=2, memory=4 * GiB),
    )
    pairs = (
        GuestAffinity("x", ("x1", "x2"), positive=True),
        GuestAffinity("y", ("y1", "y2"), positive=True),
    )
    return Cluster(nodes, guests, Rules(guest_affinity=pairs), Settings())


def _many_pairs(count: int, *, maintenance: bool = False) -> Cluster:
    """``count`` pairs of guests kept together on ``a`` (in maintenance where asked), ``b`` and
    ``c`` nearly empty: every step of the search moves a pair, two migrations."""
    nodes = (
        Node("a", 64, 256 * GiB, maintenance=maintenance),
        Node("b", 64, 256 * GiB),
        Node("c", 64, 256 * GiB),
    )
    guests: list[Guest] = [Guest("z", "b", cpu=1, memory=1 * GiB)]
    rules: list[GuestAffinity] = []
    for i in range(count):
        pair = (f"p{i}a", f"p{i}b")
        guests += [Guest(name, "a", cpu=2, memory=8 * GiB) for name in pair]
        rules.append(GuestAffinity(f"r{i}", pair, positive=True))
    return Cluster(nodes, tuple(guests), Rules(guest_affinity=tuple(rules)), Settings())


def _plan_migrations(cluster: Cluster, tmp_path: Path, most: int) -> int:
    """The migrations ``opendrs plan --max-moves most`` proposes for ``cluster``."""
    path = tmp_path / "cluster.yaml"
    dump(cluster, path)
    command = [sys.executable, "-m", "opendrs", "plan", str(path), "--max-moves", str(most)]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.check_output([*command, "--format", "json"], text=True, cwd=ROOT, env=env)
    return int(json.loads(out)["migrations"])


def test_a_pair_of_guests_is_two_migrations_of_the_limit(tmp_path: Path) -> None:
    # Without a limit both guests of one pair move; with a limit of one migration, neither.
    assert len(propose_balance(_pairs()).moves) == 2
    assert _plan_migrations(_pairs(), tmp_path, 1) == 0
    assert _plan_migrations(_pairs(), tmp_path, 2) == 2


@pytest.mark.parametrize("most", [2, 3, 4, 6, 8])
def test_a_limit_over_pairs_moves_as_many_pairs_as_fit(most: int) -> None:
    # Every step a pair: a limit of 2k migrations proposes k pairs (not none).
    proposal = propose_balance(_many_pairs(12), BalanceOptions(max_moves=most))
    assert len(proposal.moves) == most - most % 2


@pytest.mark.parametrize("batch", [2, 4, 6])
def test_a_small_batch_drains_pairs_off_a_node_in_maintenance(batch: int) -> None:
    # The daemon's repair in batches: each batch moves whole pairs off the node.
    done = repair(_many_pairs(6, maintenance=True), batch=batch)
    assert done.plan is not None and len(done.plan.moves) == batch
    assert all(move.source == "a" and move.target != "a" for move in done.plan.moves)


def test_plan_with_a_limit_over_pairs(tmp_path: Path) -> None:
    assert _plan_migrations(_many_pairs(6), tmp_path, 4) == 4


@pytest.mark.parametrize(
    ("generator", "seed", "most"),
    [("hot-rack", 8, 6), ("mixed", 4, 19), ("mixed", 1, 26), ("new-node", 7, 18)],
)
def test_a_limit_the_plan_fits_gives_no_longer_plan(generator: str, seed: int, most: int) -> None:
    # The search counts its steps, moves it undoes later among them: the limit cut it short of
    # its goals, with more migrations than the plan made without the limit (which fits it).
    cluster = _generated(generator, seed)
    unlimited = propose_balance(cluster)
    assert len(unlimited.moves) <= most
    limited = propose_balance(cluster, BalanceOptions(max_moves=most))
    assert len(limited.moves) <= len(unlimited.moves)


def test_plan_with_a_limit_the_plan_fits(tmp_path: Path) -> None:
    cluster = _generated("mixed", 4)
    unlimited = propose_balance(cluster)
    most = len(unlimited.moves) + 1
    assert _plan_migrations(cluster, tmp_path, most) <= len(unlimited.moves)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_nodes=6, max_guests=24), st.integers(0, 8), st.sampled_from([0.0, 1.3, 1e6]))
def test_a_tighter_limit_never_gives_a_longer_plan(
    cluster: Cluster, more: int, price: float
) -> None:
    # A limit never exceeded; one the plan without it fits gives no longer plan.
    unlimited = propose_balance(cluster, BalanceOptions(cpu_commit_moves=price))
    most = max(len(unlimited.moves) + more - 4, 0)
    limited = propose_balance(cluster, BalanceOptions(max_moves=most, cpu_commit_moves=price))
    assert len(limited.moves) <= most
    if len(unlimited.moves) <= most:
        assert len(limited.moves) <= len(unlimited.moves)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_nodes=6, max_guests=24), st.integers(1, 6))
def test_a_limit_the_first_step_fits_moves_at_least_it(cluster: Cluster, most: int) -> None:
    # Where the search's first step moves at most ``most`` guests, the capped search moves some.
    cons, loads = constraints_for(cluster), LoadModel.build(cluster)
    options = BalanceOptions(max_moves=most)
    memo = ExactRepairMemo()
    first = _search(cluster, cons, loads, options, shaped=True, memo=memo, steps=1)
    capped = _search(cluster, cons, loads, options, shaped=True, memo=memo)
    assert len(capped.proposal.moves) <= most
    if 0 < len(first.proposal.moves) <= most:
        assert capped.proposal.moves


def test_the_vcpu_goal_cut_by_the_limit_is_said_so() -> None:
    # With 8 migrations the plan towards 100 pp is cut short of every goal; the one that leaves
    # the vCPUs no wider than they started ends balanced with 6: it is proposed, saying so.
    proposal = propose_balance(_generated("hot-rack", 3), BalanceOptions(max_moves=8))
    assert proposal.stop is not None and proposal.stop.code == "balanced"
    assert len(proposal.moves) == 6
    assert proposal.stop.details["cpu_commit_limit"] == 8
    said = stop_words(proposal.stop)
    assert "no wider than they started (the limit of 8 migrations stopped the plan towards" in said
