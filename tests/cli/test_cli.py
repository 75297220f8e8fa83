"""The command line: every command, JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendrs.cli.main import main

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
    assert code == 0 and out.startswith("Placement of guest db-replica (101) (balance)")
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
    assert "What opendrs did over 0.5 simulated days of the demo cluster" in out
    assert " done " in out  # migrations as they happen


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "/nonexistent/x.yaml"], "error: /nonexistent/x.yaml: cannot read the file"),
        (["place", "demo", "--guest", "nope"], "error: --guest: no guest 'nope' (by id or name)"),
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
        [sys.executable, "-m", "opendrs", "show", "/nonexistent.yaml"],
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
    # Both guests break their pins: the plan is the repair the daemon makes first, with any
    # strategy (vm-a to the free node-C, then vm-b to the node vm-a left), in a safe order.
    assert code == 0 and data["strategy"] == "repair" and data["stuck"] == []
    assert [(m["step"], m["guest"], m["target"]) for m in data["moves"]] == [
        (1, "vm-a", "node-C"),
        (2, "vm-b", "node-A"),
    ]


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
        capsys, "plan", "demo", "--strategy", "incus", "-O", "threshold=95", "--format", "json"
    )
    data = json.loads(out)
    assert code == 0 and data["options"]["threshold"] == 95 and data["moves"] == []
    code, _, err = run(capsys, "plan", "demo", "-O", "nope=1")
    assert code == 2 and err.startswith("error: -O nope: strategy balance has no such option")
    code, _, err = run(capsys, "plan", "demo", "--strategy", "optimal", "-O", "balanciness=9")
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", SMALL, "-O", "wide=0"], "error: wide: expected a whole number ≥ 1"),
        (["plan", SMALL, "-O", "max_moves=1.5"], "error: max_moves: expected a whole number"),
        (["plan", SMALL, "-O", "swaps=yes"], "error: -O swaps: expected true or false"),
        (["plan", SMALL, "-O", "target_spread=abc"], "error: -O target_spread: cannot read"),
        (["plan", SMALL, "--strategy", "pve-topsis", "-O", "threshold=NaN"], "error: -O threshold"),
        (["plan", SMALL, "--max-parallel", "0"], "error: opendrs plan: argument --max-parallel"),
        (["proxlb", "check", SMALL, "--time-limit", "0"], "error: opendrs proxlb check: argument"),
        (["place", "demo", "--new", "cpu=1e308,memory=1G"], "error: --new: cpu: must be"),
        (["place", "demo", "--new", "cpu=1,memory=1G", "--failed"], "error: --failed goes with"),
        (["plan", SMALL, "-O", "wide=100000000000"], "error: -O wide: must be at most 2147483647"),
        (
            ["plan", SMALL, "-O", "target_spread=1e300"],
            "error: -O target_spread: must be a fraction from 0 to 1",
        ),
        (["place", "demo", "--new", "cpu=1,memory=9PiB"], "error: --new: memory: size too large"),
        (
            ["place", "demo", "--new", "cpu=1,memory=1G,cpu_used=1e300"],
            "error: --new: cpu_used: must be at most 100000",
        ),
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


# --------------------------------------------------------------------------------------------
# Input out of range is refused when read; a strategy's own error is a bug, not bad input.

TWO_NODES = "version: 1\nnodes:\n  a: {cpu: 8, memory: 16GiB}\n  b: {cpu: 8, memory: 16GiB}\n"


def _snapshot(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            TWO_NODES.replace("a: {cpu: 8,", "a: {cpu: 8, reserve: {cpu: 8},"),
            "nodes.a.reserve.cpu",
            "must be less than the node's cpu (node 'a' has 8 cores), got 8",
        ),
        (
            TWO_NODES.replace("b: {cpu: 8,", "b: {reserve: {memory: 32GiB}, cpu: 8,"),
            "nodes.b.reserve.memory",
            "must be less than the node's memory (node 'b' has 16GiB), got 32GiB",
        ),
        (
            TWO_NODES + "settings: {reserve: {cpu: 8}}\n",
            "settings.reserve.cpu",
            "must be less than the node's cpu (node 'a' has 8 cores), got 8",
        ),
    ],
)
@pytest.mark.parametrize("command", [["validate"], ["show", "--format", "json"], ["show"]])
def test_a_reserve_that_takes_a_whole_node_is_refused(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    text: str,
    field: str,
    reason: str,
    command: list[str],
) -> None:
    path = _snapshot(tmp_path, text)
    code, out, err = run(capsys, command[0], path, *command[1:])
    assert code == 2 and out == ""
    assert err == f"error: {path}: {field}: {reason}\n"


def test_json_output_never_holds_inf_or_nan(capsys: pytest.CaptureFixture[str]) -> None:
    from opendrs.cli.output import dump_json

    dump_json({"load": {"cpu": float("inf"), "memory": float("nan")}, "x": [1.5, -float("inf")]})
    out = capsys.readouterr().out
    assert json.loads(out) == {"load": {"cpu": None, "memory": None}, "x": [1.5, None]}
    assert "Infinity" not in out and "NaN" not in out


HUGE = (
    "version: 1\n"
    "settings: {mode: dynamic}\n"
    "nodes:\n  a: {cpu: 1.0e+15, memory: 8PiB}\n  b: {cpu: 1.0e+15, memory: 8PiB}\n"
    "guests:\n"
    "  - {id: 1, node: a, cpu: 2, memory: 4PiB, usage: {cpu: 1.0e+14, memory: 4PiB}}\n"
)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (HUGE, "nodes.a.cpu"),
        (HUGE.replace("1.0e+15", "64"), "guests[0].usage.cpu"),
        (
            TWO_NODES + "guests:\n  - {id: 1, node: a, cpu: 1.0e+15, memory: 1GiB}\n",
            "guests[0].cpu",
        ),
        (TWO_NODES + "settings: {cpu_overcommit: 1.0e+15}\n", "settings.cpu_overcommit"),
        (TWO_NODES.replace("cpu: 8", "cpu: 1.0e-300", 1), "nodes.a.cpu"),
        (
            TWO_NODES + "guests:\n  - {id: 1, node: a, memory: 1GiB, uptime: 1.0e+300}\n",
            "guests[0].uptime",
        ),
    ],
)
@pytest.mark.parametrize("strategy", ["optimal", "balance"])
def test_numbers_out_of_physical_range_are_refused_when_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, field: str, strategy: str
) -> None:
    path = _snapshot(tmp_path, text)
    code, out, err = run(capsys, "plan", path, "--strategy", strategy, "--format", "json")
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: {field}: ") and err.count("\n") == 1, err


def test_a_proxlb_scenario_out_of_range_is_refused_when_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _snapshot(
        tmp_path,
        SCENARIO.replace(
            "cpu_total: 16, memory_total_gb: 64}", "cpu_total: 1.0e+15, memory_total_gb: 64}", 1
        ),
    )
    code, out, err = run(capsys, "plan", path, "--strategy", "optimal")
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: nodes.node-A.cpu_total: ") and err.count("\n") == 1


@pytest.mark.parametrize("error", [ValueError("bad\nthing"), RuntimeError("pybind11"), KeyError(3)])
def test_a_strategys_internal_error_is_a_bug_not_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    from opendrs.engine.strategies import REGISTRY, StrategyInfo

    real = REGISTRY["balance"]

    class Broken:  # the same name and options
        name, summary, Options = real.name, real.summary, real.options

        def propose(self, view: Any, request: Any, options: Any) -> Any:
            if len(view.cluster.guests) > 2:  # the demo, not a trial of the options
                raise error
            return real.strategy.propose(view, request, options)

    monkeypatch.setitem(REGISTRY, "balance", StrategyInfo(Broken()))
    code, out, err = run(capsys, "plan", "demo", "-O", "wide=8")
    assert code == 1 and out == ""
    assert err.startswith("error: internal error (a bug in opendrs, please report it): ")
    assert type(error).__name__ in err and err.count("\n") == 1 and "Traceback" not in err
    code, out, err = run(capsys, "--debug", "plan", "demo")
    assert code == 1 and "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].startswith("error: internal error")
    # An option the strategy refuses is still a usage error.
    code, out, err = run(capsys, "plan", "demo", "-O", "wide=0")
    assert code == 2 and err.startswith("error: wide: expected a whole number ≥ 1")


def test_an_internal_error_as_a_process_is_one_line() -> None:
    code = (
        "import sys\n"
        "from opendrs.engine.strategies import REGISTRY, StrategyInfo\n"
        "real = REGISTRY['balance']\n"
        "class Broken:\n"
        "    name, summary, Options = real.name, real.summary, real.options\n"
        "    def propose(self, view, request, options):\n"
        "        raise RuntimeError('Unable to cast Python instance of type int to C++ type')\n"
        "REGISTRY['balance'] = StrategyInfo(Broken())\n"
        "from opendrs.cli.main import main\n"
        "sys.exit(main(['plan', 'demo']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: internal error (a bug in opendrs, please report it): ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


_EXTREMES = st.sampled_from(
    [
        0,
        -1,
        1e-300,
        5e-324,
        0.5,
        3,
        99_999.5,
        100_000,
        1e15,
        1e300,
        2**53,
        2**63,
        10**400,
        float("inf"),
        -float("inf"),
        float("nan"),
        "8PiB",
        "9PiB",
        "1B",
        "1.0e+15",
    ]
)
_FUZZ_BASE = {
    "version": 1,
    "settings": {"mode": "dynamic", "allow_local_disks": True},
    "nodes": {
        "a": {"cpu": 8, "memory": "32GiB", "storage": {"lvm": "1TiB"}},
        "b": {"cpu": 8, "memory": "32GiB", "storage": {"lvm": "1TiB"}},
        "c": {"cpu": 4, "memory": "16GiB"},
    },
    "guests": [
        {
            "id": 1,
            "node": "a",
            "cpu": 2,
            "memory": "4GiB",
            "usage": {"cpu": 1, "memory": "2GiB"},
            "disks": [{"pool": "lvm", "size": "10GiB"}],
        },
        {"id": 2, "node": "a", "cpu": 2, "memory": "4GiB", "usage": {"cpu": 1.5}},
        {"id": 3, "node": "a", "cpu": 1, "memory": "2GiB", "uptime": 100},
        {"id": 4, "node": "b", "cpu": 1, "memory": "1GiB"},
    ],
}
_FUZZ_FIELDS = [
    ("nodes", "a", "cpu"),
    ("nodes", "a", "memory"),
    ("nodes", "b", "cpu"),
    ("nodes", "c", "memory"),
    ("nodes", "a", "storage", "lvm"),
    ("guests", 0, "cpu"),
    ("guests", 0, "memory"),
    ("guests", 0, "usage", "cpu"),
    ("guests", 0, "usage", "memory"),
    ("guests", 1, "usage", "cpu"),
    ("guests", 0, "disks", 0, "size"),
    ("guests", 2, "uptime"),
    ("settings", "cpu_overcommit"),
    ("settings", "memory_overcommit"),
    ("settings", "min_uptime"),
    ("nodes", "a", "usage"),
    ("nodes", "b", "reserve"),
    ("settings", "reserve"),
    ("settings", "weights"),
    ("settings", "migration"),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_FUZZ_FIELDS), _EXTREMES), min_size=1, max_size=3))
def test_extreme_numbers_never_end_in_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[tuple[Any, ...], Any]]
) -> None:
    import contextlib
    import copy
    import io

    document: Any = copy.deepcopy(_FUZZ_BASE)
    for where, value in changes:
        target = document
        for part in where[:-1]:
            target = target[part]
        key = where[-1]
        if key in ("usage", "reserve"):
            value = {"cpu" if not isinstance(value, str) else "memory": value}
        elif key == "weights":
            value = {"cpu": value}
        elif key == "migration":
            value = {"cost_unit" if isinstance(value, str) else "cost_disk_factor": value}
        target[key] = value
    path = tmp_path_factory.mktemp("extreme") / "s.json"
    path.write_text(json.dumps(document, allow_nan=True))
    for argv in (
        ["plan", str(path), "--format", "json"],
        ["show", str(path), "--format", "json"],
        ["place", str(path), "--evacuate", "a", "--format", "json"],
    ):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
        assert "internal error" not in err.getvalue(), (argv, err.getvalue())
        if code == 2:
            assert err.getvalue().startswith(f"error: {path}: ") and err.getvalue().count("\n") == 1
            break  # the file is refused: by every command alike
        assert code in (0, 1)
        json.loads(out.getvalue())
