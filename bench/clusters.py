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


#: Names ``--generator`` takes beside the generators' own: ``both`` (the earlier two, as before
#: #30) and ``all``.
GROUPS: dict[str, tuple[str, ...]] = {"both": EARLIER, "all": tuple(GENERATORS)}


def generator_names(text: str) -> list[str]:
    """The generators of a ``--generator`` value: a comma list of names and groups
    (:data:`GROUPS`), each once, in the order given; ValueError on an unknown one."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part not in GENERATORS and part not in GROUPS:
            known = ", ".join([*GENERATORS, *GROUPS])
            raise ValueError(f"unknown generator {part!r} (known: {known})")
        names += [n for n in GROUPS.get(part, (part,)) if n not in names]
    if not names:
        raise ValueError("no generator given")
    return names


def generated(generator: str, size: str, *, seed: int = 1, rules: bool = False) -> Cluster:
    """The cluster of ``(size, seed, rules)`` made by the generator named ``generator``."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[generator](size, seed=seed, rules=rules)
