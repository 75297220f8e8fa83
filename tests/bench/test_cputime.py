"""bench.cputime: one line per run, with CPU time, wall time and peak RSS."""

from __future__ import annotations

import re

import pytest
from bench.cputime import main

LINE = re.compile(
    r"^(\w+) S (basic|skewed) seed \d+ (with|without) rules: "
    r"cpu \d+\.\d\d s, wall \d+\.\d\d s, peak RSS \d+ MiB$"
)


@pytest.mark.parametrize("step", ["constraints", "balance"])
def test_each_run_prints_one_line(step: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([step, "--size", "S", "--rules", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(LINE.match(line) and line.startswith(step) for line in lines)


def test_the_generator_and_seed_are_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["balance", "--size", "S", "--generator", "skewed", "--seed", "3"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert LINE.match(line) and line.startswith("balance S skewed seed 3 without rules")
