"""The benchmark's cluster generators by name: ``basic`` (:mod:`bench.generate`) and ``skewed``
(:mod:`bench.skewed`), both seeded, at the sizes of :data:`bench.generate.SIZES`."""

from __future__ import annotations

from collections.abc import Callable

from bench import generate, skewed
from opendrs.model.cluster import Cluster

Generator = Callable[..., Cluster]

#: Generator name → ``generate(size, *, seed, rules)``.
GENERATORS: dict[str, Generator] = {"basic": generate.generate, "skewed": skewed.generate}


def generated(generator: str, size: str, *, seed: int = 1, rules: bool = False) -> Cluster:
    """The cluster of ``(size, seed, rules)`` made by the generator named ``generator``."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[generator](size, seed=seed, rules=rules)
