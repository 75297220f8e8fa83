"""Run one benchmark case in a fresh process: ``python -m bench.worker SPEC_JSON OUT_JSON``.

The runner starts one worker per case so that each case's peak memory is its own: the worker
imports what the case needs, generates the cluster, records its peak RSS so far (*setup*), runs
the case once — timed with ``time.perf_counter`` around the decision only — and records the peak
RSS again (the kernel's high-water mark ``VmHWM``: the whole process, OR-Tools' native memory and
threads included; see :func:`peak_rss_bytes`). Nothing is traced, so the same run gives both the
time and the memory.

``SPEC_JSON`` is a :class:`Spec` as JSON; the result (:func:`run_case`) is written to ``OUT_JSON``
(stdout is left to whatever the peers print).
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bench.clusters import generated
from opendrs.model.cluster import Cluster

RunnerKind = Literal["strategy", "peer"]


@dataclass(frozen=True)
class Spec:
    """One case: which cluster, and which runner with which options."""

    size: str
    seed: int
    rules: bool
    kind: RunnerKind
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    #: A proxlb-solver balancing method: the cluster is then the generated one written as a
    #: scenario with that method and imported (:mod:`bench.scenario`).
    method: str | None = None
    #: The cluster generator (:data:`bench.clusters.GENERATORS`).
    generator: str = "basic"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Spec:
        return cls(**json.loads(text))


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """Peak resident set size of a process in bytes (``VmHWM``), or None when unreadable.

    ``VmHWM`` belongs to the process's address space, which ``exec`` replaces, so it is the
    worker's own peak. ``getrusage``'s ``ru_maxrss`` is not: Linux carries it across fork and
    exec, so a worker would report at least its parent's size. Where ``/proc`` is missing (not
    Linux) this falls back to ``ru_maxrss`` for the calling process.
    """
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if pid != "self":
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(usage) * (1 if sys.platform == "darwin" else 1024)


def _prepare(spec: Spec) -> Callable[[Cluster], dict[str, Any]]:
    """Import the runner's code; return a callable that runs the case on a cluster."""
    if spec.kind == "strategy":
        from opendrs.engine.strategies import get_strategy

        strategy = get_strategy(spec.name)

        def run_strategy(cluster: Cluster) -> dict[str, Any]:
            start = time.perf_counter()
            proposal = strategy.propose(cluster, options=spec.options)
            seconds = time.perf_counter() - start
            return {
                "placement": {m.guest: m.target for m in proposal.net_moves()},
                "seconds": seconds,
                "info": {"stopped": proposal.stopped, "cost": proposal.total_cost},
                "notes": list(proposal.notes),
            }

        return run_strategy
    from bench.peers import PEERS

    if spec.name not in PEERS:
        raise ValueError(f"unknown peer {spec.name!r} (known: {', '.join(PEERS)})")
    module = importlib.import_module(PEERS[spec.name])
    # Import the peer itself (OR-Tools, pydantic models) before the setup memory mark.
    importlib.import_module(module.ENTRY_MODULE)

    def run_peer(cluster: Cluster) -> dict[str, Any]:
        result = module.run(cluster, **spec.options)
        return {
            "placement": dict(result.placement),
            "seconds": result.seconds,
            "info": dict(result.info),
            "notes": list(result.notes),
        }

    return run_peer


def case_cluster(spec: Spec) -> Cluster:
    """The cluster of a case: generated, or generated and imported as a scenario."""
    if spec.method is not None:
        from bench.scenario import scenario_cluster

        return scenario_cluster(spec.size, seed=spec.seed, rules=spec.rules, method=spec.method)
    return generated(spec.generator, spec.size, seed=spec.seed, rules=spec.rules)


def run_case(spec: Spec) -> dict[str, Any]:
    """Run ``spec`` once; the result with ``rss_setup`` and ``rss_peak`` in bytes."""
    runner = _prepare(spec)
    cluster = case_cluster(spec)
    setup = peak_rss_bytes()
    result = runner(cluster)
    result["rss_setup"] = setup
    result["rss_peak"] = peak_rss_bytes()
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.worker SPEC_JSON OUT_JSON", file=sys.stderr)
        return 2
    spec = Spec.from_json(args[0])
    result = run_case(spec)
    with open(args[1], "w", encoding="utf-8") as out:
        json.dump(result, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
