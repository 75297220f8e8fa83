"""``opendrs simulate`` on an Incus scenario (``platform: incus``), as a process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon import opendrs

EXAMPLES = Path(__file__).parents[2] / "examples" / "scenarios"
EXAMPLE = EXAMPLES / "incus-week.yaml"


def test_both_policies_run_on_the_incus_example_and_count_restart_moves() -> None:
    done = opendrs(
        "simulate", str(EXAMPLE), "--days", "0.5", "--policy", "opendrs,incus",
        "--format", "json", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reports = {r["policy"]: r for r in json.loads(done.stdout)}
    assert set(reports) == {"opendrs", "incus"}
    for report in reports.values():
        assert report["migrations"] > 0 and report["capacity_violations"] == 0
        assert report["restart_migrations"] <= report["migrations"]
    # The containers packed on incus1 and arm1 move by restart under opendrs: each stops for the
    # move's 10 s setup (their disks are on a remote pool).
    ours = reports["opendrs"]
    assert ours["restart_migrations"] > 0
    assert ours["restart_downtime_minutes"] == pytest.approx(
        ours["restart_migrations"] * 10 / 60, rel=0.5
    )


def test_the_text_report_shows_the_restart_moves() -> None:
    done = opendrs(
        "simulate", str(EXAMPLE), "--days", "0.25", "--policy", "opendrs", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert "restarts (down)" in done.stdout
    assert " min)" in done.stdout


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            "platform: openstack",
            "incus-bad.yaml: platform: expected one of proxmox, incus, got 'openstack'",
        ),
        ("incus: {config: {}}", "incus-bad.yaml: incus: only with `platform: incus`"),
        (
            "platform: incus\nincus:\n  config: {cluster.rebalance.cooldown: 3 hours}",
            'incus-bad.yaml: incus.config["cluster.rebalance.cooldown"]: expected an Incus '
            "duration (6H, 1d 3H), got '3 hours'",
        ),
        (
            "platform: incus\nincus:\n  config: {cluster.rebalance.batch: two}",
            'incus-bad.yaml: incus.config["cluster.rebalance.batch"]: expected a whole number, '
            "got 'two'",
        ),
    ],
)
def test_a_bad_platform_setting_is_one_line_and_exit_2(
    tmp_path: Path, lines: str, message: str
) -> None:
    scenario = tmp_path / "incus-bad.yaml"
    cluster = EXAMPLES.parent / "incus-cluster.yaml"
    scenario.write_text(f"version: 1\ncluster: {cluster}\n{lines}\n", encoding="utf-8")
    done = opendrs("simulate", str(scenario), "--days", "0.1", "--no-progress")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert message in done.stderr
