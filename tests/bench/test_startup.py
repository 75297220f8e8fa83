"""The start-up benchmark (bench/startup.py) and its place in ``python -m bench``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bench.startup import Command, Startup, compiled_env, run_command, section

from bench import __main__ as bench_main

MIB = 1024**2


def test_a_command_is_measured_after_a_run_to_warm_up(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    code = f"open({str(counter)!r}, 'a').write('x')"
    result = run_command(
        Command("count", (sys.executable, "-c", code)), 2, compiled_env(tmp_path / "pyc")
    )
    assert counter.read_text() == "xxx"  # the warm-up and the two measured
    assert result.repeats == 2 and result.wall > 0 and result.cpu >= 0
    assert result.rss_peak is None or result.rss_peak > MIB


def test_a_failing_command_stops_the_measurement(tmp_path: Path) -> None:
    failing = Command("fails", (sys.executable, "-c", "raise SystemExit(3)"))
    with pytest.raises(RuntimeError, match=r"^fails: exit status 3$"):
        run_command(failing, 1, compiled_env(tmp_path))


def test_the_processes_cache_their_bytecode_whatever_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = compiled_env(tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")


def _figures(wall: float, target: float | None) -> Startup:
    return Startup(Command("`opendrs plan x`", ("x",), target), wall, 0.21, 40 * MIB, 10)


def test_the_section_gives_each_command_against_its_target() -> None:
    text = section([_figures(0.25, 0.3), _figures(0.5, 0.3), _figures(0.02, None)])
    rows = text.splitlines()[-3:]
    assert rows[0] == "| `opendrs plan x` | 0.250 | 0.210 | 40 | ≤ 0.3: met |"
    assert rows[1].endswith("| ≤ 0.3: **not met** |")
    assert rows[2].endswith("| 40 |  |")
    assert "run 10 times (after one to warm up)" in text


def test_the_benchmark_runs_the_section(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asked: list[tuple[int, int]] = []

    def fake_run(repeats: int, seed: int) -> list[Startup]:
        asked.append((repeats, seed))
        return [_figures(0.25, 0.3)]

    monkeypatch.setattr(bench_main, "run_startup", fake_run)
    argv = ["--sizes", "S", "--strategies", "none", "--peers", "none", "--methods", "none"]
    argv += ["--no-reading", "--no-endtoend", "--no-growth", "--incus", "none", "--no-hot-months"]
    out = tmp_path / "out.json"
    assert bench_main.main([*argv, "--startup-repeats", "3", "--json", str(out)]) == 0
    assert asked == [(3, 1)]
    assert "### Start-up" in capsys.readouterr().out
    assert json.loads(out.read_text())[-1]["startup"]["wall"] == 0.25
    assert bench_main.main([*argv, "--no-startup"]) == 0
    assert len(asked) == 1
    with pytest.raises(SystemExit):
        bench_main.main([*argv, "--startup-repeats", "0"])
