"""``opendrs simulate --generate SEED [--nodes N --guests M]`` on the command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from daemon import opendrs
from opendrs.backends.generated import shape_of

SMALL = ("--nodes", "4", "--guests", "40", "--days", "0.5", "--no-progress")


def _reports(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    for report in reports:
        del report["wall_seconds"]
    return reports


def test_a_generated_month_is_simulated_the_same_way_twice() -> None:
    args = ("simulate", "--generate", "3", *SMALL, "--policy", "opendrs,proxlb")
    first = _reports(opendrs(*args, "--format", "json"))
    assert [r["policy"] for r in first] == ["opendrs", "proxlb"]
    assert first == _reports(opendrs(*args, "--format", "json"))
    other = _reports(
        opendrs(
            "simulate",
            "--generate",
            "4",
            *SMALL[:-1],
            "--format",
            "json",
            "--policy",
            "opendrs,proxlb",
            "--no-progress",
        )
    )
    assert other != first


def test_an_alternating_hot_spot_gives_no_ping_pong_under_the_default_policy(
    tmp_path: Path,
) -> None:
    # Seed 38 at 8 nodes and 120 guests: two jobs heat node01 and node06 in turns from day 1.22
    # (tests/backends/test_generated_hotspots.py); the default policy (hot level 85 %) relieves
    # them — fewer hot minutes than with no hot level — and no guest goes back.
    off = tmp_path / "hot-off.yaml"
    off.write_text("policy: {hot: null}\n")
    args = ("simulate", "--generate", "38", "--nodes", "8", "--guests", "120", "--days", "1.6")
    done = opendrs(*args, "--policy", f"opendrs,{off}", "--format", "json", "--no-progress")
    report, without = _reports(done)
    relieved, left = (float(str(r["hot_node_minutes"])) for r in (report, without))
    assert left > relieved
    assert report["ping_pongs"] == 0 and report["capacity_violations"] == 0


def test_the_text_report_names_the_generated_month_and_its_shape() -> None:
    done = opendrs("simulate", "--generate", "3", *SMALL, "--policy", "opendrs", columns=300)
    assert done.returncode == 0, done.stderr
    assert f"generated:3 (4 nodes, 40 guests: {shape_of(3).describe()})" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--generate", "x"), "argument --generate: 'x' is not a whole number"),
        (("--generate", "-1"), "argument --generate: must be a whole number from 0"),
        (("--generate", "1", "--nodes", "2"), "argument --nodes: must be a whole number from 3"),
        (("--generate", "1", "--guests", "1e3"), "argument --guests: '1e3' is not a whole number"),
        (("--nodes", "4"), "--nodes: only with --generate SEED"),
        (("--guests", "40"), "--guests: only with --generate SEED"),
        (("--fill", "0.8"), "--fill: only with --generate SEED"),
        (("--generate", "1", "--fill", "0.95"), "argument --fill: must be from 0.3 to 0.85"),
        (("--generate", "1", "--failover-check", "dynamic"), "dynamic: the modes are basic,"),
        (("builtin:demo", "--generate", "1"), "--generate: makes its own scenario, not with"),
    ],
)
def test_bad_generate_flags_are_refused_in_one_line(args: tuple[str, ...], message: str) -> None:
    done = opendrs("simulate", *args, "--days", "0.1", "--no-progress")
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_simulate_says_where_it_is_and_each_result_as_it_comes_on_any_output() -> None:
    """Not a terminal (a pipe): progress lines on standard error, and each policy's figures in a
    line as soon as its run is done, before the table."""
    done = opendrs(
        "simulate", "--generate", "3", "--nodes", "4", "--guests", "40", "--days", "0.5",
        "--policy", "opendrs,proxlb",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("simulate: ")]
    assert lines[0] == "simulate: opendrs: day 0.0 of 0.5 (0%)"
    finished = [line for line in lines if " done in " in line]
    assert [line.split()[1] for line in finished] == ["opendrs", "proxlb"]
    assert all("migrations over 0.5 days, spread above 15 pp" in line for line in finished)
    quiet = opendrs("simulate", "--generate", "3", *SMALL, "--policy", "proxlb")
    assert quiet.returncode == 0 and "simulate: " not in quiet.stderr
