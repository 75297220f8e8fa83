"""Where the strategy stopped, through the daemon as a process: its log, ``history`` and
``status`` say a plan cut to the policy's batch (a proposal in manual mode too), a return from
maintenance and a repair toward the failover headroom in words, and ``history --format json``
and the decision log carry the stop as its code and details."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import opendrs as opendrs_package
from daemon import opendrs, run_once, write_sim_config
from opendrs.cli.main import _exit_code

#: Where the built-in demo scenario and its cluster lie.
DEMO = Path(opendrs_package.__file__).parent / "data" / "scenarios"
CUT = "1 pass over the guests done; cut to 2 of"
BACK = "the evacuated guests go back to their nodes after maintenance"


def _maintenance_scenario(directory: Path) -> Path:
    """The built-in demo, its cluster named where it lies, no migration failing, and pve1 in
    maintenance from the first hour to the second."""
    text = (DEMO / "demo.yaml").read_text()
    text = text.replace("cluster: demo-cluster.yaml", f"cluster: '{DEMO / 'demo-cluster.yaml'}'")
    text = text.replace("failure_rate: 0.02", "failure_rate: 0.0")
    scenario = directory / "scenario.yaml"
    scenario.write_text(
        text + "faults:\n  - {type: maintenance, node: pve1, at: 1h, duration: 1h}\n"
    )
    return scenario


def _run(config: Path) -> str:
    done = opendrs("run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return done.stderr


def _decisions(config: Path) -> list[dict[str, object]]:
    data = json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout)
    return list(data["decisions"])


def _cut_config(directory: Path, mode: str) -> Path:
    """The demo's first decision, by static-greedy with no margin, in ``mode``: a plan cut to a
    batch of 2 (the last decision, which ``status`` shows)."""
    config = write_sim_config(directory, days=0.003)
    text = config.read_text().replace("mode: active", f"mode: {mode}")
    config.write_text(
        text.replace(
            "policy: {interval: 5m,",
            "policy: {strategy: static-greedy, batch: 2, margin: 0, interval: 5m,",
        )
    )
    return config


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    config = _cut_config(tmp_path_factory.mktemp("cut"), "active")
    return config, _run(config)


def test_a_proposal_in_manual_mode_says_the_cut_in_words(tmp_path: Path) -> None:
    config = _cut_config(tmp_path, "manual")
    _run(config)
    data = json.loads(opendrs("proposals", "--config", str(config), "--format", "json").stdout)
    [proposal] = data["proposals"]
    reason = proposal["reason"]
    assert f"with 2 migrations ({CUT} " in reason
    assert reason.endswith(" migrations by the policy's batch of 2)")
    shown = opendrs("proposals", "--config", str(config), columns=1000).stdout
    assert f"  {reason}\n" in shown


@pytest.fixture(scope="module")
def returned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Three hours of the demo with pve1 in maintenance for one, its guests brought back."""
    directory = tmp_path_factory.mktemp("return")
    config = write_sim_config(directory, days=0.125)
    scenario = _maintenance_scenario(directory)
    text = config.read_text().replace("'builtin:demo'", f"'{scenario}'")
    config.write_text(text.replace("smoothing: 0}", "smoothing: 0, maintenance_return: true}"))
    return config, _run(config)


def test_a_plan_cut_to_the_batch_is_logged_with_the_strategys_stop(
    cut: tuple[Path, str],
) -> None:
    _config, log = cut
    plans = [line for line in log.splitlines() if " INFO    decision (active): " in line]
    assert plans and all(f"migrations ({CUT} " in line for line in plans)
    assert all(line.endswith("migrations by the policy's batch of 2)") for line in plans)


def test_history_and_status_say_the_cut_and_json_has_its_code(cut: tuple[Path, str]) -> None:
    config, _log = cut
    decisions = _decisions(config)
    assert decisions and all(d["code"] == "plan" for d in decisions)
    for d in decisions:
        stop = d["stop"]
        assert isinstance(stop, dict) and stop["code"] == "batch_cut"
        assert (stop["kept"], stop["limit"], stop["batch"]) == (2, "batch", 2)
        assert stop["parts"] == [{"code": "passes_done", "passes": 1}]
        assert f"({CUT} {stop['proposed']} migrations by the policy's batch of 2)" in d["reason"]
    written = [json.loads(line) for line in (config.parent / "decisions.jsonl").open()]
    assert [d["stop"] for d in written if d["kind"] == "decision"] == [d["stop"] for d in decisions]
    history = opendrs("history", "--config", str(config), columns=1000).stdout
    assert history.count(CUT) == len(decisions)
    status = opendrs("status", "--config", str(config), columns=1000).stdout
    assert f"{decisions[-1]['reason']}" in status and CUT in status


def test_a_return_from_maintenance_says_where_the_plan_stopped(
    returned: tuple[Path, str],
) -> None:
    config, log = returned
    said = [line for line in log.splitlines() if "out of maintenance" in line]
    assert len(said) == 1 and said[0].endswith(f"bypassing threshold, hold and margin ({BACK})")
    back = [d for d in _decisions(config) if d["code"] == "return"]
    assert len(back) == 1
    moves = len(back[0]["moves"])
    assert back[0]["stop"] == {"code": "returned", "migrations": moves}
    assert back[0]["reason"].startswith(f"{moves} guests back to pve1, out of maintenance")
    history = opendrs("history", "--config", str(config), columns=1000).stdout
    assert BACK in history


def _short_of_failover() -> str:
    """Three nodes of 32 GiB. When a fails, db (101, HA, 12 GiB) finds room on no node (b and c
    have 6 and 8 GiB free); one 6 GiB guest moved from c to a leaves c room for either HA guest.
    """
    guests = [("101", "a", 12, True), ("102", "b", 12, True), ("103", "a", 14, False)]
    guests += [("104", "b", 14, False)] + [(str(105 + i), "c", 6, False) for i in range(4)]
    return json.dumps(
        {
            "version": 1,
            "name": "lab",
            "settings": {"mode": "static"},
            "nodes": {n: {"cpu": 16, "memory": "32GiB"} for n in "abc"},
            "guests": [
                {"id": i, "node": n, "memory": f"{gib}GiB", "cpu": 2, "ha": ha, "uptime": 86400}
                for i, n, gib, ha in guests
            ],
        }
    )


CLOSER = "(the moves bring the cluster closer to its failover headroom)"


def test_a_repair_toward_the_failover_headroom_says_so_in_log_history_and_status(
    tmp_path: Path,
) -> None:
    (tmp_path / "lab.json").write_text(_short_of_failover())
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "backend: {type: file, path: lab.json}\n"
        "history: history.sqlite\n"
        "policy: {interval: 1s, hold: 1, smoothing: 0, keep_failover: 1}\n"
    )
    done = run_once(config)
    assert done.returncode == 0, done.stderr
    said = (
        "repair: failover headroom: no, 1 HA guest cannot restart when a fails; 1 migration, "
        f"bypassing threshold, hold and margin {CLOSER}"
    )
    assert f"INFO    decision (shadow): {said}\n" in done.stderr
    [decision] = _decisions(config)
    assert decision["code"] == "repair" and decision["reason"] == said
    assert decision["stop"] == {"code": "failover_closer", "migrations": 1}
    assert CLOSER in opendrs("history", "--config", str(config), columns=1000).stdout
    status = opendrs("status", "--config", str(config), columns=1000).stdout
    assert f"(shadow, repair, 1 move): {said}" in status


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("cannot go on", 1, "cannot go on\n")],
)
def test_a_run_ended_by_system_exit_has_the_status_python_would_give(
    code: object, status: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # What main() ends with when a command left a request computing (it cannot re-raise).
    assert _exit_code(SystemExit(code)) == status
    assert capsys.readouterr().err == said
