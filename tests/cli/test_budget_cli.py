"""``opendrs simulate --budget`` and ``policy.max_migrations_per_day`` on the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from daemon import opendrs
from opendrs.cli.simulate_command import with_budget
from opendrs.engine.policy import PolicyConfig


def test_simulate_budget_bounds_opendrs_and_leaves_the_peers_alone() -> None:
    # The first day of the month: unbudgeted, opendrs balances with dozens of migrations.
    args = ("simulate", "--days", "1", "--format", "json", "--no-progress")
    free = opendrs(*args, "--policy", "opendrs,proxmox")
    budgeted = opendrs(*args, "--policy", "opendrs,proxmox", "--budget", "4")
    assert free.returncode == 0 and budgeted.returncode == 0, budgeted.stderr
    before = {r["policy"]: r for r in json.loads(free.stdout)}
    after = {r["policy"]: r for r in json.loads(budgeted.stdout)}
    assert before["opendrs"]["balancing_migrations"] > 4
    assert 0 < after["opendrs"]["balancing_migrations"] <= 4
    # The emulated peer runs as it did, budget or not.
    for report in (before, after):
        del report["proxmox"]["wall_seconds"]
    assert after["proxmox"] == before["proxmox"]


def test_simulate_takes_a_fractional_budget() -> None:
    # Three days of the month: one balancing migration in any 48 hours, two in all.
    args = ("simulate", "--days", "3", "--format", "json", "--no-progress", "--policy", "opendrs")
    for budget in ("0.5", "1/2"):
        done = opendrs(*args, "--budget", budget)
        assert done.returncode == 0, done.stderr
        (report,) = json.loads(done.stdout)
        assert report["balancing_migrations"] == 2


@pytest.mark.parametrize("budget", ["-3", "1.5", "2/3", "0.001"])
def test_simulate_refuses_a_bad_budget_in_one_line(budget: str) -> None:
    done = opendrs("simulate", "--days", "1", "--budget", budget)
    assert done.returncode == 2
    assert "--budget: expected a whole number from 0 to 100000, or a fraction" in done.stderr
    assert "Traceback" not in done.stderr


def _config(directory: Path, budget: str) -> Path:
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: shadow\nbackend: {type: sim, scenario: 'builtin:demo', days: 0.1}\n"
        f"history: {directory / 'history.db'}\npolicy: {{max_migrations_per_day: {budget}}}\n"
    )
    return config


@pytest.mark.parametrize("budget", ["2", "0.5", "1/2"])
def test_run_takes_a_budget(tmp_path: Path, budget: str) -> None:
    done = opendrs("run", "--config", str(_config(tmp_path, budget)), "--once")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("budget", "shown"), [("-1", "-1"), ("1.5", "1.5"), ("2/3", "'2/3'")])
def test_run_refuses_a_bad_budget_in_one_line(tmp_path: Path, budget: str, shown: str) -> None:
    done = opendrs("run", "--config", str(_config(tmp_path, budget)), "--once")
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "policy.max_migrations_per_day: expected a whole number from 0 to 100000, or a "
        "fraction from 0.01 to below 1 such as 0.5 or 1/3 (one migration in any 2 or 3 days), "
        f"got {shown}"
    )
    assert done.stderr.count("\n") == 1


def test_run_refuses_spend_budget_without_a_budget_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "mode: shadow\nbackend: {type: sim, scenario: 'builtin:demo', days: 0.1}\n"
        f"history: {tmp_path / 'history.db'}\npolicy: {{spend_budget: true}}\n"
    )
    done = opendrs("run", "--config", str(config), "--once")
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "policy.spend_budget: needs max_migrations_per_day, the budget it spends"
    )
    assert done.stderr.count("\n") == 1


def test_simulate_spends_a_windowed_budget_together() -> None:
    # Three days of the month: 0.5 a day over a 6-day window is three migrations, free to be
    # spent together (one in any 48 hours without the window: two).
    args = ("simulate", "--days", "3", "--format", "json", "--no-progress", "--policy", "opendrs")
    done = opendrs(*args, "--budget", "0.5", "--budget-window", "6d")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["balancing_migrations"] == 3


def test_simulate_a_budget_only_caps_unless_it_is_spent() -> None:
    # Two days of the month: a budget that never binds changes nothing; spent on reaction, what
    # it leaves buys a faster reaction — more migrations, less time above the threshold.
    args = ("simulate", "--days", "2", "--format", "json", "--no-progress", "--policy", "opendrs")
    (alone,) = json.loads(opendrs(*args).stdout)
    (capped,) = json.loads(opendrs(*args, "--budget", "1000").stdout)
    (spent,) = json.loads(opendrs(*args, "--budget", "1000", "--spend-budget").stdout)
    keys = ("migrations", "pct_time_above_threshold", "ping_pongs")
    assert [capped[k] for k in keys] == [alone[k] for k in keys]
    assert spent["migrations"] > alone["migrations"]
    assert spent["pct_time_above_threshold"] < alone["pct_time_above_threshold"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--budget-window", "7d"), "--budget-window: only with --budget N"),
        (("--spend-budget",), "--spend-budget: only with --budget N"),
        (
            ("--budget", "0.25", "--budget-window", "2d"),
            "--budget-window: 2d is too short for 0.25 migrations a day: it must hold one, "
            "at least 4d",
        ),
        (("--budget", "1", "--budget-window", "10m"), "must be from 1h to 365d, got '10m'"),
        (("--budget", "1", "--budget-window", "soon"), "cannot read 'soon' as a duration"),
    ],
)
def test_simulate_refuses_a_bad_budget_window_in_one_line(
    extra: tuple[str, ...], message: str
) -> None:
    done = opendrs("simulate", "--days", "1", *extra)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") <= 2
    assert "Traceback" not in done.stderr


def test_simulate_budget_keeps_a_policy_files_spending() -> None:
    spending = replace(PolicyConfig(), max_migrations_per_day=20, spend_budget=True)
    (kept,) = with_budget([spending], 10)
    assert (kept.max_migrations_per_day, kept.spend_budget) == (10, True)
    (turned_on,) = with_budget([PolicyConfig()], 10, spend=True)
    assert turned_on.spend_budget
    (capping,) = with_budget([PolicyConfig()], 10)
    assert not capping.spend_budget
