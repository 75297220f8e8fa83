"""The reading benchmark (bench/reading.py) and its place in ``python -m bench``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.reading import Input, Reading, main, read_once, section

from bench import __main__ as bench_main
from bench import reading


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of a benchmark cluster of size S and a scenario of 300 VMs."""
    monkeypatch.setattr(reading, "SNAPSHOT_SIZE", "S")
    monkeypatch.setattr(reading, "SCENARIO_VMS", 300)


def test_inputs_are_read_as_opendrs_plan_reads_them(small: None, tmp_path: Path) -> None:
    inputs = reading.write_inputs(tmp_path, seed=2)
    assert [i.label for i in inputs] == [
        "S snapshot, YAML",
        "S snapshot, JSON",
        "proxlb-solver scenario, 300 VMs",
    ]
    for item in inputs:
        figures = read_once(str(item.path))
        assert figures["guests"] == item.guests
        assert figures["cpu"] == pytest.approx(figures["parse"] + figures["build"])
        assert figures["rss_peak"] >= figures["rss_imports"] > 0


def test_the_command_measures_and_writes_a_table(
    small: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "reading.md"
    assert main(["--repeats", "1", "--keep", str(tmp_path / "in"), "--markdown", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text in capsys.readouterr().out
    assert "| S snapshot, JSON | " in text and "| proxlb-solver scenario, 300 VMs | " in text
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == [
        "bench-S.json",
        "bench-S.yaml",
        "proxlb-scale-300.yaml",
    ]
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])


def test_the_benchmark_reports_the_readings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    item = Input("a file", tmp_path / "a.yaml", 3)
    figures = Reading(item, 1.5, 0.5, 0.4, 0.3, 0.1, 200 * 1024**2, 40 * 1024**2, 2)
    asked: list[tuple[int, int]] = []

    def fake_run(seed: int, repeats: int) -> list[Reading]:
        asked.append((seed, repeats))
        return [figures]

    monkeypatch.setattr(bench_main, "run_reading", fake_run)
    argv = ["--sizes", "S", "--strategies", "none", "--peers", "none", "--methods", "none"]
    argv += ["--no-endtoend", "--no-startup", "--no-growth", "--no-hot-months"]
    report = tmp_path / "out.json"
    assert bench_main.main([*argv, "--reading-repeats", "2", "--json", str(report)]) == 0
    assert asked == [(1, 2)]
    assert section([figures]) in capsys.readouterr().out
    assert "| a file | 1.5 | 3 | 0.50 | 0.40 | 0.30 | 0.10 | 200 |" in section([figures])
    assert json.loads(report.read_text())[-1]["reading"]["rss_peak"] == 200 * 1024**2
    assert bench_main.main([*argv, "--no-reading"]) == 0
    assert asked == [(1, 2)]
