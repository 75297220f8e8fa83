"""The benchmark's method cases: generated clusters as proxlb-solver scenarios (``method: memory``),
the default strategy on them, and the targets against the memory-only lower bound."""

from __future__ import annotations

import pytest
from bench.__main__ import main
from bench.generate import generate
from bench.metrics import Evaluation, Snapshot
from bench.report import MethodCase, Row, method_section, method_target
from bench.scenario import scenario_cluster, scenario_document
from bench.worker import Spec, case_cluster

from opendrs.compat.proxlb import scenario_from_dict


def test_the_scenario_is_the_generated_cluster_balancing_memory() -> None:
    generated = generate("S", seed=2, rules=True)
    document = scenario_document(generated, "memory")
    assert document["balancing"] == {"method": "memory", "balanciness": 4, "cpu_overcommit": 4.0}
    imported = scenario_from_dict(document).cluster
    assert [(n.name, n.cpu, n.memory) for n in imported.nodes] == [
        (n.name, n.cpu, n.memory) for n in generated.nodes
    ]
    assert [(g.id, g.node, g.cpu, g.memory, g.cpu_used) for g in imported.guests] == [
        (g.id, g.node, g.cpu, g.memory, g.cpu_used) for g in generated.guests
    ]
    assert {(r.guests, r.positive) for r in imported.rules.guest_affinity} == {
        (r.guests, r.positive) for r in generated.rules.guest_affinity
    }
    pins = {r.guests[0]: set(r.nodes) for r in imported.rules.node_affinity}
    assert pins == {r.guests[0]: set(r.nodes) for r in generated.rules.node_affinity}
    settings = imported.settings
    assert (settings.mode, settings.weight_cpu, settings.weight_memory) == ("static", 0.0, 1.0)
    assert settings.cpu_overcommit == generated.settings.cpu_overcommit
    with pytest.raises(ValueError, match="method"):
        scenario_document(generated, "balance")


def test_a_spec_with_a_method_builds_the_scenario_cluster() -> None:
    spec = Spec("S", 1, False, "strategy", "balance", method="memory")
    assert Spec.from_json(spec.to_json()) == spec
    assert case_cluster(spec).settings.weight_cpu == 0.0
    assert case_cluster(Spec("S", 1, False, "strategy", "balance")).settings.weight_cpu == 1.0
    assert scenario_cluster("S", seed=1, method="cpu").settings.weight_memory == 0.0


def _row(spread: float, migrations: int, bound: int | None) -> Row:
    evaluation = Evaluation(
        after=Snapshot(memory_spread=spread, cpu_spread=0.5, cv=0.1),
        migrations=migrations,
        cost=0,
        moved_bytes=0,
        violations=(),
        lb_migrations=bound,
    )
    return Row("balance", "strategy", seconds=0.2, rss_peak=50 * 1024**2, evaluation=evaluation)


def test_targets_and_table() -> None:
    case = MethodCase("L", 32, 3000, False, "memory", 1, Snapshot(0.55, 1.0, 0.4))
    assert method_target(case, _row(0.0093, 148, 142)) is True
    assert method_target(case, _row(0.012, 148, 142)) is False  # spread above 1 pp
    assert method_target(case, _row(0.0093, 178, 142)) is False  # 1.254× the bound
    assert method_target(case, _row(0.0, 0, 0)) is True
    assert method_target(case, _row(0.0093, 148, None)) is None
    case.rows = [_row(0.0093, 148, 142), _row(0.0093, 190, 142)]
    text = method_section([case])
    assert "`method: memory`" in text and "LB (memory only)" in text
    assert "1.04×" in text and "1.34×" in text and "**missed**" in text
    assert "met in 1 of 2 rows" in text
    assert method_section([]) == ""


def test_the_command_line_runs_the_method_cases(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--sizes", "S", "--strategies", "none", "--peers", "none", "--rules", "without"]
    argv += ["--no-reading", "--no-endtoend", "--no-startup", "--no-growth", "--no-hot-months"]
    assert main([*argv, "--method-seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "proxlb-solver scenarios, `method: memory`" in out
    assert "| S    | without | 1    | balance |" in out
    assert main([*argv, "--methods", "none"]) == 0
    assert "method: memory" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--methods", "disk"])
