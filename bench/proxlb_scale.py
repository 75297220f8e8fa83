"""A seeded proxlb-solver scenario of many VMs, skewed and 2:1 overcommitted, not made by opendrs.

``python -m bench.proxlb_scale OUT.yaml [--vms 100000] [--seed 1]`` writes one; :func:`scenario`
returns it as plain data. Its shape differs from :mod:`bench.generate`'s on purpose:

- one node per 100 VMs, a mix of 64 cores / 512 GiB (40 %), 96 / 768 (30 %) and 128 / 1024 (30 %);
- VMs of 1–32 GB (30 % 1, 30 % 2, 20 % 4, 10 % 8, 7 % 16, 3 % 32), ``⌈GB/4⌉`` vCPUs (at most 8),
  ``cpu_usage`` drawn from Beta(2, 5) of the vCPUs, 5 % containers: about 60 % of the memory and
  80 % of the vCPU capacity at ``cpu_overcommit: 2.0`` (2:1);
- **skewed placement**: each VM draws its node with a Zipf-like weight ``1 / rank^0.9`` over the
  nodes in a random order; a VM that would take its node beyond 95 % of its memory or beyond its
  vCPU capacity draws again among the nodes it fits, with the same weights. The nodes fill in rank
  order: the first ones full, the last ones nearly empty;
- ``balancing``: method ``memory``, balanciness 3, vCPU overcommit 2.0; no constraints.

The same ``(vms, seed)`` always gives the same scenario (and the same text).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: VMs per node.
VMS_PER_NODE = 100
#: vCPUs a node may carry per core.
CPU_OVERCOMMIT = 2.0
#: Share of a node's memory that placement fills at most.
MEMORY_FILL = 0.95
#: Exponent of the placement's Zipf-like node weights.
SKEW = 0.9

_NODE_SHAPES = np.array([[64, 512], [96, 768], [128, 1024]])
_NODE_P = np.array([0.4, 0.3, 0.3])
_MEMORY_GB = np.array([1, 2, 4, 8, 16, 32])
_MEMORY_P = np.array([0.3, 0.3, 0.2, 0.1, 0.07, 0.03])


def _placement(
    rng: np.random.Generator, memory: np.ndarray, cpu: np.ndarray, shapes: np.ndarray
) -> np.ndarray:
    """Each VM's node index, drawn with skewed weights among the nodes it still fits."""
    count = len(shapes)
    weights = 1.0 / np.arange(1, count + 1) ** SKEW
    order = rng.permutation(count)  # order[r]: the node of rank r
    rank = np.argsort(order)  # rank[node]
    drawn = order[rng.choice(count, size=len(memory), p=weights / weights.sum())]
    mem_cap = shapes[:, 1] * MEMORY_FILL
    cpu_cap = shapes[:, 0] * CPU_OVERCOMMIT
    mem_used = np.zeros(count)
    cpu_used = np.zeros(count)
    for vm, node in enumerate(drawn):
        if mem_used[node] + memory[vm] > mem_cap[node] or cpu_used[node] + cpu[vm] > cpu_cap[node]:
            fits = (mem_used + memory[vm] <= mem_cap) & (cpu_used + cpu[vm] <= cpu_cap)
            if not fits.any():
                raise ValueError(f"VM {vm} fits no node")
            share = np.where(fits, weights[rank], 0.0)
            node = int(rng.choice(count, p=share / share.sum()))
            drawn[vm] = node
        mem_used[node] += memory[vm]
        cpu_used[node] += cpu[vm]
    return drawn


def scenario(vms: int = 100_000, *, seed: int = 1) -> dict[str, Any]:
    """A proxlb-solver scenario of ``vms`` VMs on ``max(2, vms // 100)`` nodes (plain data)."""
    if vms < 1:
        raise ValueError(f"vms: expected at least 1, got {vms}")
    rng = np.random.default_rng(seed)
    count = max(2, vms // VMS_PER_NODE)
    shapes = _NODE_SHAPES[rng.choice(len(_NODE_SHAPES), size=count, p=_NODE_P)]
    memory = rng.choice(_MEMORY_GB, size=vms, p=_MEMORY_P)
    cpu = np.minimum(8, np.ceil(memory / 4)).astype(np.int64)
    usage = rng.beta(2, 5, size=vms)
    containers = rng.random(vms) < 0.05
    placed = _placement(rng, memory, cpu, shapes)
    width = len(str(count))
    names = [f"node-{i + 1:0{width}d}" for i in range(count)]
    vm_width = len(str(vms))
    return {
        "name": f"proxlb-scale-{vms}-seed{seed}",
        "description": (
            f"{vms} VMs on {count} nodes, skewed placement (Zipf-like, exponent {SKEW}), "
            f"{CPU_OVERCOMMIT:g}:1 vCPU overcommit; made by bench/proxlb_scale.py, seed {seed}"
        ),
        "balancing": {"method": "memory", "balanciness": 3, "cpu_overcommit": CPU_OVERCOMMIT},
        "nodes": {
            name: {"cpu_total": int(shape[0]), "memory_total_gb": int(shape[1])}
            for name, shape in zip(names, shapes, strict=True)
        },
        "vms": {
            f"vm-{i + 1:0{vm_width}d}": {
                "node": names[int(placed[i])],
                "cpu": int(cpu[i]),
                "memory_gb": int(memory[i]),
                "cpu_usage": round(float(cpu[i] * usage[i]), 2),
                "type": "ct" if containers[i] else "vm",
            }
            for i in range(vms)
        },
    }


def dumps(document: dict[str, Any]) -> str:
    """The scenario as block YAML (libyaml's emitter when PyYAML has it)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text: str = yaml.dump(
        document, Dumper=dumper, sort_keys=False, default_flow_style=False, width=1000
    )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.proxlb_scale",
        description="Write a seeded, skewed, 2:1-overcommitted proxlb-solver scenario.",
    )
    parser.add_argument("out", type=Path, help="the YAML file to write")
    parser.add_argument("--vms", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.out.write_text(dumps(scenario(args.vms, seed=args.seed)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
