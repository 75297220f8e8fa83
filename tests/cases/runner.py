"""Cases as data: the daemon against the simulator, one folder per case, its log as the oracle.

In the style of pve-ha-manager's regression tests, each folder under ``tests/cases/`` holds

* ``README`` — one line: what the case shows;
* ``cluster.yaml`` — the cluster at time 0, a snapshot (docs/snapshot-format.md);
* ``policy.yaml`` — the daemon's ``policy``, ``executor`` and ``settings`` sections, exactly as in
  the configuration file (docs/configuration.md); may be empty (the defaults);
* ``events.yaml`` — how long the case runs and what happens meanwhile (load changes, node
  failures and returns, maintenance, migrations that fail, API errors);
* ``decisions.expect`` — the oracle: one line per decision that acts, per executor event
  (migration started, done, failed, skipped…), per node event and HA restart, with the simulated
  time, and the end state.

The runner drives the real :class:`~opendrs.controller.loop.Controller` (active mode, a history in
memory) against the :class:`~opendrs.backends.sim.Simulator` for the case's ``duration``, collects
those lines through the controller's ``on_cycle`` and the executor's ``on_event`` hooks and the
simulator's own records, and compares them with ``decisions.expect``. A missing expect file is
written for review and the case fails, so a missing oracle never passes.

Usage (from the repository root)::

    python -m tests.cases.runner                  # check every case
    python -m tests.cases.runner NAME [NAME…]     # check some (a name or a folder)
    python -m tests.cases.runner NAME --show      # print the lines, compare nothing
    python -m tests.cases.runner NAME --write     # rewrite the expect file after a wanted change

``OPENDRS_CASES_WRITE=1`` makes the pytest run (``tests/cases/test_cases.py``) rewrite the expect
files of the cases it runs instead of comparing. ``tests/cases/README.md`` describes each file.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml

from opendrs.backends.scenario import Fault, Scenario, loads_scenario
from opendrs.backends.sim import Simulator
from opendrs.backends.workload import Trace, TraceSeries
from opendrs.controller.config import Config, parse_config
from opendrs.controller.executor import Event
from opendrs.controller.history import History
from opendrs.controller.loop import Controller, Cycle
from opendrs.model.cluster import Cluster
from opendrs.model.document import DocumentError, Reader, describe, parse, read_file
from opendrs.model.document import Path as DocPath
from opendrs.model.snapshot import loads as load_snapshot
from opendrs.model.units import format_bytes, format_duration
from opendrs.report.reasons import explain

__all__ = [
    "CASES",
    "WRITE_ENV",
    "Case",
    "Outcome",
    "case_folders",
    "check",
    "load_case",
    "main",
    "run_case",
]

#: The folder of the cases.
CASES: Final = Path(__file__).resolve().parent
#: Set to 1 to make the pytest run rewrite the expect files instead of comparing.
WRITE_ENV: Final = "OPENDRS_CASES_WRITE"
EXPECT: Final = "decisions.expect"
KNOWN_BUG: Final = "KNOWN_BUG"
#: Lines of a diff shown at most.
DIFF_LINES: Final = 60
FILES: Final = ("README", "cluster.yaml", "policy.yaml", "events.yaml")

_POLICY_KEYS: Final = ("policy", "executor", "settings")
#: Keys of events.yaml handed to the scenario reader as they are (docs/scenarios.md).
_SCENARIO_KEYS: Final = ("seed", "step", "recovery_delay", "migration", "workloads")
_EVENTS_KEYS: Final = ("duration", *_SCENARIO_KEYS, "events")
#: Event type → the keys it may have besides ``at`` and itself.
_EVENT_TYPES: Final[Mapping[str, tuple[str, ...]]] = {
    "load": ("cpu", "memory", "every"),
    "node-failure": ("for",),
    "maintenance": ("for",),
    "migration-failure": (),
    "migration-hang": (),
    "api-lost-answer": (),
    "api-error": (),
    "restart": (),
}
#: Migration faults: the value is a guest id, or ``any``.
_MIGRATION_FAULTS: Final = ("migration-failure", "migration-hang", "api-lost-answer")


# --------------------------------------------------------------------------------------------
# Loading a case


@dataclass(frozen=True)
class Case:
    """A case folder, read and checked."""

    name: str
    folder: Path
    readme: str
    config: Config
    scenario: Scenario
    #: Lines for the events the simulator does not report itself (loads, migration faults, API).
    inputs: tuple[tuple[float, str], ...]
    #: When the daemon is restarted: a new controller on the same history (the process's memory
    #: — the usage window, the hold count, the executor's queue — is lost).
    restarts: tuple[float, ...] = ()
    #: The ``KNOWN_BUG`` line: the expect file is written by hand (what opendrs should do), the run
    #: is known to differ, and ``--write`` leaves the file alone.
    known_bug: str | None = None

    @property
    def expect(self) -> Path:
        return self.folder / EXPECT


def case_folders(root: Path = CASES) -> list[Path]:
    """Every case folder under ``root`` (a folder with an ``events.yaml``), by name."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "events.yaml").is_file())


def _folder(name: str) -> Path:
    path = Path(name)
    if path.is_dir():
        return path.resolve()
    if (CASES / name).is_dir():
        return CASES / name
    known = [p.name for p in case_folders()]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (cases: {', '.join(known)})"
    raise DocumentError(name, "", f"no such case{hint}")


def load_case(folder: str | os.PathLike[str]) -> Case:
    """Read a case folder; :class:`DocumentError` (one line) for any problem with its files."""
    path = _folder(os.fspath(folder))
    for file in FILES:
        if not (path / file).is_file():
            raise DocumentError(
                str(path / file), "", "missing: every case needs " + ", ".join(FILES)
            )
    readme = (path / "README").read_text(encoding="utf-8").strip()
    if not readme or "\n" in readme:
        raise DocumentError(str(path / "README"), "", "must be one line: what the case shows")
    filename, data = read_file(path / "cluster.yaml")
    cluster = load_snapshot(data, filename=filename)
    config = _config(path / "policy.yaml")
    scenario, inputs, restarts = _scenario(path / "events.yaml", cluster)
    return Case(path.name, path, readme, config, scenario, inputs, restarts, known_bug(path))


def known_bug(folder: Path) -> str | None:
    """The one line of the case's ``KNOWN_BUG`` file, or ``None`` when it has none."""
    path = folder / KNOWN_BUG
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").strip()
    if not text or "\n" in text:
        raise DocumentError(str(path), "", "must be one line: the bug the case shows")
    return text


def _config(path: Path) -> Config:
    """The daemon's configuration: active mode on the simulator, a history in memory, and the
    ``policy``, ``executor`` and ``settings`` of ``policy.yaml``, read by the configuration
    reader."""
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    reader = Reader(filename)
    sections = {} if document is None else dict(reader.mapping(document, ()))
    reader.check_keys(
        sections, (), _POLICY_KEYS, " (policy.yaml holds these configuration sections)"
    )
    config = parse_config(
        {"version": 1, "mode": "active", "backend": {"type": "sim"}, **sections},
        filename=filename,
    )
    return replace(config, history=":memory:", lock="")


def _scenario(
    path: Path, cluster: Cluster
) -> tuple[Scenario, tuple[tuple[float, str], ...], tuple[float, ...]]:
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    reader = Reader(filename)
    top = reader.mapping(document, ())
    reader.check_keys(top, (), _EVENTS_KEYS)
    reader.require(top, "duration", ())
    passed = {key: top[key] for key in ("duration", *_SCENARIO_KEYS) if key in top}
    scenario = loads_scenario(
        yaml.safe_dump({"version": 1, **passed}), filename=filename, cluster=cluster
    )
    events = reader.sequence(top.get("events") or [], ("events",))
    faults: list[Fault] = []
    loads: dict[str, list[tuple[float, float | None, int | None]]] = {}
    inputs: list[tuple[float, str]] = []
    restarts: list[float] = []
    for index, item in enumerate(events):
        where: DocPath = ("events", index)
        event = reader.mapping(item, where)
        kinds = [k for k in event if k in _EVENT_TYPES]
        if len(kinds) != 1:
            found = f"found {', '.join(map(str, kinds))}" if kinds else "found none"
            reader.fail(where, f"give exactly one of {', '.join(_EVENT_TYPES)} ({found})")
        kind = kinds[0]
        reader.check_keys(event, where, ("at", kind, *_EVENT_TYPES[kind]), f" for a {kind} event")
        at = float(reader.duration(reader.require(event, "at", where), (*where, "at")))
        if at >= scenario.duration:
            reader.fail(
                (*where, "at"), f"is not before the end of the case ({describe(top['duration'])})"
            )
        value = event[kind]
        if kind == "load":
            guests = value if isinstance(value, list) else [value]
            if "cpu" not in event and "memory" not in event:
                reader.fail(where, "a load event needs cpu (cores), memory (a size) or both")
            cpu = reader.number(event["cpu"], (*where, "cpu")) if "cpu" in event else None
            memory = reader.size(event["memory"], (*where, "memory")) if "memory" in event else None
            ids = [_guest(reader, g, (*where, kind), cluster) for g in guests]
            every = (
                float(reader.duration(event["every"], (*where, "every"), minimum=1))
                if "every" in event
                else None
            )
            times = [at]
            while every is not None and times[-1] + every < scenario.duration:
                times.append(times[-1] + every)
            for gid in ids:
                loads.setdefault(gid, []).extend((t, cpu, memory) for t in times)
            what = ", ".join(
                p
                for p in (
                    f"cpu {cpu:g}" if cpu is not None else "",
                    f"memory {format_bytes(memory)}" if memory is not None else "",
                    f"again every {format_duration(int(every))}" if every is not None else "",
                )
                if p
            )
            inputs.append((at, f"load {' '.join(ids)}: {what}"))
        elif kind in ("node-failure", "maintenance"):
            node = reader.text(value, (*where, kind), allow_int=True)
            if node not in cluster.node_index:
                reader.fail((*where, kind), f"unknown node {describe(node)}")
            duration = (
                float(reader.duration(event["for"], (*where, "for"), minimum=1))
                if event.get("for") is not None
                else None
            )
            if kind == "maintenance" and duration is None:
                reader.fail(where, "a maintenance event needs `for` (how long it lasts)")
            faults.append(Fault(kind, at=at, node=node, duration=duration))  # type: ignore[arg-type]
        elif kind in _MIGRATION_FAULTS:
            target = reader.text(value, (*where, kind), allow_int=True)
            guest = None if target == "any" else _guest(reader, target, (*where, kind), cluster)
            faults.append(Fault(kind, at=at, guest=guest))  # type: ignore[arg-type]
            whose = "any guest" if guest is None else guest
            inputs.append((at, f"{kind} armed for the next migration of {whose}"))
        elif kind == "restart":
            if value != "daemon":
                reader.fail((*where, kind), f"expected 'daemon', got {describe(value)}")
            restarts.append(at)
            inputs.append((at, "daemon restarts (same history)"))
        else:  # api-error: how long the API fails
            duration = float(reader.duration(value, (*where, kind), minimum=1))
            faults.append(Fault("api-error", at=at, duration=duration))
            inputs.append((at, f"api-error: every call fails for {format_duration(int(duration))}"))
    trace = _trace(filename, loads, cluster) if loads else None
    scenario = replace(
        scenario, name=path.parent.name, faults=(*scenario.faults, *faults), trace=trace
    )
    return scenario, tuple(inputs), tuple(sorted(set(restarts)))


def _guest(reader: Reader, value: object, where: DocPath, cluster: Cluster) -> str:
    gid = reader.text(value, where, allow_int=True)
    if gid not in cluster.guest_index:
        reader.fail(where, f"unknown guest {describe(gid)}")
    return gid


def _trace(
    filename: str,
    loads: Mapping[str, list[tuple[float, float | None, int | None]]],
    cluster: Cluster,
) -> Trace:
    """The load events as a trace: each holds until the guest's next; a resource an event leaves
    out keeps its value (at first the snapshot's measured use, else the configured size)."""
    series: list[TraceSeries] = []
    for guest in cluster.guests:
        if guest.id not in loads:
            continue
        cpu = guest.cpu_used if guest.cpu_used is not None else guest.cpu
        memory = guest.memory_used if guest.memory_used is not None else guest.memory
        times: list[float] = []
        cpus: list[float] = []
        memories: list[int] = []
        for at, new_cpu, new_memory in sorted(loads[guest.id], key=lambda e: e[0]):
            cpu = cpu if new_cpu is None else new_cpu
            memory = memory if new_memory is None else new_memory
            if times and times[-1] == at:
                cpus[-1], memories[-1] = cpu, memory
                continue
            times.append(at)
            cpus.append(cpu)
            memories.append(memory)
        series.append(TraceSeries(guest.id, tuple(times), tuple(cpus), tuple(memories)))
    return Trace(filename, tuple(series))


# --------------------------------------------------------------------------------------------
# Running a case


def clock(seconds: float) -> str:
    """Simulated time as ``HH:MM:SS`` (hours count on past 24), with a fraction if there is one."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    fraction = seconds - whole
    if fraction > 1e-9:
        text += f"{fraction:.3f}"[1:].rstrip("0")
    return text


def _event_line(event: Event) -> str:
    if event.move is None:
        return (
            f"executor {event.kind}: {event.detail}" if event.detail else f"executor {event.kind}"
        )
    move = event.move
    head = f"migrate {move.guest} {move.source} -> {move.target} {event.kind}"
    if not event.detail:
        return head
    if event.kind in ("started", "done"):
        return f"{head} ({event.detail})"
    return f"{head}: {event.detail}"


def run_case(case: Case) -> list[str]:
    """Run the controller over the case; the lines of its log, in time order."""
    sim = Simulator(case.scenario, threshold=case.config.policy.threshold)
    history = History(":memory:")
    # (time, group, sequence): the world's events first at a given instant, then the controller's.
    lines: list[tuple[float, int, float, str]] = []
    # Where the lines of the cycle under way begin: its decision is shown before the migrations
    # it started (``on_cycle`` is called once the plan is handed to the executor).
    mark = [0.0]

    def add(at: float, group: int, text: str, seq: float | None = None) -> None:
        lines.append((at, group, len(lines) if seq is None else seq, text))

    stuck: list[tuple[tuple[str, str], ...]] = [()]

    def on_cycle(cycle: Cycle) -> None:
        texts: list[str] = []
        decision = cycle.decision
        if cycle.error is not None:
            texts.append(f"observe failed: {cycle.error}")
        elif decision is not None:
            if decision.act:
                reason = explain(decision).removeprefix(f"{decision.kind}: ")
                texts.append(f"decision {decision.kind}: {reason}")
            # A stuck repair is logged at every decision: shown here when it changes.
            if decision.stuck != stuck[0] and not explain(decision).startswith("a plan is still"):
                texts.extend(f"stuck {guest}: {why}" for guest, why in decision.stuck)
                if not decision.stuck:
                    texts.append("stuck: none any more")
                stuck[0] = decision.stuck
        for k, text in enumerate(texts):
            add(cycle.at, 2, text, mark[0] - 1 + (k + 1) / (len(texts) + 1))

    def on_event(event: Event) -> None:
        add(event.at, 2, _event_line(event))

    def start() -> Controller:
        controller = Controller(
            case.config, sim, sim, history, on_event=on_event, on_cycle=on_cycle
        )
        cycle = controller.cycle

        def marked_cycle(**kwargs: Any) -> Cycle:
            mark[0] = len(lines)
            return cycle(**kwargs)

        controller.cycle = marked_cycle  # type: ignore[method-assign]
        return controller

    try:
        for until in (*case.restarts, sim.end):
            # A restart: the old process is gone at ``until``; the new one reconciles what the
            # history lists in flight and decides at once.
            start().run(until=until)
        for at, text in case.inputs:
            add(at, 0, f"event {text}")
        for node_event in sim.events:
            what = node_event.kind.replace("-", " ")
            by = "" if node_event.cause == "fault" else f" (by the {node_event.cause})"
            add(node_event.time, 0, f"node {node_event.node} {what}{by}")
        for record in sim.migrations:
            if record.cause == "recovery":
                add(
                    record.started,
                    1,
                    f"ha-restart {record.guest} {record.source} -> {record.target}",
                )
            elif record.cause == "failback":
                add(
                    record.started,
                    1,
                    f"ha-failback {record.guest} {record.source} -> {record.target}",
                )
        lines.sort(key=lambda line: line[:3])
        timed = [f"{clock(at)} {text}" for at, _group, _seq, text in lines]
        timed.extend(_end_lines(sim))
        return timed
    finally:
        history.close()
        sim.close()


def _end_lines(sim: Simulator) -> list[str]:
    """Where every guest is at the end, node by node, and the run's counts."""
    at = clock(sim.now())
    cluster = sim.peek()
    out: list[str] = []
    for node in cluster.nodes:
        flags = [
            f for f, on in (("offline", not node.online), ("maintenance", node.maintenance)) if on
        ]
        guests = [
            g.id + ("" if g.state == "running" else f"({g.state})")
            for g in cluster.guests
            if g.node == node.name
        ]
        state = f" ({', '.join(flags)})" if flags else ""
        out.append(f"{at} end {node.name}{state}: {' '.join(guests) if guests else '-'}")
    stats = sim.stats()
    ours = [r for r in sim.migrations if r.cause == "controller"]
    done = sum(1 for r in ours if r.outcome == "done")
    failed = sum(1 for r in ours if r.outcome == "failed")
    restarts = sum(1 for r in sim.migrations if r.cause == "recovery")
    violations = _count(stats.capacity_violations, "capacity violation")
    out.append(
        f"{at} end: {_count(len(ours), 'migration')} ({done} done, {failed} failed), "
        f"{_count(restarts, 'HA restart')}, {violations}"
    )
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


# --------------------------------------------------------------------------------------------
# Checking a case


@dataclass(frozen=True)
class Outcome:
    """What checking one case found.

    ``ok``: the run matches the expect file (or it was rewritten on request). ``known_bug``: the
    case has a ``KNOWN_BUG`` file — a mismatch is then the known bug, and a match means the bug is
    fixed (the file must go). ``message`` says which, with the diff of a mismatch.
    """

    name: str
    ok: bool
    message: str
    lines: tuple[str, ...]
    known_bug: bool = False

    @property
    def passed(self) -> bool:
        """Nothing to do: a match without a known bug, or the known bug's mismatch."""
        return self.ok != self.known_bug


def render(lines: Sequence[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def check(folder: str | os.PathLike[str], *, write: bool = False) -> Outcome:
    """Run a case and compare its lines with its expect file.

    ``write``: (re)write the expect file with what the run gave, and pass — except for a case with
    a ``KNOWN_BUG``, whose expect file is written by hand. A missing expect file is written for
    review, and the case fails.
    """
    case = load_case(folder)
    lines = tuple(run_case(case))
    text = render(lines)
    bug = case.known_bug
    if not case.expect.is_file() and bug is not None:
        return Outcome(
            case.name,
            False,
            f"{case.name}: {EXPECT} is missing: a case with a {KNOWN_BUG} needs one written by "
            f"hand (what opendrs should do); this run gave:\n{text}",
            lines,
        )
    if not case.expect.is_file():
        case.expect.write_text(text, encoding="utf-8")
        return Outcome(
            case.name,
            False,
            f"{case.name}: {EXPECT} was missing: written to {case.expect} for review — read it, "
            f"check that it shows what the README says ({case.readme}), and commit it",
            lines,
        )
    if write and bug is None:
        case.expect.write_text(text, encoding="utf-8")
        return Outcome(case.name, True, f"{case.name}: wrote {case.expect}", lines)
    expected = case.expect.read_text(encoding="utf-8")
    if expected == text:
        if bug is not None:
            message = (
                f"{case.name}: matches: the known bug is fixed, delete {case.folder / KNOWN_BUG}"
            )
            return Outcome(case.name, True, message, lines, known_bug=True)
        return Outcome(case.name, True, f"{case.name}: ok", lines)
    diff = _diff(case.name, expected, text)
    if bug is not None:
        return Outcome(
            case.name,
            False,
            f"{case.name}: known bug ({bug}): the run differs from {EXPECT}, written by hand "
            f"(not rewritten by --write).\n{diff}",
            lines,
            known_bug=True,
        )
    return Outcome(
        case.name,
        False,
        f"{case.name}: the run differs from {EXPECT} ({case.readme}).\n{diff}"
        f"If the change is wanted: python -m tests.cases.runner {case.name} --write "
        f"(or {WRITE_ENV}=1 for the pytest run), and review the new file.",
        lines,
    )


def _diff(name: str, expected: str, text: str, limit: int = DIFF_LINES) -> str:
    lines = list(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"{name}/{EXPECT}",
            tofile=f"{name} (this run)",
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"… ({len(lines) - limit} more lines of the diff)\n"]
    return "".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cases.runner",
        description="Run opendrs's behaviour cases (tests/cases/NAME) and compare each with its "
        "decisions.expect.",
    )
    parser.add_argument(
        "cases", nargs="*", metavar="CASE", help="a case name or folder (default: all)"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the expect files")
    group.add_argument("--show", action="store_true", help="print the lines, compare nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="the daemon's log on stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s"
    )
    names = args.cases or [str(p) for p in case_folders()]
    failures = 0
    for name in names:
        try:
            if args.show:
                out(render(run_case(load_case(name))).rstrip("\n"))
                continue
            outcome = check(name, write=args.write)
        except DocumentError as exc:
            out(f"error: {exc}")
            return 2
        out(outcome.message)
        failures += not outcome.passed
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
