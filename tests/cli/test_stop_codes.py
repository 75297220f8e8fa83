"""Every strategy says why it stopped as a code with its details (``stop`` in ``plan --format
json``) and in plain words to the operator (``Stopped:`` of the text), the engine's own sentence
left to ``--verbose`` and JSON's ``stopped``; through the command as a process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon import opendrs
from opendrs.engine.strategies.base import STOP_CODES
from opendrs.engine.strategies.registry import REGISTRY
from repairs import write

#: The stop of each strategy on the built-in demo, as code and details (its figures rounded).
DEMO_STOPS = {
    "static-greedy": {"code": "passes_done", "passes": 1},
    "incus": {"code": "by_arch", "parts": [{"code": "move_limit", "arch": "x86_64"}]},
    "drs-pressure": {"code": "no_bad_guest", "cpu_pressure": 0.75},
    "proxlb-greedy": {"code": "every_group_visited"},
    "pve-bruteforce": {"code": "below_threshold", "measure": "imbalance", "threshold": 0.3},
    "pve-topsis": {"code": "below_threshold", "measure": "imbalance", "threshold": 0.3},
}

#: What each says, in words, on the demo.
DEMO_WORDS = {
    "static-greedy": "Stopped: 1 pass over the guests done",
    "incus": "Stopped: x86_64: the limit of 1 migration (--max-moves) stopped the search",
    "drs-pressure": "Stopped: no guest needs relief: none has a CPU pressure above 75 %",
    "proxlb-greedy": "Stopped: every guest of the busiest nodes was considered",
    "pve-bruteforce": "Stopped: the imbalance of the nodes' loads (their coefficient of "
    "variation) is now 0.292, at or below the threshold of 0.3",
}


def _plan(*argv: str) -> dict[str, Any]:
    done = opendrs("plan", *argv, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def _contains(stop: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether ``stop`` has every key of ``expected`` with its value (parts part by part)."""
    for key, value in expected.items():
        if key == "parts":
            parts = stop.get("parts", [])
            if len(parts) != len(value) or not all(map(_contains, parts, value)):
                return False
        elif stop.get(key) != value:
            return False
    return True


def _codes(stop: dict[str, Any]) -> list[dict[str, Any]]:
    return [stop, *(p for part in stop.get("parts", []) for p in _codes(part))]


@pytest.mark.parametrize("strategy", sorted(DEMO_STOPS))
def test_each_strategy_gives_a_code_and_its_details(strategy: str) -> None:
    first, again = _plan("demo", "--strategy", strategy), _plan("demo", "--strategy", strategy)
    stop = first["stop"]
    assert _contains(stop, DEMO_STOPS[strategy]), stop
    assert stop == again["stop"]  # deterministic
    for each in _codes(stop):
        assert each["code"] in STOP_CODES
        assert set(STOP_CODES[each["code"]]) <= set(each) - {"code"}, each
    assert first["stopped"] and first["stopped"] != stop["code"]  # the engine's own sentence


@pytest.mark.parametrize("strategy", sorted(DEMO_WORDS))
def test_each_strategy_says_its_stop_in_words(strategy: str) -> None:
    plain = opendrs("plan", "demo", "--strategy", strategy, columns=200)
    assert plain.returncode in (0, 1), plain.stderr
    (stopped,) = [line for line in plain.stdout.splitlines() if line.startswith("Stopped:")]
    assert stopped.startswith(DEMO_WORDS[strategy]), stopped
    engine = _plan("demo", "--strategy", strategy)["stopped"]
    assert engine not in stopped
    verbose = opendrs("plan", "demo", "--strategy", strategy, "--verbose", columns=200).stdout
    assert f"(engine: {engine};" in verbose


def test_the_optimal_strategy_says_what_its_search_found() -> None:
    stop = _plan("demo", "--strategy", "optimal", "--option", "workers=1")["stop"]
    assert stop["code"] in ("solved", "current_best") and stop["proven"] in (0, 1)
    text = opendrs("plan", "demo", "--strategy", "optimal", "--option", "workers=1", columns=200)
    (stopped,) = [line for line in text.stdout.splitlines() if line.startswith("Stopped:")]
    assert stopped.startswith("Stopped: the best placement") and "e+" not in stopped


def test_a_repair_says_it_is_only_the_repairs(tmp_path: Path) -> None:
    path = str(write(tmp_path, "maintenance"))
    stop = _plan(path, "--strategy", "pve-topsis")["stop"]
    assert stop == {"code": "repairs_only", "strategy": "pve-topsis"}
    text = opendrs("plan", path, "--strategy", "pve-topsis", columns=200).stdout
    assert (
        "Stopped: only the repairs, which the daemon makes first with any strategy: pve-topsis is "
        "asked once nothing that may move breaks a hard rule" in text
    )


def test_every_strategy_is_covered() -> None:
    assert set(REGISTRY) - {"balance"} == set(DEMO_STOPS) | {"optimal"}


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_the_vcpu_commitments_goal_is_named_in_static_mode_only(mode: str, tmp_path: Path) -> None:
    small = Path(__file__).resolve().parents[2] / "examples" / "small.yaml"
    snapshot = tmp_path / "small.yaml"
    snapshot.write_text(small.read_text().replace("mode: dynamic", f"mode: {mode}", 1))
    stop = _plan(str(snapshot), "-O", "margin=0", "-O", "target_spread=0.2")["stop"]
    assert stop["code"] == "balanced"
    assert ("cpu_commit_spread" in stop) is (mode == "static"), stop
    said = opendrs("plan", str(snapshot), "-O", "margin=0", "-O", "target_spread=0.2").stdout
    assert ("vCPU commitments" in " ".join(said.split())) is (mode == "static"), said
