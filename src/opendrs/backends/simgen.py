"""Generates the snapshots of the built-in simulator scenarios (``opendrs/data/scenarios``).

``python -m opendrs.backends.simgen`` rewrites ``month-cluster.yaml`` and ``demo-cluster.yaml``
beside ``month.yaml`` and ``demo.yaml``; the output is deterministic (a fixed seed), and a test
checks that the shipped files are what this module generates. The scenarios themselves
(workloads by tag, faults) are written by hand.

Both clusters are deliberately unbalanced: the guests are packed onto a few nodes (up to a share of
their memory) and the rest spread thinly, while every hard rule holds and no node is over its
configured capacity — a scheduler only has to make things better, never repair them. Spread
evenly, the workloads of ``month.yaml`` peak well below capacity, even with a node down.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings
from opendrs.model.rules import GuestAffinity, Rules
from opendrs.model.snapshot import dumps

GiB = 1024**3

__all__ = [
    "MONTH_KINDS",
    "GuestKind",
    "db_pairs",
    "demo_cluster",
    "main",
    "make_guests",
    "month_cluster",
    "place_guests",
]


@dataclass(frozen=True)
class GuestKind:
    """A kind of guest: tag, count, vCPU and memory choices, typical measured use, HA."""

    tag: str
    count: int
    vcpus: tuple[int, ...]
    memory_gib: tuple[int, ...]
    cpu_use: float
    memory_use: float
    ha: bool = True


MONTH_KINDS = (
    GuestKind("web", 100, (2, 2, 4), (4, 4, 8), 0.25, 0.55),
    GuestKind("app", 80, (2, 4, 4), (8, 8, 16), 0.25, 0.6),
    GuestKind("db", 30, (4, 8), (24, 32, 48), 0.3, 0.85),
    GuestKind("batch", 40, (4, 8), (8, 16), 0.1, 0.4),
    GuestKind("ci", 40, (4, 4, 8), (8,), 0.1, 0.3),
    GuestKind("cache", 30, (2,), (16, 24), 0.15, 0.45),
    GuestKind("analytics", 20, (8,), (32, 48), 0.3, 0.6),
    GuestKind("infra", 30, (1, 2), (2, 4), 0.15, 0.5),
    GuestKind("dev", 30, (2, 4), (4, 8), 0.1, 0.4, ha=False),
)

DEMO_KINDS = (
    GuestKind("web", 24, (2, 4), (4, 8), 0.3, 0.55),
    GuestKind("app", 18, (4,), (8, 16), 0.3, 0.6),
    GuestKind("db", 8, (4, 8), (16, 32), 0.35, 0.85),
    GuestKind("batch", 10, (4, 8), (8, 16), 0.1, 0.4),
    GuestKind("ci", 10, (4,), (8,), 0.1, 0.3),
    GuestKind("dev", 10, (2,), (4,), 0.1, 0.4, ha=False),
)


def make_guests(
    rng: np.random.Generator, kinds: tuple[GuestKind, ...], first_id: int
) -> list[Guest]:
    guests: list[Guest] = []
    vmid = first_id
    for kind in kinds:
        for number in range(1, kind.count + 1):
            cpu = int(rng.choice(kind.vcpus))
            memory = int(rng.choice(kind.memory_gib)) * GiB
            cpu_use = round(cpu * kind.cpu_use * float(rng.uniform(0.7, 1.3)), 2)
            memory_use = int(memory * min(kind.memory_use * float(rng.uniform(0.85, 1.15)), 1.0))
            guests.append(
                Guest(
                    id=str(vmid),
                    node="",
                    name=f"{kind.tag}-{number:03d}",
                    cpu=float(cpu),
                    memory=memory,
                    disks=(Disk("ceph", int(rng.choice((32, 64, 128))) * GiB, shared=True),),
                    cpu_used=min(cpu_use, float(cpu)),
                    memory_used=memory_use // (64 * 1024**2) * (64 * 1024**2),
                    uptime=int(rng.integers(1, 90)) * 86400 + int(rng.integers(0, 86400)),
                    ha=kind.ha,
                    ha_state="started" if kind.ha else None,
                    tags=(kind.tag,),
                )
            )
            vmid += 1
    return guests


def place_guests(
    rng: np.random.Generator,
    guests: list[Guest],
    nodes: tuple[Node, ...],
    settings: Settings,
    hot: int,
    fill: float,
    apart: list[tuple[str, ...]],
) -> list[Guest]:
    """Pack shuffled guests onto the first ``hot`` nodes up to ``fill`` of their memory, then
    spread the rest over the other nodes (least filled first); ``apart`` groups never share, and
    no node gets more vCPUs than its cores (net of reserves) × ``settings.cpu_overcommit``."""
    limit = [
        (n.memory - (settings.reserve_memory if n.reserve_memory is None else n.reserve_memory))
        * settings.memory_overcommit
        for n in nodes
    ]
    vcpus = [
        (n.cpu - (settings.reserve_cpu if n.reserve_cpu is None else n.reserve_cpu))
        * settings.cpu_overcommit
        for n in nodes
    ]
    used = [0.0] * len(nodes)
    used_vcpus = [0.0] * len(nodes)
    where: dict[str, int] = {}
    partners = {g: set(group) - {g} for group in apart for g in group}
    order = [int(i) for i in rng.permutation(len(guests))]
    # The biggest guests first, so that the packing works; the rest in random order.
    order.sort(key=lambda i: -guests[i].memory if guests[i].memory >= 32 * GiB else 0)
    placed: list[Guest] = list(guests)
    for i in order:
        guest = guests[i]
        blocked = {where[p] for p in partners.get(guest.id, ()) if p in where}
        free = [
            n
            for n in range(len(nodes))
            if n not in blocked and used_vcpus[n] + guest.cpu <= vcpus[n]
        ]
        target = next(
            (n for n in free if n < hot and used[n] + guest.memory <= fill * limit[n]), None
        )
        if target is None:
            cold = [n for n in free if n >= hot]
            target = min(cold, key=lambda n: (used[n] / limit[n], n), default=None)
            if target is None or used[target] + guest.memory > limit[target]:
                raise RuntimeError("the cluster is too small for its guests")
        used[target] += guest.memory
        used_vcpus[target] += guest.cpu
        where[guest.id] = target
        placed[i] = replace(guest, node=nodes[target].name)
    return placed


def db_pairs(guests: list[Guest]) -> list[tuple[str, ...]]:
    dbs = [g.id for g in guests if "db" in g.tags]
    return [tuple(dbs[i : i + 2]) for i in range(0, min(len(dbs), 10) - 1, 2)]


def month_cluster() -> Cluster:
    """16 nodes, 400 guests, packed onto five nodes."""
    rng = np.random.default_rng(20240601)
    nodes = tuple(
        Node(
            f"pve{i:02d}",
            cpu=64.0 if i <= 8 else 48.0,
            memory=(512 if i <= 8 else 384) * GiB,
            tags=("rack-a",) if i <= 8 else ("rack-b",),
            base_cpu=round(float(rng.uniform(0.4, 1.0)), 2),
            base_memory=int(rng.integers(3, 7)) * GiB,
        )
        for i in range(1, 17)
    )
    settings = Settings(reserve_cpu=1.0, reserve_memory=8 * GiB, min_uptime=600)
    guests = make_guests(rng, MONTH_KINDS, 1000)
    pairs = db_pairs(guests)
    guests = place_guests(rng, guests, nodes, settings, hot=5, fill=0.97, apart=pairs)
    rules = Rules(
        guest_affinity=tuple(
            GuestAffinity(f"db-pair-{k + 1}", pair, positive=False, hard=True)
            for k, pair in enumerate(pairs)
        )
    )
    return Cluster(nodes, tuple(guests), rules, settings, "month")


def demo_cluster() -> Cluster:
    """8 nodes, 80 guests, packed onto three nodes."""
    rng = np.random.default_rng(20240602)
    nodes = tuple(
        Node(
            f"pve{i}",
            cpu=32.0 if i <= 4 else 24.0,
            memory=(256 if i <= 4 else 192) * GiB,
            base_cpu=round(float(rng.uniform(0.3, 0.8)), 2),
            base_memory=int(rng.integers(2, 5)) * GiB,
        )
        for i in range(1, 9)
    )
    settings = Settings(reserve_memory=4 * GiB, min_uptime=600)
    guests = make_guests(rng, DEMO_KINDS, 100)
    pairs = db_pairs(guests)
    guests = place_guests(rng, guests, nodes, settings, hot=3, fill=0.95, apart=pairs)
    rules = Rules(
        guest_affinity=tuple(
            GuestAffinity(f"db-pair-{k + 1}", pair, positive=False, hard=True)
            for k, pair in enumerate(pairs)
        )
    )
    return Cluster(nodes, tuple(guests), rules, settings, "demo")


_HEADER = """\
# Generated by `python -m opendrs.backends.simgen` — do not edit by hand.
# {what}
# The scenario that drives it is {scenario}; the format is docs/snapshot-format.md.
"""

OUTPUTS = {
    "month-cluster.yaml": (
        month_cluster,
        "16 nodes, 400 guests, most of them packed onto pve01–pve05 (deliberately unbalanced).",
        "month.yaml",
    ),
    "demo-cluster.yaml": (
        demo_cluster,
        "8 nodes, 80 guests, most of them packed onto pve1–pve3 (deliberately unbalanced).",
        "demo.yaml",
    ),
}


def render(filename: str) -> str:
    """The text of one generated snapshot file."""
    build, what, scenario = OUTPUTS[filename]
    return _HEADER.format(what=what, scenario=scenario) + dumps(build())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else Path(str(resources.files("opendrs"))) / "data" / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    for filename in OUTPUTS:
        (folder / filename).write_text(render(filename), encoding="utf-8", newline="\n")
        print(folder / filename)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
