"""The command line driven from outside with input its authors did not write: hand-made hostile
snapshots and flags, random snapshots (valid, and broken at a random place), and the real entry
point in processes. Whatever comes in, the answer is a plan that is safe (no node over its
capacity in any step, no move to a node that takes no guests, no hard rule broken that held), the
same bytes every time, or one line and exit status 2 — never a traceback, never a silent wrong
reading."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon import opendrs
from opendrs.cli.main import main
from opendrs.model.snapshot import dumps, loads

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2
TWO_NODES = "version: 1\nnodes: {a: {cpu: 4, memory: 8GiB}, b: {cpu: 4, memory: 8GiB}}\n"


def run(*argv: str) -> tuple[int, str, str]:
    """``opendrs ARGV`` in this process: exit status, standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def refused(*argv: str) -> str:
    """The one line ``opendrs ARGV`` refuses its input with (exit status 2, nothing on stdout)."""
    code, out, err = run(*argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


# -- silent wrong readings -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        (
            "version: 1\nnodes: {a: {cpu: 4, memory: 64}}\n",
            "nodes.a.memory: 64 bytes is not a memory size: a bare number is bytes; write 64MiB "
            "or 64GiB (or 64B if bytes are meant)",
        ),
        (
            TWO_NODES + "guests:\n  - {id: 1, node: a, memory: 4096}\n",
            "guests[0].memory: 4096 bytes is not a memory size: a bare number is bytes; write "
            "4096MiB or 4096GiB",
        ),
        (  # a number written as text (as Proxmox's API writes some) is the same bare number
            TWO_NODES + 'guests:\n  - {id: 1, node: a, memory: " 4096 "}\n',
            "guests[0].memory: 4096 bytes is not a memory size",
        ),
        (
            TWO_NODES + 'guests:\n  - {id: 1, node: a, memory: "2048", ha: true}\n',
            "guests[0].memory: 2048 bytes is not a memory size",
        ),
        (  # a guest of another shape than the common one is read by the full reader
            TWO_NODES + "guests:\n  - {id: 1, node: a, memory: 2048, ha: true}\n",
            "guests[0].memory: 2048 bytes is not a memory size",
        ),
        (
            "version: 1\nnodes: {a: {cpu: 4, memory: 8GiB, reserve: {memory: 512}}}\n",
            "nodes.a.reserve.memory: 512 bytes is not a memory size",
        ),
        (
            TWO_NODES.replace("nodes:", "settings: {reserve: {memory: 2048}}\nnodes:"),
            "settings.reserve.memory: 2048 bytes is not a memory size",
        ),
    ],
)
def test_a_memory_size_that_lost_its_unit_is_refused_with_the_fix(
    tmp_path: Path, snapshot: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(snapshot)
    for command in ("validate", "plan"):
        assert message in refused(command, str(path))


def test_a_configurations_reserve_that_lost_its_unit_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        f"version: 1\nbackend: {{type: file, path: {ROOT / 'examples' / 'small.yaml'}}}\n"
        "settings: {reserve: {memory: 4096}}\n"
    )
    assert refused("validate", "--config", str(config)) == (
        f"error: {config}: settings.reserve.memory: 4096 bytes is not a memory size: a bare "
        "number is bytes; write 4096MiB or 4096GiB (or 4096B if bytes are meant)\n"
    )


def test_a_memory_size_in_bytes_or_with_a_unit_is_read() -> None:
    cluster = loads(
        "version: 1\nnodes: {a: {cpu: 4, memory: 8589934592}, b: {cpu: 4, memory: 8GiB}}\n"
        "guests:\n  - {id: 1, node: a, memory: 4096MiB}\n  - {id: 2, node: b, memory: 1048576}\n"
        "  - {id: 3, node: b, memory: 1000B}\n  - {id: 4, kind: ct, state: stopped, node: b, "
        "memory: 0}\n",
        filename="s.yaml",
    )
    assert [node.memory for node in cluster.nodes] == [8 * GIB, 8 * GIB]
    assert [guest.memory for guest in cluster.guests] == [4096 * MIB, MIB, 1000, 0]
    assert dumps(cluster).count("memory: 1000B") == 1  # written with its unit, read back
    assert loads(dumps(cluster), filename="s.yaml") == cluster


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--max-moves", "1", "-O", "max_moves=3"),
            "error: -O max_moves=3: max_moves is already set by --max-moves: give it once",
        ),
        (
            ("--target-spread", "5%", "-O", "target_spread=0.1"),
            "error: -O target_spread=0.1: target_spread is already set by --target-spread: give "
            "it once",
        ),
        (
            ("-O", "margin=0", "-O", "margin=0.2"),
            "error: -O margin=0.2: margin is already set by -O margin=0: give it once",
        ),
        (("-O", "=1"), "error: -O: '=1' is not NAME=VALUE"),
    ],
)
def test_a_strategy_option_given_twice_is_refused(options: tuple[str, ...], message: str) -> None:
    assert refused("plan", "demo", *options) == message + "\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("memory=1G,arch=", "error: --new: arch: must not be empty"),
        ("memory=1G,name=a\x1b[31mb", "error: --new: name: must be printable"),
        ("memory=1G,id=" + "9" * 300, "error: --new: id: must be at most 255 characters"),
    ],
)
def test_a_new_guests_names_are_held_to_a_snapshots_rules(spec: str, message: str) -> None:
    assert refused("place", "demo", "--new", spec).startswith(message)


# -- one clear line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        (
            '{"version": 1, "nodes": {"a": {"cpu": 4, "memory": 1' + "0" * 5000 + "}}}",
            ".json",
            "cannot read a value: a number of 5001 digits (at most 4300)\n",
        ),
        (
            "version: 1\nnodes: {a: {cpu: 4, memory: 8GiB}}\n",
            ".json",
            "line 1, column 1: Expecting value (the file's name ends in .json, so it is read as "
            "JSON; YAML needs another name)\n",
        ),
        (
            "version: 1\nnodes: {2024-01-01: {cpu: 4, memory: 8GiB}}\n",
            ".yaml",
            "nodes.2024-01-01: expected a name or a number, got the date 2024-01-01 (quote it)\n",
        ),
        (
            "version: 1\nnodes: {a: {cpu: 1e3, memory: 8GiB}}\n",
            ".yaml",
            "nodes.a.cpu: expected a number, got '1e3' (text, not a number: write 1000 without "
            "quotes)\n",
        ),
        (
            "version: 1\nnodes: {a: {cpu: 1e300, memory: 8GiB}}\n",
            ".yaml",
            "(text, not a number: write 1.0e+300 without quotes)\n",
        ),
        (
            "version: 1\nnodes: {a: {cpu: '8', memory: 8GiB}}\n",
            ".yaml",
            "nodes.a.cpu: expected a number, got '8' (text, not a number: write 8 without "
            "quotes)\n",
        ),
    ],
)
def test_a_value_the_file_cannot_hold_says_what_to_write(
    tmp_path: Path, text: str, suffix: str, message: str
) -> None:
    path = tmp_path / f"s{suffix}"
    path.write_text(text)
    assert refused("validate", str(path)).endswith(message)


def test_a_whole_number_too_large_says_the_largest() -> None:
    err = refused("plan", "demo", "--max-moves", "9" * 23)
    assert err == f"error: --max-moves: must be at most 2147483647, got {'9' * 23}\n"


def test_validate_counts_in_words(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(
        "version: 1\nnodes: {a: {cpu: 4, memory: 8GiB}}\nguests:\n  - {id: 1, node: a, "
        "memory: 1GiB}\n"
    )
    assert run("validate", str(path)) == (0, f"{path}: valid (1 node, 1 guest, 0 rules)\n", "")


# -- random snapshots: a safe plan, the same bytes, or one line --------------------------------


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """A small snapshot, static or dynamic: nodes offline or in maintenance, pinned, stopped and HA
    guests, names that repeat or look like ids, hard and soft rules on distinct running guests
    (no two rules share a guest: none contradicts another, so the engine drops none)."""
    nodes: dict[str, dict[str, Any]] = {}
    for i in range(draw(st.integers(1, 5))):
        node: dict[str, Any] = {"cpu": draw(st.sampled_from([1, 2, 4, 8]))}
        node["memory"] = f"{draw(st.sampled_from([2, 4, 8, 16]))}GiB"
        node.update(draw(st.sampled_from([{}, {}, {}, {"maintenance": True}, {"online": False}])))
        nodes[f"n{i}"] = node
    guests: list[dict[str, Any]] = []
    for j in range(draw(st.integers(0, 10))):
        guest: dict[str, Any] = {"id": 100 + j, "node": draw(st.sampled_from(sorted(nodes)))}
        guest["cpu"] = draw(st.sampled_from([1, 2, 4]))
        guest["memory"] = f"{draw(st.sampled_from([256, 1024, 2048, 4096]))}MiB"
        guest["uptime"] = "1d"
        guest.update(
            draw(
                st.sampled_from(
                    [{}, {}, {"devices": ["hostpci0"]}, {"ha": True}, {"state": "stopped"}]
                )
            )
        )
        if draw(st.integers(0, 3)) == 0:
            guest["name"] = draw(st.sampled_from(["web", "ünï", "100", "x" * 255]))
        guests.append(guest)
    running = [g["id"] for g in guests if g.get("state") != "stopped"]
    free = draw(st.permutations(running))
    rules: list[dict[str, Any]] = []
    while len(free) >= 2 and draw(st.booleans()):
        kind = draw(st.sampled_from(["affinity", "anti-affinity", "node-affinity", "ignore"]))
        size = draw(st.integers(1 if kind in ("node-affinity", "ignore") else 2, len(free)))
        members, free = free[:size], free[size:]
        rule: dict[str, Any] = {"type": kind, "guests": members}
        if kind == "node-affinity":
            rule["nodes"] = draw(st.lists(st.sampled_from(sorted(nodes)), min_size=1, unique=True))
            rule["strict"] = draw(st.booleans())
        elif kind != "ignore":
            rule["hard"] = draw(st.booleans())
        rules.append(rule)
    settings = {"mode": draw(st.sampled_from(["static", "dynamic"]))}
    settings["cpu_overcommit"] = draw(st.sampled_from([1, 4]))
    if settings["mode"] == "dynamic":  # measured use, the hosts' own too
        for guest in guests:
            guest["usage"] = {"cpu": draw(st.sampled_from([0, 0.5, 2])), "memory": "200MiB"}
        for node in nodes.values():
            node["usage"] = draw(st.sampled_from([{}, {"cpu": 0.2, "memory": "512MiB"}]))
    return {"version": 1, "settings": settings, "nodes": nodes, "guests": guests, "rules": rules}


class PlanCheck:
    """An account of a snapshot's plan independent of the engine: what each node carries in
    every step (a guest migrating loads both its nodes) of configured vCPUs and memory, hard in
    every mode, and the hard rules' state."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.nodes: dict[str, dict[str, Any]] = snapshot["nodes"]
        self.guests = {str(g["id"]): g for g in snapshot["guests"]}
        self.place = {str(g["id"]): g["node"] for g in snapshot["guests"]}

    def loads(self, incoming: list[tuple[str, str]]) -> dict[str, tuple[float, int]]:
        cpu = dict.fromkeys(self.nodes, 0.0)
        memory = dict.fromkeys(self.nodes, 0)
        for guest_id, node in [*self.place.items(), *incoming]:
            guest = self.guests[guest_id]
            if guest.get("state", "running") == "running":
                cpu[node] += guest["cpu"]
                memory[node] += int(guest["memory"].removesuffix("MiB")) * MIB
        return {name: (cpu[name], memory[name]) for name in self.nodes}

    def over(self, incoming: list[tuple[str, str]]) -> set[str]:
        overcommit = self.snapshot["settings"]["cpu_overcommit"]
        return {
            name
            for name, (cpu, memory) in self.loads(incoming).items()
            if cpu > self.nodes[name]["cpu"] * overcommit
            or memory > int(self.nodes[name]["memory"].removesuffix("GiB")) * GIB
        }

    def held(self) -> set[int]:
        """The hard rules (by index) the placement keeps."""
        kept = set()
        for index, rule in enumerate(self.snapshot["rules"]):
            on = [self.place[str(g)] for g in rule["guests"]]
            keeps = {
                "anti-affinity": rule.get("hard") and len(set(on)) == len(on),
                "affinity": rule.get("hard") and len(set(on)) == 1,
                "node-affinity": rule.get("strict") and set(on) <= set(rule.get("nodes", ())),
            }
            if keeps.get(rule["type"]):
                kept.add(index)
        return kept

    def follow(self, moves: list[dict[str, Any]]) -> None:
        """Play the moves step by step, checking each against the snapshot."""
        over_before, held_before = self.over([]), self.held()
        for step in sorted({move["step"] for move in moves}):
            these = [move for move in moves if move["step"] == step]
            for move in these:
                guest, target = self.guests[move["guest"]], self.nodes[move["target"]]
                assert self.place[move["guest"]] == move["source"], move
                assert target.get("online", True) and not target.get("maintenance"), move
                assert "devices" not in guest, move  # a local device ties it to its node
            incoming = [(move["guest"], move["target"]) for move in these]
            assert self.over(incoming) <= over_before, (step, self.loads(incoming))
            for move in these:
                self.place[move["guest"]] = move["target"]
        assert held_before <= self.held(), (held_before, self.held())


STRATEGIES = ["balance", "static-greedy", "pve-topsis", "proxlb-greedy", "incus", "drs-pressure"]


@pytest.mark.parametrize("strategy", [*STRATEGIES, "pve-bruteforce", "optimal"])
def test_a_cluster_without_guests_unbalanced_by_its_hosts_has_nothing_to_move(
    tmp_path: Path, strategy: str
) -> None:
    """The hosts' own load makes the spread; no guest can even it out: no move, no crash."""
    path = tmp_path / "empty.yaml"
    path.write_text(
        "version: 1\nnodes:\n  a: {cpu: 1, memory: 2GiB}\n"
        "  b: {cpu: 1, memory: 2GiB, usage: {cpu: 0.5, memory: 512MiB}}\n"
    )
    code, out, err = run("plan", str(path), "--strategy", strategy, "--format", "json")
    assert (code, err) == (0, "") and json.loads(out)["moves"] == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from(STRATEGIES))
def test_a_random_snapshots_plan_is_safe_and_the_same_every_time(
    tmp_path_factory: pytest.TempPathFactory, snapshot: dict[str, Any], strategy: str
) -> None:
    path = tmp_path_factory.mktemp("random") / "s.json"
    path.write_text(json.dumps(snapshot))
    first = run("plan", str(path), "--strategy", strategy, "--format", "json")
    assert first[0] in (0, 1) and "error" not in first[2], first[2]
    assert run("plan", str(path), "--strategy", strategy, "--format", "json") == first
    PlanCheck(snapshot).follow(json.loads(first[1])["moves"])
    evacuated = run("place", str(path), "--evacuate", "n0", "--format", "json")
    assert evacuated[0] in (0, 1) and "error" not in evacuated[2], evacuated[2]


#: Values put in a random place of a valid snapshot: each of a type or range some field refuses.
ODD_VALUES = [None, -1, 0, "", " ", "x", [], {}, 1.5, 1e308, True, "1e3", 2**70, "-1GiB", "n0"]


def _places(document: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``document``, but the document itself."""
    paths = [where] if where else []
    if isinstance(document, dict):
        for key, value in document.items():
            paths += _places(value, (*where, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            paths += _places(value, (*where, index))
    return paths


@st.composite
def broken_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """A valid snapshot with one to three values replaced, keys removed or keys added."""
    document = draw(snapshots())
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(_places(document)))
        parent = document
        for part in where[:-1]:
            parent = parent[part]
        change = draw(st.sampled_from(["set", "remove", "add"]))
        if change == "set":
            parent[where[-1]] = draw(st.sampled_from(ODD_VALUES))
        elif change == "remove":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            key = draw(st.sampled_from(["extra", "cpu", "ha", "hard", "reserve", "migrating_to"]))
            parent[key] = draw(st.sampled_from(ODD_VALUES))
    return document


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_snapshots(), st.sampled_from(["show", "plan", "headroom", "place", "validate"]))
def test_a_broken_snapshot_is_one_line_or_a_plan(
    tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any], command: str
) -> None:
    path = tmp_path_factory.mktemp("broken") / "s.json"
    path.write_text(json.dumps(document))
    argv = {"place": ["place", str(path), "--evacuate", "n0"]}.get(command, [command, str(path)])
    code, _, err = run(*argv)
    assert code in (0, 1, 2) and "internal error" not in err, err
    if code == 2 and err.startswith("error: "):
        assert err.count("\n") == 1, err
    elif code == 2:  # validate: rules dropped, one line each
        assert command == "validate" and all(
            line.startswith(f"{path}: rules: ") for line in err.splitlines()
        )


# -- the real entry point ----------------------------------------------------------------------


def test_the_same_plan_in_two_processes_is_the_same_bytes(tmp_path: Path) -> None:
    """Two processes hash strings differently (their hash seeds differ): the plan may not."""
    done = [
        opendrs(
            "plan",
            "demo",
            "--format",
            "json",
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=120,
        )
        for seed in ("1", "2")
    ]
    assert done[0].returncode == 0 and done[0].stderr == ""
    assert done[0].stdout == done[1].stdout


def test_hostile_files_in_a_process_are_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text(TWO_NODES + "guests:\n  - {id: 1, node: a, memory: 4096}\n")
    for argv, message in (
        (("plan", str(tmp_path)), f"error: {tmp_path}: cannot read the file: Is a directory\n"),
        (("plan", str(bare)), f"error: {bare}: guests[0].memory: 4096 bytes is not a memory"),
    ):
        done = opendrs(*argv, timeout=120)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_a_scenarios_bandwidth_that_lost_its_unit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text((ROOT / "examples" / "small.yaml").read_text())
    scenario = tmp_path / "week.yaml"
    scenario.write_text(
        "version: 1\ncluster: small.yaml\nduration: 1d\nmigration: {bandwidth: 1000}\n"
    )
    assert refused("simulate", str(scenario), "--no-progress") == (
        f"error: {scenario}: migration.bandwidth: 1000 bytes per second is not a migration's "
        "bandwidth: a bare number is bytes; write 1000MiB/s or 1000MB/s (or 1000B/s if bytes are "
        "meant)\n"
    )
    for written in ('"1000"', "1000/s"):  # as text, or with '/s' but no size unit
        scenario.write_text(
            f"version: 1\ncluster: small.yaml\nduration: 1d\nmigration: {{bandwidth: {written}}}\n"
        )
        assert "1000 bytes per second is not a migration's bandwidth" in refused(
            "simulate", str(scenario), "--no-progress"
        )
    scenario.write_text(
        "version: 1\ncluster: small.yaml\nduration: 1d\nmigration: {bandwidth: 1048576}\n"
    )
    code, _, err = run(
        "simulate", str(scenario), "--days", "0.01", "--no-progress", "--policy", "opendrs"
    )
    assert code == 0, err


def test_a_configuration_whose_input_file_cannot_be_read_is_refused_by_validate(
    tmp_path: Path,
) -> None:
    """What ``run`` would refuse (a scenario that is not there) or never read (a directory as
    the snapshot), ``validate --config`` refuses first; a snapshot still to come is fine."""
    config = tmp_path / "opendrs.yaml"
    for backend, message in (
        (
            "{type: sim, scenario: gone.yaml}",
            f"backend.scenario: {tmp_path}/gone.yaml: no such file",
        ),
        (
            f"{{type: file, path: {tmp_path}}}",
            f"backend.path: {tmp_path} is a directory, not a file",
        ),
    ):
        config.write_text(f"version: 1\nbackend: {backend}\n")
        assert refused("validate", "--config", str(config)) == f"error: {config}: {message}\n"
    config.write_text("version: 1\nbackend: {type: file, path: later.yaml}\n")
    assert run("validate", "--config", str(config))[0] == 0


def test_a_command_that_reads_only_the_history_does_not_need_the_scenario(tmp_path: Path) -> None:
    """The scenario a simulated daemon ran is gone: ``history`` still reads what it recorded
    (here: names the missing history, not the scenario it never reads)."""
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "version: 1\nbackend: {type: sim, scenario: gone.yaml}\nhistory: kept.sqlite\n"
    )
    err = refused("history", "--config", str(config))
    assert "kept.sqlite" in err and "gone.yaml" not in err, err


def into_full_disk(*args: str) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS > /dev/full``: a full disk under standard output."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "opendrs", *args],
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )


def test_a_file_the_command_writes_on_a_full_disk_is_its_own_error() -> None:
    """``opendrs init -o FILE`` onto a full disk (``/dev/full``), its standard output full too:
    the file it could not write is named (exit status 2), not the output."""
    done = into_full_disk("init", "--platform", "proxmox", "-o", "/dev/full", "--force")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: --output: cannot write /dev/full: No space left on device"
    ], done.stderr


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (OSError(errno.EIO, "Input/output error"), "a file: Input/output error"),
        (OSError(errno.ENOSPC, "No space left on device", "x.yaml"), "x.yaml: No space left"),
    ],
)
def test_a_failed_read_or_write_of_another_file_is_not_the_output(
    monkeypatch: pytest.MonkeyPatch, error: OSError, said: str
) -> None:
    """An I/O error that did not come from writing standard output (reading the snapshot here)
    is not said to be the output's, and standard output is left as it is."""

    def failing(path: str) -> None:
        raise error

    monkeypatch.setattr("opendrs.cli.cluster_command.read_cluster", failing)
    code, out, err = run("show", "snapshot.yaml")
    assert code == 1 and out == "", (code, err)
    assert err.startswith(f"error: cannot read or write {said}") and err.count("\n") == 1, err


@pytest.mark.parametrize("args", [("strategies",), ("show", "demo", "--format", "json")])
def test_an_output_that_cannot_be_written_is_one_line_and_no_bug(args: tuple[str, ...]) -> None:
    """``opendrs … > file`` on a full disk (``/dev/full``): the disk's problem, said in one line
    with exit status 1, not an internal error of opendrs."""
    done = into_full_disk(*args)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "error: cannot write the output: No space left on device"
    ], done.stderr
