"""The end-to-end benchmark (bench/endtoend.py): real runs at size S, each in a fresh process.

The peers' runs skip when ProxLB or proxlb-solver (the ``bench`` extra) is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from bench.endtoend import (
    OPENDRS,
    Input,
    Result,
    Row,
    plan_placement,
    run,
    run_input,
    run_one,
    solver_placement,
    write_inputs,
)
from bench.endtoend_report import section, target_lines
from bench.metrics import Evaluation, Snapshot
from bench.process import Measured

from bench import __main__ as bench_main

MiB = 1024**2


def _measured_and_evaluated(row: Row) -> Evaluation:
    assert row.error is None, row.error
    assert row.measured is not None and row.measured.ok
    assert row.measured.wall > 0 and row.measured.cpu > 0
    assert row.measured.rss_peak is not None and row.measured.rss_peak > 20 * MiB
    assert row.evaluation is not None
    return row.evaluation


def test_opendrs_plan_end_to_end_on_both_forms(tmp_path: Path) -> None:
    results = run(["skewed"], ["S"], seed=2, peers=(), keep=tmp_path, timeout=300)
    assert [r.input.form for r in results] == ["snapshot", "scenario"]
    for result in results:
        assert [row.runner for row in result.rows] == [OPENDRS]
        evaluation = _measured_and_evaluated(result.rows[0])
        assert result.before is not None
        assert evaluation.migrations > 0 and not evaluation.violations
        assert evaluation.after.memory_spread < result.before.memory_spread / 10
        assert any(note.startswith("stopped: ") for note in result.rows[0].notes)
    text = section(results)
    assert "| skewed S, scenario" in text and "| opendrs plan " in text
    assert "no such input in this run" in text


def test_a_run_past_its_timeout_is_killed_and_shown_so(tmp_path: Path) -> None:
    item = write_inputs(tmp_path, "basic", "S", seed=1)[0]
    row, _out = run_one(OPENDRS, item, tmp_path, timeout=0.01)
    assert row.error == "killed after 0.01 s"
    assert row.measured is not None and row.measured.killed_after == 0.01
    result = Result(item, 1.0, rows=[row])
    assert f"| {OPENDRS}: killed after 0.01 s |" in section([result]).replace("  ", "")


def test_proxlb_greedy_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("proxlb")
    item = write_inputs(tmp_path, "basic", "S", seed=1)[0]
    result = run_input(item, ["proxlb-greedy", "proxlb-solver"], 300, tmp_path)
    assert [row.runner for row in result.rows] == [OPENDRS, "proxlb-greedy"]  # solver: scenarios
    evaluation = _measured_and_evaluated(result.rows[1])
    assert evaluation.migrations > 0
    assert "| proxlb-greedy |" in section([result]).replace("  ", "")


def _tiny_scenario(folder: Path) -> Input:
    """Two nodes, four VMs all on the first: proxlb-solver proves its optimum at once."""
    vms = {
        f"10{i}": {"node": "n1", "cpu": 2, "memory_gb": 4, "cpu_usage": 0.5, "type": "vm"}
        for i in range(4)
    }
    document = {
        "name": "tiny",
        "balancing": {"method": "memory", "balanciness": 4, "cpu_overcommit": 2.0},
        "nodes": {n: {"cpu_total": 16, "memory_total_gb": 64} for n in ("n1", "n2")},
        "vms": vms,
    }
    path = folder / "tiny" / "tiny.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return Input("hand-made", "S", "scenario", path, 4)


def test_proxlb_solver_cli_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("proxlb_solver")
    result = run_input(_tiny_scenario(tmp_path), ["proxlb-solver"], 300, tmp_path)
    solver = result.row("proxlb-solver")
    assert solver is not None
    evaluation = _measured_and_evaluated(solver)
    assert evaluation.migrations == 2 and evaluation.after.memory_spread == 0.0
    assert solver.notes[0] == "status OPTIMAL"
    assert "wall/solver" in section([result])


def test_the_solver_report_and_the_plan_are_read_back() -> None:
    report = "\n".join(
        [
            "- Status: **FEASIBLE** | Solve time: 60.0s",
            "#### Node Utilization",
            "| n1 | 50.0% | 40.0% |",
            "#### Migrations",
            "",
            "| VM | From | To | Priority | Rule Origin |",
            "|----|------|----|----------|-------------|",
            "| 101 | n1 | n2 | 2 | none |",
            "| 102 | n1 | n3 | 2 | none |",
            "",
            "#### Execution Plan",
            "- 101: n1 → n2",
        ]
    )
    assert solver_placement(report) == ({"101": "n2", "102": "n3"}, ["status FEASIBLE"])
    moves = [  # 7 parks on n3 and comes back: it does not move in the end
        {"guest": "7", "source": "n1", "target": "n3", "step": 1, "parking": True},
        {"guest": "8", "source": "n1", "target": "n2", "step": 1, "parking": False},
        {"guest": "7", "source": "n3", "target": "n1", "step": 2, "parking": False},
    ]
    plan = {"moves": moves, "stopped": "balanced", "plan": {"steps": 2, "feasible": True}}
    placement, notes = plan_placement(json.dumps(plan))
    assert placement == {"8": "n2"} and notes == ["stopped: balanced", "2 steps"]


def _at_xxl(wall: float, rss_mib: int) -> Result:
    item = Input("basic", "XXL", "snapshot", Path("x.yaml"), 100_000)
    measured = Measured(wall, wall, rss_mib * MiB, 0)
    return Result(item, 12.0, Snapshot(0.5, 0.5, 0.3), [Row(OPENDRS, measured)])


def test_the_targets_at_100000_guests() -> None:
    assert "**met**; peak RSS 900 MiB (≤ 1,536) **met**" in target_lines([_at_xxl(19.0, 900)])[0]
    missed = target_lines([_at_xxl(31.0, 1600)])[0]
    assert "wall 31.0 s (≤ 20 s) **not met**" in missed and "1,600 MiB" in missed
    assert missed.endswith("**not met**")


def test_the_benchmark_runs_the_section(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asked: list[tuple[list[str], list[str], list[str], float]] = []

    def fake_run(generators, sizes, *, seed, peers, timeout):  # type: ignore[no-untyped-def]
        asked.append((generators, sizes, peers, timeout))
        return [_at_xxl(19.0, 900)]

    monkeypatch.setattr(bench_main, "run_endtoend", fake_run)
    argv = ["--sizes", "S", "--strategies", "none", "--peers", "none", "--methods", "none"]
    argv += ["--no-reading", "--no-startup", "--incus", "none", "--generator", "skewed"]
    argv += ["--no-hot-months"]
    argv_json = [*argv, "--json", str(tmp_path / "out.json")]
    assert bench_main.main([*argv_json, "--endtoend-sizes", "XXL", "--endtoend-timeout", "60"]) == 0
    assert asked == [(["skewed"], ["XXL"], [], 60.0)]
    assert "### End to end" in capsys.readouterr().out
    row = json.loads((tmp_path / "out.json").read_text())[-1]["endtoend"]["rows"][0]
    assert row["runner"] == OPENDRS and row["measured"]["wall"] == 19.0
    assert bench_main.main([*argv, "--no-endtoend"]) == 0
    assert len(asked) == 1
    with pytest.raises(SystemExit):
        bench_main.main([*argv, "--endtoend-sizes", "XXXL"])
