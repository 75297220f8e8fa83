"""bench.hotspots (issue #30, item 5): each policy's hot minutes per scenario and the target's
verdict, on a tiny generated month (4 nodes, 20 guests, 12 hours) and on made-up reports."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bench.hotspots import COLUMNS, POLICIES, HotMonth, overall, run, section
from bench.pareto import load_store, save_store, seed_list

from bench import __main__ as bench_main
from bench import hotspots
from opendrs.backends.generated import generated_scenario

TINY = "generated:10 (4 nodes, 20 guests, 12 h)"


def _tiny() -> Any:
    return replace(generated_scenario(10, 4, 20), duration=12 * 3600.0)


def _report(hot: float, worst: float = 0.0, ping_pongs: int = 0, migrations: int = 10) -> Any:
    return {
        "hot": 0.85,
        "hot_node_minutes": hot,
        "max_hot_minutes_per_node": worst,
        "ping_pongs": ping_pongs,
        "migrations": migrations,
        "capacity_violations": 0,
    }


def _month(opendrs: Any, **peers: Any) -> HotMonth:
    reports = {"opendrs": opendrs, "proxmox": _report(50.0), "incus": _report(10.0)}
    return HotMonth("generated:1", {**reports, "proxlb": _report(20.0), **peers})


def test_the_table_and_the_verdict_are_the_runs(tmp_path: Path) -> None:
    store = tmp_path / "runs.json"
    months = run([(TINY, _tiny)], {}, store)
    reports = months[0].reports
    assert list(reports) == list(POLICIES) == ["opendrs", "proxmox", "incus", "proxlb"]
    assert {r["policy"] for r in reports.values()} == set(POLICIES)
    assert all(r["days"] == 0.5 for r in reports.values())
    text = section(months)
    for name, r in reports.items():
        cells = " | ".join(f"{r[key]:,.0f}" for _head, key in COLUMNS)
        shown = "**opendrs**" if name == "opendrs" else name
        assert f"| {TINY} | {shown} | {cells} |" in text.splitlines()
    ours = reports["opendrs"]
    fewest = min(r["hot_node_minutes"] for r in reports.values())
    met = ours["hot_node_minutes"] <= fewest and ours["ping_pongs"] == 0
    assert months[0].met is met
    assert f"- {'met' if met else '**missed**'}: {TINY}: opendrs " in text
    # Every run is in the store as it ended; a second measurement reuses them, running none.
    as_json = json.loads(json.dumps(reports))
    assert json.loads(store.read_text()) == {TINY: as_json}
    again = run([(TINY, _no_build)], load_store(store), None)
    assert again[0].reports == as_json and section(again) == text


def _no_build() -> Any:
    raise AssertionError("a stored run was run again")


def test_opendrs_not_the_fewest_is_missed() -> None:
    month = _month(_report(12.0, 8.0))
    assert not month.met
    assert month.verdict() == (
        "- **missed**: generated:1: opendrs 12 hot node-min (proxmox 50, incus 10, proxlb 20), "
        "0 ping-pongs"
    )
    assert overall([month]) == (
        "- **missed**: every scenario: on 0 of 1 scenarios (missed on generated:1)"
    )


def test_a_tie_is_the_fewest_but_a_ping_pong_misses() -> None:
    tied = _month(_report(10.0))
    assert tied.met and tied.verdict().startswith("- met: generated:1: opendrs 10 hot node-min")
    assert not _month(_report(0.0, ping_pongs=1)).met
    assert _month(_report(0.0)).met
    months = [tied, replace(_month(_report(12.0)), scenario="generated:2")]
    assert overall(months) == (
        "- **missed**: every scenario: on 1 of 2 scenarios (missed on generated:2)"
    )
    assert overall([tied, tied]) == "- met: every scenario: on 2 of 2 scenarios"
    text = section(months)
    assert "| generated:2 | **opendrs** | 12 | 0 | 0 | 10 | 0 |" in text
    assert "| generated:1 | incus | 10 | 0 | 0 | 10 | 0 |" in text
    assert text.rstrip().endswith(overall(months))


_ARGV = ["--sizes", "none", "--methods", "none", "--incus", "none", "--no-reading"]
_ARGV += ["--no-endtoend", "--no-growth", "--no-startup"]


def test_the_benchmark_runs_the_stage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asked: list[tuple[list[str], Any, Path | None]] = []

    def fake_run(builds: Any, stored: Any, store: Path | None) -> list[HotMonth]:
        asked.append(([label for label, _build in builds], stored, store))
        return [_month(_report(12.0))]

    monkeypatch.setattr(bench_main, "run_hot", fake_run)
    store, out = tmp_path / "runs.json", tmp_path / "out.json"
    store.write_text(json.dumps({"generated:7": {"opendrs": _report(1.0)}}))
    argv = [*_ARGV, "--hot-seeds", "7,3", "--hot-store", str(store), "--json", str(out)]
    assert bench_main.main(argv) == 0
    assert asked == [
        (["builtin:month", "generated:7", "generated:3"], json.loads(store.read_text()), store)
    ]
    assert "- **missed**: every scenario: on 0 of 1" in capsys.readouterr().out
    written = json.loads(out.read_text())[-1]["hot_months"]
    assert written["scenario"] == "generated:1" and written["met"] is False
    assert written["reports"]["incus"]["hot_node_minutes"] == 10.0
    assert bench_main.main([*_ARGV, "--no-hot-months", "--hot-seeds", "x"]) == 0
    assert len(asked) == 1
    assert bench_main.build_parser().parse_args([]).hot_seeds == "1,89,97"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--hot-seeds", "1,x"], "--hot-seeds: expected whole numbers"),
        (["--hot-seeds=-5"], "--hot-seeds: a seed is a whole number of 0 or more"),
        (["--hot-store", "BAD"], "--hot-store: "),
        (["--hot-store", "/nonexistent/dir/runs.json"], "cannot write there"),
    ],
)
def test_bad_hot_months_input_is_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exited:
        bench_main.main([*_ARGV, *(str(bad) if a == "BAD" else a for a in argv)])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_command_refuses_no_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        hotspots.main(["--no-month", "--seeds", "none"])
    assert exited.value.code == 2
    assert "no scenario" in capsys.readouterr().err


def test_seeds_are_each_run_once() -> None:
    assert seed_list("7,3,7, 3") == [7, 3] and seed_list("none") == []


def test_the_store_is_replaced_whole(tmp_path: Path) -> None:
    store = tmp_path / "runs.json"
    save_store(store, {"generated:1": {"opendrs": _report(1.0)}})
    save_store(store, {"generated:1": {"opendrs": _report(2.0)}})
    assert load_store(store)["generated:1"]["opendrs"]["hot_node_minutes"] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.json"]  # nothing left beside it
