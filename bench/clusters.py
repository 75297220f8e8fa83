"""The benchmark's cluster generators by name, all seeded, at the sizes of
:data:`bench.generate.SIZES`: ``basic`` (:mod:`bench.generate`), ``skewed`` (:mod:`bench.skewed`)
and the production-like ``new-node``, ``hot-rack`` and ``mixed`` (:mod:`bench.realistic`)."""

from __future__ import annotations

from collections.abc import Callable

from bench import generate, realistic, skewed
from opendrs.model.cluster import Cluster

Generator = Callable[..., Cluster]

#: Generator name → ``generate(size, *, seed, rules)``.
GENERATORS: dict[str, Generator] = {
    "basic": generate.generate,
    "skewed": skewed.generate,
    **realistic.GENERATORS,
}
#: The generators written for the project's first measurements (#15 and before).
EARLIER: tuple[str, ...] = ("basic", "skewed")
#: The production-like generators (#30), one per skew.
REALISTIC: tuple[str, ...] = tuple(realistic.GENERATORS)


def generated(generator: str, size: str, *, seed: int = 1, rules: bool = False) -> Cluster:
    """The cluster of ``(size, seed, rules)`` made by the generator named ``generator``."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[generator](size, seed=seed, rules=rules)
