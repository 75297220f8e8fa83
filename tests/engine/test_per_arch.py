"""A cluster of several CPU architectures is balanced per architecture (issue #12 part 4).

Guests cannot move between architectures: the metric, the threshold, the bounds and what `show`
and `plan` report are the architecture groups', never the pooled nodes'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opendrs.cli.main import main
from opendrs.engine.bounds import lower_bounds
from opendrs.engine.policy import PastMigrations, PolicyConfig, PolicyState, decide, measure
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.model.snapshot import load
from opendrs.report.reasons import explain

EAGER = PolicyConfig(hold=1, margin=0.0, cooldown=0, no_return=0, min_uptime=0, smoothing=0)


def _snapshot(x2: str = "x2") -> str:
    """x86_64 nodes at 37.5 % memory, aarch64 nodes at 12.5 %: each group balanced, the pooled
    spread 25 pp. With ``x2="x1"``, the x86_64 group holds all its guests on x1."""
    guests = []
    for i in range(6):
        node = "x1" if i < 3 else x2
        guests.append(f"  - {{id: {100 + i}, node: {node}, cpu: 2, memory: 8GiB, uptime: 1d}}")
    for i in range(2):
        node = "a1" if i < 1 else "a2"
        guests.append(f"  - {{id: {200 + i}, node: {node}, cpu: 2, memory: 8GiB, uptime: 1d}}")
    return (
        "version: 1\nsettings: {mode: static, weights: {cpu: 0}}\nnodes:\n"
        "  x1: {cpu: 32, memory: 64GiB}\n  x2: {cpu: 32, memory: 64GiB}\n"
        "  a1: {cpu: 32, memory: 64GiB, arch: aarch64}\n"
        "  a2: {cpu: 32, memory: 64GiB, arch: aarch64}\nguests:\n" + "\n".join(guests) + "\n"
    )


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main([*argv, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def balanced(tmp_path: Path) -> Path:
    path = tmp_path / "balanced.yaml"
    path.write_text(_snapshot())
    return path


def test_each_architecture_balanced_is_a_balanced_cluster(
    balanced: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = load(balanced)
    assert measure(cluster, "spread") == pytest.approx(0.0)
    assert measure(cluster, "memory-spread") == pytest.approx(0.0)
    decision = decide(cluster, 0.0, EAGER, PolicyState(), PastMigrations(), busy=False)
    assert not decision.act and "at or below threshold" in explain(decision)
    assert lower_bounds(cluster).spread["memory"] == pytest.approx(0.0)
    code, out = _json(capsys, "show", str(balanced))
    assert code == 0
    by_arch = out["imbalance_by_arch"]
    assert sorted(by_arch) == ["aarch64", "x86_64"]
    assert by_arch["x86_64"]["memory"]["spread"] == pytest.approx(0.0)
    assert by_arch["aarch64"]["memory"]["mean"] == pytest.approx(0.125)
    assert out["imbalance"]["memory"]["spread"] == pytest.approx(0.25)  # pooled, for reference
    code, out = _json(capsys, "plan", str(balanced))
    assert code == 0 and out["moves"] == []
    assert out["metrics"]["by_arch"]["x86_64"]["after"]["memory"]["spread"] == pytest.approx(0.0)
    main(["show", str(balanced)])
    text = capsys.readouterr().out
    assert "Imbalance: aarch64 nodes (balanced on their own)" in text


def test_the_unbalanced_architecture_is_named_and_balanced_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "skewed.yaml"
    path.write_text(_snapshot(x2="x1"))
    cluster = load(path)
    # x1 holds 48 GiB of guests on 64 GiB (static mode, memory only): 75 % against 0 %.
    assert measure(cluster, "memory-spread") == pytest.approx(0.75)
    decision = decide(cluster, 0.0, EAGER, PolicyState(), PastMigrations(), busy=False)
    assert "75.0 pp on x86_64 (aarch64 0.0 pp, x86_64 75.0 pp)" in explain(decision)
    proposal = propose_balance(cluster)
    assert {m.source for m in proposal.moves} == {"x1"}
    assert {m.target for m in proposal.moves} == {"x2"}
    assert len(proposal.net_moves()) == 3  # x1 and x2 even: 3 guests each
    bounds = lower_bounds(cluster, target_spread={"cpu": 0.0, "memory": 0.0})
    assert bounds.migrations == 3 and bounds.spread["memory"] == pytest.approx(0.0)
    code, out = _json(capsys, "plan", str(path))
    assert code == 0 and out["bounds"]["migrations"] == 3
    assert out["metrics"]["by_arch"]["aarch64"]["before"]["memory"]["spread"] == 0.0
