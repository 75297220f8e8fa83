"""The command line: every command, JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendrs.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = str(ROOT / "examples" / "small.yaml")
RULES = str(ROOT / "examples" / "rules.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", SMALL)
    assert code == 0 and err == ""
    assert out.startswith(f"{SMALL}: valid (")


def test_validate_reports_contradictory_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\n"
        "nodes: {a: {cpu: 4, memory: 8GiB}, b: {cpu: 4, memory: 8GiB}}\n"
        "guests:\n"
        "  - {id: 1, node: a, memory: 1GiB}\n"
        "  - {id: 2, node: b, memory: 1GiB}\n"
        "rules:\n"
        "  - {type: affinity, name: together, guests: [1, 2]}\n"
        "  - {type: anti-affinity, name: apart, guests: [1, 2]}\n"
    )
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2 and out == ""
    assert err == (
        f"{path}: rules: Drop rules 'together', 'apart', because they keep guests '1', '2' "
        "both together and apart\n"
    )
    code, out, _ = run(capsys, "validate", str(path), "--format", "json")
    assert code == 2 and json.loads(out)["valid"] is False


def test_show_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", SMALL)
    assert code == 0
    assert "Imbalance (usable nodes)" in out and "combined" in out
    code, out, _ = run(capsys, "show", SMALL, "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert {"name", "mode", "nodes", "imbalance", "problems"} <= set(data)
    assert all({"cpu", "memory"} == set(n["load"]) for n in data["nodes"])


def test_place_guest_new_and_evacuate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "place", "demo", "--new", "cpu=2,memory=4GiB", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["best"] == data["ranking"][0]["node"]
    code, out, _ = run(capsys, "place", "demo", "--guest", "101")
    assert code == 0 and out.startswith("Placement of guest 101 (balance)")
    code, out, _ = run(capsys, "place", "demo", "--evacuate", "pve4", "--format", "json")
    data = json.loads(out)
    assert data["node"] == "pve4"
    assert all(m["source"] == "pve4" and m["target"] != "pve4" for m in data["moves"])
    assert code == (1 if data["stuck"] else 0)


def test_plan_json_has_moves_with_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "demo", "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert data["moves"], "the demo cluster is unbalanced"
    steps = [m["step"] for m in data["moves"]]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == data["plan"]["steps"]
    assert {"guest", "source", "target", "step", "parking"} <= set(data["moves"][0])
    assert data["metrics"]["after"]["combined"]["cv"] < data["metrics"]["before"]["combined"]["cv"]


def test_plan_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    _, first, _ = run(capsys, "plan", "demo", "--format", "json")
    _, second, _ = run(capsys, "plan", "demo", "--format", "json")
    assert first == second


def test_strategies_and_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "strategies")
    assert code == 0 and out.startswith("balance ")
    assert "pve-bruteforce" in out and "optimal" in out
    code, out, _ = run(capsys, "demo", "--fast", "--days", "0.5")
    assert code == 0 and "opendrs demo:" in out
    assert "Stability over 0.5 simulated days of builtin:demo" in out
    assert " done " in out  # migrations as they happen


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "/nonexistent/x.yaml"], "error: /nonexistent/x.yaml: cannot read the file"),
        (["place", "demo", "--guest", "nope"], "error: --guest: no guest 'nope' in demo"),
        (["place", "demo", "--evacuate", "nope"], "error: --evacuate: no node 'nope' in demo"),
        (["place", "demo", "--new", "cpu=x,memory=1G"], "error: --new: cpu: 'x' is not a number"),
        (["place", "demo", "--new", "cpu=1"], "error: --new: memory is required"),
        (["place", "demo", "--new", "gpu=1,memory=1G"], "error: --new: unknown key 'gpu'"),
        (["plan", "demo", "--strategy", "nope"], "error: --strategy: unknown strategy 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_pve_decide_streams_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    query = {
        "mode": "static",
        "nodes": {
            "node1": {"maxcpu": 10, "maxmem": 100_000_000_000, "online": True},
            "node2": {"maxcpu": 20, "maxmem": 200_000_000_000, "online": True},
        },
        "services": {
            "vm:1": {
                "node": "node1",
                "state": "request_start",
                "maxcpu": 4,
                "maxmem": 20_000_000_000,
            }
        },
        "rules": None,
        "groups": None,
        "query": {"select-node": {"sid": "vm:1", "preference": "best-score"}},
    }
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("not json\n\n" + json.dumps(query) + "\n"))
    code, out, _ = run(capsys, "pve", "decide")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert "error" in json.loads(lines[0])
    assert json.loads(lines[1])["node"] == "node2"


def test_console_script_runs_as_a_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opendrs.cli", "show", "/nonexistent.yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_random_files_give_one_line_and_exit_2(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("rand") / "snapshot.yaml"
    path.write_bytes(data)
    import contextlib
    import io

    err = io.StringIO()
    out = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["show", str(path)])
    if code != 0:
        assert code == 2
        assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("error: ")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_truncated_snapshots_give_one_line_and_exit_2(cut: int) -> None:
    import contextlib
    import io
    import tempfile

    text = Path(RULES).read_bytes()
    cut = cut % (len(text) + 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "truncated.yaml"
        path.write_bytes(text[:cut])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["validate", str(path)])
    assert code in (0, 2)
    if code == 2:
        assert err.getvalue().count("\n") >= 1
        assert all(line.startswith(("error: ", str(path))) for line in err.getvalue().splitlines())


COMPAT_SCENARIOS = ROOT.parent / "shared" / "compat" / "proxlb-scenarios"

SCENARIO = """
name: swap
balancing: {method: memory, balanciness: 5}
nodes:
  node-A: {cpu_total: 16, memory_total_gb: 64}
  node-B: {cpu_total: 16, memory_total_gb: 64}
  node-C: {cpu_total: 16, memory_total_gb: 64}
vms:
  vm-a: {node: node-A, cpu: 4, memory_gb: 50}
  vm-b: {node: node-B, cpu: 4, memory_gb: 50}
constraints:
  pin:
    - {vm: vm-a, nodes: [node-B, node-C]}
    - {vm: vm-b, nodes: [node-A, node-C]}
expect:
  placements: {vm-a: node-B, vm-b: node-A}
"""


def test_plan_orders_steps_and_reports_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "demo", "--format", "json", "--max-parallel", "2")
    data = json.loads(out)
    assert code == 0 and data["plan"]["feasible"]
    steps: dict[int, int] = {}
    for move in data["moves"]:
        steps[move["step"]] = steps.get(move["step"], 0) + 1
    assert max(steps.values()) <= 2
    assert data["bounds"]["migrations"] <= data["migrations"]


def test_plan_accepts_a_proxlb_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "swap.yaml"
    path.write_text(SCENARIO)
    code, out, _ = run(capsys, "plan", str(path), "--strategy", "optimal", "--format", "json")
    data = json.loads(out)
    assert code == 0
    final = {m["guest"]: m["target"] for m in data["moves"] if not m["parking"]}
    assert final == {"vm-a": "node-B", "vm-b": "node-A"}
    assert any(m["parking"] for m in data["moves"])  # the swap needs a temporary move


def test_proxlb_check_with_junit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "swap.yaml"
    path.write_text(SCENARIO)
    junit = tmp_path / "out.xml"
    code, out, _ = run(capsys, "proxlb", "check", str(path), "--junit", str(junit))
    assert code == 0 and "1 passed, 0 failed" in out
    import xml.etree.ElementTree as ET

    assert ET.parse(junit).getroot().find(".//testcase") is not None
    path.write_text(SCENARIO.replace("vm-a: node-B, vm-b: node-A", "vm-a: node-C"))
    code, out, _ = run(capsys, "proxlb", "check", str(path))
    assert code == 1 and "FAIL" in out


def test_proxlb_check_shared_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    if not COMPAT_SCENARIOS.is_dir():
        pytest.skip(f"{COMPAT_SCENARIOS} not present")
    code, out, _ = run(capsys, "proxlb", "check", str(COMPAT_SCENARIOS))
    assert code == 0, out
    assert out.rstrip().endswith(" 0 failed")


def test_plan_option_the_strategy_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "demo", "--strategy", "incus", "--target-spread", "0.1")
    assert code == 2 and err.startswith("error: --target-spread: strategy incus has no such option")


def test_plan_passes_any_strategy_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "plan", "demo", "--strategy", "incus", "-o", "threshold=95", "--format", "json"
    )
    data = json.loads(out)
    assert code == 0 and data["options"]["threshold"] == 95 and data["moves"] == []
    code, _, err = run(capsys, "plan", "demo", "-o", "nope=1")
    assert code == 2 and err.startswith("error: -o nope: strategy balance has no such option")
    code, _, err = run(capsys, "plan", "demo", "--strategy", "optimal", "-o", "balanciness=9")
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", SMALL, "-o", "wide=0"], "error: wide: expected a whole number ≥ 1"),
        (["plan", SMALL, "-o", "max_moves=1.5"], "error: max_moves: expected a whole number"),
        (["plan", SMALL, "-o", "swaps=yes"], "error: -o swaps: expected true or false"),
        (["plan", SMALL, "-o", "target_spread=abc"], "error: -o target_spread: expected a number"),
        (["plan", SMALL, "--strategy", "pve-topsis", "-o", "threshold=NaN"], "error: -o threshold"),
        (["plan", SMALL, "--max-parallel", "0"], "error: opendrs plan: argument --max-parallel"),
        (["proxlb", "check", SMALL, "--time-limit", "0"], "error: opendrs proxlb check: argument"),
        (["place", "demo", "--new", "cpu=1e308,memory=1G"], "error: --new: cpu: must be"),
        (["place", "demo", "--new", "cpu=1,memory=1G", "--failed"], "error: --failed goes with"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors end the process with the same format
        code = exc.code
    _out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1


def test_proxlb_check_empty_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "proxlb", "check", str(tmp_path))
    assert code == 2 and err.startswith(f"error: {tmp_path}: no scenario files")
