"""The operator's words, through the command as a process: guests as ``name (id)``, ``--guest`` by
name or id, moves and stops in plain sentences (the engine's figures under ``--verbose`` and in
JSON), costs as bytes copied, the soft rules behind a placement's penalty, and tables that fit
the width they get."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = str(ROOT / "examples" / "small.yaml")


def opendrs(*argv: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "opendrs", *argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_plan_says_each_move_in_words_with_names_and_bytes() -> None:
    proc = opendrs("plan", "demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "to copy (memory and local disks)" in out.splitlines()[0]
    out = " ".join(line.strip() for line in out.splitlines())  # as read, the lines wrapped
    assert "moves ci-runner-1 (110) off pve1 (cpu 89 %) to pve4 (cpu 6 %); copies 32.0 GiB" in out
    assert "Stopped: no other allowed move evens the loads out enough" in out
    assert "weighted variance" not in out and "pp of σ" not in out and "CV/√" not in out
    assert "ci-runner-1 (110)  pve1  pve4" in out  # the plan's steps name the guests too


def test_plan_verbose_and_json_keep_the_engine_figures() -> None:
    verbose = opendrs("plan", "demo", "--verbose").stdout
    assert "balance: weighted variance (pp²)" in verbose and "pp of σ" in verbose
    assert "CV/√(N−1)" in verbose
    data = json.loads(opendrs("plan", "demo", "--format", "json").stdout)
    assert data["moves"][0]["guest"].isdigit()  # ids, as before
    assert data["stop"] == {"code": "no_move_pays", "margin": 0.05}
    assert "pp of σ" in data["stopped"]
    assert isinstance(data["cost"], int)


def test_plan_stops_balanced_in_words() -> None:
    out = opendrs("plan", "demo", "--target-spread", "0.3").stdout
    assert "Stopped: the cluster is balanced: the nodes' loads are within 30 percentage" in out


def test_place_takes_a_name_and_names_the_rule_behind_a_penalty() -> None:
    by_name = opendrs("place", "demo", "--guest", "db-main")
    by_id = opendrs("place", "demo", "--guest", "100")
    assert by_name.returncode == 0 and by_name.stdout == by_id.stdout
    lines = by_name.stdout.splitlines()
    assert lines[0] == "Placement of guest db-main (100) (balance)"
    pve2 = next(line for line in lines if line.startswith("2 "))
    assert pve2.split()[1] == "pve2" and pve2.endswith("db-apart")
    assert "score" not in lines[1]
    assert "score" in opendrs("place", "demo", "--guest", "db-main", "-v").stdout


def test_guest_name_shared_by_several_is_one_line_exit_2(tmp_path: Path) -> None:
    text = Path(SMALL).read_text().replace("name: web2", "name: web1")
    snapshot = tmp_path / "twins.yaml"
    snapshot.write_text(text)
    proc = opendrs("place", str(snapshot), "--guest", "web1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "error: --guest: 2 guests are named 'web1' (web1 (101), web1 (102)): give an id\n"
    )
    assert opendrs("place", str(snapshot), "--guest", "102").returncode == 0
    missing = opendrs("place", str(snapshot), "--guest", "nope")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_show_names_guests_and_fits_80_columns() -> None:
    for columns in (80, 120):
        proc = opendrs("show", "demo", columns=columns)
        assert proc.returncode == 0
        # the tables; a sentence (indented) is one line for grep, a terminal wraps it
        rows = [line for line in proc.stdout.splitlines() if not line.startswith("  ")]
        widest = max(len(line) for line in rows)
        assert widest <= columns, (columns, widest)
    out = opendrs("show", "demo").stdout
    assert "db-main (100)" in out
    assert "app-with-cache (soft affinity): app-1 (102), cache-1 (104)" in out
    narrow, wide = opendrs("show", "demo", columns=60).stdout, out
    assert narrow.count("#") < wide.count("#")  # the bars use the width they get


def test_show_on_an_80_column_terminal_keeps_one_line_per_node() -> None:
    env = {**os.environ, "COLUMNS": "80", "FORCE_COLOR": "1"}  # rich: a terminal, 80 wide
    proc = subprocess.run(
        [sys.executable, "-m", "opendrs", "show", "demo", "--no-guests"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout).splitlines()
    start = next(i for i, line in enumerate(plain) if line.startswith("node ┃ state"))
    rows = plain[start + 2 : start + 7]
    assert [row.split()[0] for row in rows] == ["pve1", "pve2", "pve3", "pve4", "pve5"]
    assert all(len(row) <= 80 and row.rstrip().endswith("%") for row in rows)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(*path, name), *_commands(sub, (*path, name))]
    return found


def test_every_command_has_a_description_and_help_points_to_what_is_installed() -> None:
    from opendrs.cli.main import build_parser

    commands = _commands(build_parser())
    assert len(commands) >= 17
    for command in commands:
        proc = opendrs(*command, "--help", columns=100)
        assert proc.returncode == 0, command
        described = proc.stdout.split("\n\n")[1]  # usage, then the description
        assert not described.startswith(("positional arguments", "options")), command
        assert "docs/" not in proc.stdout, command  # not installed: the man page is
    top = opendrs("--help", columns=100).stdout
    assert "'man opendrs'" in top and "'opendrs COMMAND --help'" in top
    wrong = opendrs("plan")
    assert wrong.returncode == 2 and wrong.stderr.endswith("(see 'opendrs plan --help')\n")


def test_pve_decide_names_the_field_and_its_json_kind() -> None:
    lines = '{"nodes": null}\n{"nodes": {"a": 5}}\n{"nodes": {"a": {}}, "services": []}\n'
    proc = subprocess.run(
        [sys.executable, "-m", "opendrs", "pve", "decide"],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    answers = [json.loads(line)["error"] for line in proc.stdout.splitlines()]
    assert answers[0] == "line 1: field 'nodes' must be an object, got null."
    assert answers[1] == "line 2: field 'nodes.a' must be an object, got the number 5."
    assert answers[2] == "line 3: field 'services' must be an object, got an array."
    assert not any("NoneType" in a or "int" in a.split() or "list" in a for a in answers)


def test_show_says_a_node_over_capacity_in_units(tmp_path: Path) -> None:
    snapshot = tmp_path / "over.yaml"
    snapshot.write_text(
        "version: 1\nsettings: {mode: dynamic}\n"
        "nodes:\n  a: {cpu: 4, memory: 64GiB, usage: {cpu: 0.5, memory: 2GiB}}\n"
        "  b: {cpu: 4, memory: 64GiB}\nguests:\n"
        "  - {id: 1, node: a, cpu: 20, memory: 40GiB, usage: {cpu: 4, memory: 40GiB}}\n"
        "  - {id: 2, node: a, cpu: 1, memory: 40GiB, usage: {cpu: 0.1, memory: 30GiB}}\n"
    )
    proc = opendrs("show", str(snapshot))
    assert proc.returncode == 0, proc.stderr
    over = proc.stdout.split("Over capacity now\n")[1].split("\n\n")[0]
    assert "a: vcpus 21.0 cores > 16.0 cores" in over, over
    assert "a: memory 80.0 GiB > 64.0 GiB" in over, over
    assert "a: cpu_used 4.6 cores > 4.0 cores" in over, over
    assert "e+" not in over, over


def test_plan_balanced_says_which_spread_one_guest_keeps_wider(tmp_path: Path) -> None:
    # Six 4 GiB guests on a 64 GiB node beside a 16 GiB one: one guest is a step of 25 pp on
    # the small node, so memory ends 6.2 pp apart, balanced but wider than the 1 pp asked.
    guests = "".join(f"  - {{id: {i}, node: big, cpu: 1, memory: 4GiB}}\n" for i in range(1, 7))
    snapshot = tmp_path / "grain.yaml"
    snapshot.write_text(
        "version: 1\nsettings: {mode: static}\n"
        "nodes:\n  small: {cpu: 4, memory: 16GiB}\n  big: {cpu: 16, memory: 64GiB}\n"
        f"guests:\n{guests}"
    )
    proc = opendrs("plan", str(snapshot))
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "the cluster is balanced" in said and "memory 6.2 pp" in said, said
    assert "memory within one step of the smallest movable guest on the smallest node" in said
    assert "cpu within one step" not in said  # the vCPUs are within their own goal
