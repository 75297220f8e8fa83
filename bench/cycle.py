"""One daemon cycle, measured: how many models it builds, and how long it takes at scale.

``python -m bench.cycle counts [--scenario builtin:demo] [--json FILE]``
    Runs the controller (active mode, history in memory) against the simulator of the scenario
    until its first cycle that decides to act, and counts what that cycle built: clusters,
    per-guest value arrays, load models, capacity models, constraint sets, units (a guest or a
    hard-affinity bundle) — each by calls of the functions that build it (:data:`BUILDERS`; a
    function the code no longer has counts nothing and is listed as absent).

``python -m bench.cycle daemon [--size XXL] [--seed 1] [--rules] [--generator basic|skewed]``
``[--json FILE]``
    One daemon cycle — observe from the simulator, decide, plan — on a generated cluster
    (:mod:`bench.clusters`: the benchmark's generators) with the default policy deciding on one
    observation (hold 1, as ``opendrs run --once``), in a fresh subprocess: its wall time
    (observe, decide and the whole cycle) and the subprocess's peak RSS (the cluster included).
    The cluster's usage mode is ``static`` (the generator's), so the cycle balances configured
    sizes; the simulator observes the generated placement as it is.

The builders are named by where they live; the list keeps the names of earlier layouts too, so
that the same script counts the code before and after a move (names the code does not have are
listed as absent).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: What a cycle builds, and the functions that build it (``module:Attribute.path``).
BUILDERS: dict[str, tuple[str, ...]] = {
    "clusters": ("opendrs.model.cluster:Cluster.__init__",),
    "guest arrays": (
        "opendrs.engine.usage:guest_demand",
        "opendrs.engine.usage:_load_pairs",
        "opendrs.engine.constraints:current_assign",
        "opendrs.engine.constraints.constraint_set:current_assign",
    ),
    "load models": ("opendrs.engine.usage:LoadModel.build",),
    "capacity models": ("opendrs.engine.usage:CapacityModel.build",),
    "constraints": (
        "opendrs.engine.constraints:Constraints.build",
        "opendrs.engine.constraints.constraint_set:Constraints.build",
    ),
    "units": (
        "opendrs.engine.strategies.balance.state:build_units",
        "opendrs.engine.planner:_Planner._build_units",
        "opendrs.engine.planner.scheduler:Planner._build_units",
        "opendrs.engine.policy.repair:_first_units",
    ),
    "cycle views": ("opendrs.engine.view:CycleView.__init__",),
}


def _resolve(target: str) -> tuple[object, str] | None:
    """(owner, attribute name) of ``module:Attr.path``; ``None`` when the code has no such thing."""
    module_name, _, path = target.partition(":")
    try:
        owner: object = importlib.import_module(module_name)
    except ImportError:
        return None
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if name not in vars(owner):
        return None
    return owner, name


@contextmanager
def counting(builders: dict[str, tuple[str, ...]]) -> Iterator[tuple[Counter[str], list[str]]]:
    """Count calls of every builder while the block runs; yields (counts, absent targets)."""
    counts: Counter[str] = Counter()
    absent: list[str] = []
    patched: list[tuple[object, str, Any]] = []
    seen: set[tuple[int, str]] = set()
    for category, targets in builders.items():
        counts[category] = 0
        for target in targets:
            found = _resolve(target)
            if found is None:
                absent.append(target)
                continue
            owner, name = found
            if (id(owner), name) in seen:  # the same function under another name
                continue
            seen.add((id(owner), name))
            original = vars(owner)[name]
            patched.append((owner, name, original))
            setattr(owner, name, _counted(original, category, counts))
    try:
        yield counts, absent
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def _counted(original: Any, category: str, counts: Counter[str]) -> Any:
    if isinstance(original, classmethod | staticmethod):
        inner = original.__func__
        return type(original)(_counted(inner, category, counts))

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[category] += 1
        return original(*args, **kwargs)

    return wrapper


def count_acting_cycle(scenario_arg: str) -> dict[str, Any]:
    """Builds of the first acting cycle of the controller on ``scenario_arg``'s simulator."""
    from opendrs.backends.scenario import builtin_scenario, load_scenario
    from opendrs.backends.sim import Simulator
    from opendrs.cli.simulate import simulated_config
    from opendrs.controller.config import BackendConfig
    from opendrs.controller.history import History
    from opendrs.controller.loop import Controller
    from opendrs.engine.policy import PRESETS
    from opendrs.report.reasons import explain

    name = scenario_arg.removeprefix("builtin:")
    scenario = (
        builtin_scenario(name) if scenario_arg.startswith("builtin:") else load_scenario(name)
    )
    policy = PRESETS["opendrs"]
    sim = Simulator(scenario, threshold=policy.threshold)
    history = History(":memory:")
    controller = Controller(
        simulated_config(policy, "<bench>", BackendConfig("sim")), sim, sim, history
    )
    try:
        for _ in range(100_000):
            if sim.now() >= sim.end:
                break
            with counting(BUILDERS) as (counts, absent):
                cycle = controller.cycle()
            if cycle.decision is not None and cycle.decision.act:
                return {
                    "scenario": scenario_arg,
                    "at": cycle.at,
                    "decision": explain(cycle.decision),
                    "counts": dict(counts),
                    "absent": absent,
                }
            controller.executor.tick()
            sim.sleep(controller.policy.interval)
        raise SystemExit(f"{scenario_arg}: no cycle acted")
    finally:
        history.close()
        sim.close()


def daemon_cycle(size: str, seed: int, rules: bool, generator: str = "basic") -> dict[str, Any]:
    """One cycle of the controller on a generated cluster, timed (run in its own process)."""
    from bench.clusters import generated
    from bench.worker import peak_rss_bytes
    from opendrs.backends.scenario import Scenario
    from opendrs.backends.sim import Simulator
    from opendrs.cli.simulate import simulated_config
    from opendrs.controller.config import BackendConfig
    from opendrs.controller.history import History
    from opendrs.controller.loop import Controller
    from opendrs.engine.policy import PRESETS
    from opendrs.report.reasons import explain

    cluster = generated(generator, size, seed=seed, rules=rules)
    sim = Simulator(Scenario(cluster=cluster, name=f"{size}-{seed}"), days=1.0)
    # As ``opendrs run --once`` decides: one observation is enough (hold 1).
    policy = replace(PRESETS["opendrs"], hold=1)
    history = History(":memory:")
    controller = Controller(
        simulated_config(policy, "<bench>", BackendConfig("sim")), sim, sim, history
    )
    timings: dict[str, float] = {}
    controller.observe = _timed(controller.observe, timings, "observe")  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        cycle = controller.cycle()
        timings["cycle"] = time.perf_counter() - started
    finally:
        history.close()
        sim.close()
    decision = cycle.decision
    plan = decision.plan if decision is not None else None
    return {
        "size": size,
        "seed": seed,
        "rules": rules,
        "generator": generator,
        "observe_s": round(timings["observe"], 3),
        "cycle_s": round(timings["cycle"], 3),
        "decide_and_plan_s": round(timings["cycle"] - timings["observe"], 3),
        "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1),
        "migrations": len(plan.moves) if plan is not None else 0,
        "decision": explain(decision) if decision is not None else cycle.error,
    }


def _timed(function: Callable[[], Any], into: dict[str, float], key: str) -> Callable[[], Any]:
    def wrapper() -> Any:
        started = time.perf_counter()
        try:
            return function()
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - started

    return wrapper


def _in_subprocess(args: list[str]) -> dict[str, Any]:
    """Run this module's ``_daemon-child`` in a fresh interpreter; its JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.cycle", "_daemon-child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench.cycle daemon: the cycle failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cycle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    counts = sub.add_parser("counts", help="model builds of the first acting cycle")
    counts.add_argument("--scenario", default="builtin:demo")
    counts.add_argument("--json", metavar="FILE")
    daemon = sub.add_parser("daemon", help="one daemon cycle on a generated cluster, timed")
    child = sub.add_parser("_daemon-child")
    for p in (daemon, child):
        p.add_argument("--size", default="XXL")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--rules", action="store_true")
        p.add_argument("--generator", choices=("basic", "skewed"), default="basic")
    daemon.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.command == "_daemon-child":
        print(json.dumps(daemon_cycle(args.size, args.seed, args.rules, args.generator)))
        return 0
    if args.command == "counts":
        result = count_acting_cycle(args.scenario)
    else:
        flags = ["--size", args.size, "--seed", str(args.seed), "--generator", args.generator] + (
            ["--rules"] if args.rules else []
        )
        result = _in_subprocess(flags)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
