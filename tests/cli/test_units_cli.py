"""Shares and sizes as an operator writes them, each through the command in a subprocess: a
share is a fraction (0.15) or a percentage (15%), a bare number above 1 is refused with the
percentage it meant; a size takes a unit; -O sets a strategy option (-o, before, still does with a
warning)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from daemon import opendrs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("place", "demo", "--new", "cpu=2,memory=4096"), "memory=4096: give a unit, e.g. 4096M"),
        (("place", "demo", "--new", "cpu=2,memory=8G,memory_used=512"), "memory_used=512:"),
        (("place", "demo", "--new", "memory=4G,memory=8G"), "memory is given twice ('4G' and"),
        (("place", "demo", "--new", "mem=4G"), "unknown key 'mem' (did you mean 'memory'?)"),
        (("plan", "demo", "--target-spread", "5"), "--target-spread: 5 as a fraction is 500 %"),
        (("plan", "demo", "-O", "target_spread=15"), "did you mean 15 %? (write 15% or 0.15)"),
        (("plan", "demo", "--strategy", "pve-topsis", "--threshold", "30"), "did you mean 30 %"),
        (("plan", "demo", "--strategy", "pve-topsis", "--margin", "10"), "did you mean 10 %"),
        (("simulate", "--threshold", "15"), "did you mean 15 %"),
        (("simulate", "--hot", "85"), "did you mean 85 %"),
    ],
)
def test_a_share_or_size_without_its_unit_is_refused_with_the_fix(
    argv: tuple[str, ...], message: str
) -> None:
    done = opendrs(*argv, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_share_is_taken_as_a_percentage_or_a_fraction() -> None:
    options = {}
    for argv in (
        ("--target-spread", "5%"),
        ("-O", "target_spread=5%"),
        ("-O", "target_spread=0.05"),
    ):
        done = opendrs("plan", "demo", *argv, "--format", "json", timeout=120)
        assert done.returncode == 0, done.stderr
        options[argv] = json.loads(done.stdout)["options"]["target_spread"]
    assert set(options.values()) == {0.05}
    incus = opendrs("plan", "demo", "--strategy", "incus", "--threshold", "95%", "--format", "json")
    assert incus.returncode == 0 and json.loads(incus.stdout)["options"]["threshold"] == 95
    placed = opendrs("place", "demo", "--new", "cpu=2,memory=4096M", "--format", "json")
    assert placed.returncode == 0, placed.stderr


def test_plan_o_still_sets_an_option_with_a_warning() -> None:
    done = opendrs("plan", "demo", "-o", "target_spread=0.05", "--format", "json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["options"]["target_spread"] == 0.05
    assert done.stderr == (
        "warning: plan -o NAME=VALUE is now -O NAME=VALUE (--option): write -O target_spread=0.05\n"
    )


def test_plan_o_with_a_file_says_where_plan_writes(tmp_path: Path) -> None:
    """-o is the output file everywhere else: ``plan -o FILE`` says so, and writes nothing."""
    target = tmp_path / "plan.txt"
    done = opendrs("plan", "demo", "-o", str(target), timeout=120)
    assert done.returncode == 2 and done.stdout == "" and not target.exists()
    assert done.stderr == (
        "error: -o: plan writes to standard output (redirect it: > FILE; 'opendrs report' writes "
        "a file with -o FILE); a strategy option is -O NAME=VALUE\n"
    )


def test_a_scenario_share_takes_a_percentage(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    shutil.copy(examples / "small.yaml", tmp_path)
    shutil.copytree(examples / "scenarios", tmp_path / "scenarios")
    scenario = tmp_path / "scenarios" / "small-week.yaml"
    text = scenario.read_text()
    assert "failure_rate: 0.01\n" in text
    scenario.write_text(text.replace("failure_rate: 0.01\n", "failure_rate: 2\n"))
    argv = ("simulate", str(scenario), "--days", "0.02", "--policy", "opendrs", "--no-progress")
    done = opendrs(*argv, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "migration.failure_rate: 2 as a fraction is 200 %: did you mean 2 %?" in done.stderr
    scenario.write_text(text.replace("failure_rate: 0.01\n", "failure_rate: 1%\n"))
    assert opendrs(*argv, timeout=300).returncode == 0


def test_a_share_above_100_percent_is_read_once() -> None:
    # The command line reads -O and --threshold, the strategy reads its options again: 150 %
    # read once is 1.5, which read again as a bare number was refused ("did you mean 4 %?").
    done = opendrs(
        "plan", "demo", "--strategy", "pve-topsis", "--threshold", "150%", "-O", "imbalance=raw",
        "--format", "json", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["options"]["threshold"] == 1.5
    done = opendrs("plan", "demo", "-O", "cpu_commit_spread=400%", "--format", "json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["options"]["cpu_commit_spread"] == 4.0
    bare = opendrs("plan", "demo", "-O", "cpu_commit_spread=4")
    assert bare.returncode == 2 and "did you mean 4 %?" in bare.stderr
