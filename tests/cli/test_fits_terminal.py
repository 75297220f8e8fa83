"""Text that fits the terminal it is written on: ``simulate``'s stability table turned when it
is too wide, reasons said once per set of nodes and wrapped with a hanging indent."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from daemon import opendrs

SMALL = ("--generate", "3", "--nodes", "4", "--guests", "30", "--days", "0.2", "--no-progress")
FAILBACK = "set failback 0 on the HA resource to let it stay elsewhere"
LABELS = ("migrations", "per day", "mean spread", "hot min, worst node", "wall time")


def _lines_fit(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"lines wider than {width}: {too_wide}"
    return lines


@pytest.mark.parametrize("width", [80, 100, 250])
def test_simulates_table_fits_the_width_it_gets_and_keeps_every_figure(width: int) -> None:
    done = opendrs("simulate", *SMALL, columns=width)
    assert done.returncode == 0, done.stderr
    lines = _lines_fit(done.stdout, width)
    text = done.stdout
    for policy in ("opendrs", "proxmox", "incus", "proxlb"):
        assert re.search(rf"\b{policy}\b", text)
    for label in LABELS:
        assert label in text
    assert re.search(r"\d+\.\d/day", text) and re.search(r"\d+\.\d s\b", text)
    policy_rows = [line for line in lines if line.startswith("policy ")]
    if width >= 250:  # wide enough: a row per policy, the figures in columns
        assert len(policy_rows) == 1 and "migrations" in policy_rows[0]
        assert sum(line.startswith(("opendrs ", "proxlb ")) for line in lines) == 2
    else:  # a row per figure, the policies in columns
        assert all("migrations" not in row for row in policy_rows)
        assert sum(line.startswith("wall time ") for line in lines) == len(policy_rows)


def test_simulates_json_and_markdown_report_are_not_bound_to_the_width(tmp_path: Path) -> None:
    report = tmp_path / "sim.md"
    args = ("simulate", *SMALL, "--policy", "opendrs,proxlb", "--format", "json")
    done = opendrs(*args, "--report", str(report), columns=80)
    assert done.returncode == 0, done.stderr
    assert [r["policy"] for r in json.loads(done.stdout)] == ["opendrs", "proxlb"]
    markdown = report.read_text(encoding="utf-8")
    header = next(line for line in markdown.splitlines() if line.startswith("| policy"))
    assert len(header) > 80 and "migrations" in header  # a Markdown table is not wrapped


def test_headroom_says_a_reason_shared_by_nodes_once_and_wraps_it() -> None:
    done = opendrs("headroom", "demo", columns=80)
    assert done.returncode == 1, done.stderr
    lines = _lines_fit(done.stdout, 80)
    text = " ".join(line.strip() for line in lines)
    assert "pve3, pve4, pve5: HA failback (db-on-nvme)" in text
    assert text.count(FAILBACK) == 1
    reason = next(i for i, line in enumerate(lines) if "db-replica (101): no node" in line)
    assert lines[reason].startswith("    db-replica")
    assert lines[reason + 1].startswith("      ") and not lines[reason + 1].startswith("       ")


def test_places_rejected_nodes_share_a_reason_and_fit_80_columns() -> None:
    done = opendrs("place", "--guest", "db-main", "demo", columns=80)
    assert done.returncode == 0, done.stderr
    lines = _lines_fit(done.stdout, 80)
    rejected = lines[lines.index("Rejected") + 1 :]
    assert rejected[0].startswith("  pve3, pve4, pve5: HA failback (db-on-nvme)")
    assert all(line.startswith("    ") for line in rejected[1:] if line)
    assert " ".join(line.strip() for line in rejected).count(FAILBACK) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "demo"),
        ("show", "demo"),
        ("place", "--new", "cpu=4,memory=8GiB", "demo"),
        ("headroom", "demo", "--failures", "2"),
    ],
)
def test_reasons_and_rule_lines_fit_80_columns(args: tuple[str, ...]) -> None:
    done = opendrs(*args, columns=80)
    assert done.returncode in (0, 1), done.stderr
    lines = _lines_fit(done.stdout, 80)
    assert not any(
        re.search(r"\d$", a) and re.match(r"\s+(GiB|%|pp)\b", b)
        for a, b in itertools.pairwise(lines)
    )  # a number keeps its unit


def test_columns_stay_aligned_with_names_two_columns_wide(tmp_path: Path) -> None:
    """A CJK or emoji name takes two columns a character on a terminal: the plain tables pad by
    the columns a cell takes, so what follows it starts where it does on the other rows."""
    text = (Path(__file__).parents[2] / "examples" / "small.yaml").read_text()
    snapshot = tmp_path / "wide.yaml"
    snapshot.write_text(text.replace("pve1", "节点一").replace("name: db", "name: 数据库🚀"))
    done = opendrs("show", str(snapshot), columns=100)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name, column in (("节点一", "online"), ("数据库🚀", " vm ")):
        rows = [line for line in lines if column in line]
        assert len(rows) >= 3 and any(name in row for row in rows), done.stdout
        starts = {_cell_len(row[: row.index(column)]) for row in rows}
        assert len(starts) == 1, "\n".join(rows)


def _cell_len(text: str) -> int:
    """The columns ``text`` takes on a terminal (East Asian wide and emoji characters two)."""
    from rich.cells import cell_len

    return cell_len(text)
