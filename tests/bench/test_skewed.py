"""The second benchmark generator (bench/skewed.py) and the generators by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from bench.skewed import GENERATIONS, GROUPED_SHARE, OVERCOMMITS, PINNED_SHARE, generate

from opendrs.cli.main import main
from opendrs.engine.constraints import Constraints
from opendrs.model.cluster import Cluster
from opendrs.model.snapshot import dump, dumps

GiB = 1024**3


def _assign(cluster: Cluster) -> np.ndarray:
    index = cluster.node_index
    return np.array([index[g.node] for g in cluster.guests])


def test_the_same_seed_gives_the_same_cluster() -> None:
    assert dumps(generate("M", seed=5, rules=True)) == dumps(generate("M", seed=5, rules=True))
    assert dumps(generate("M", seed=5)) != dumps(generate("M", seed=6))


@pytest.mark.parametrize("size", ["S", "M", "L"])
def test_sizes_match_the_first_generator(size: str) -> None:
    cluster = generate(size, seed=2)
    assert (len(cluster.nodes), len(cluster.guests)) == (SIZES[size].nodes, SIZES[size].guests)
    assert cluster.settings.mode == "static"


def test_distributions_differ_from_the_first_generator() -> None:
    cluster = generate("L", seed=3)
    memory = np.array([g.memory / GiB for g in cluster.guests])
    # Heavy-tailed: the median guest is small, the largest ones many times the median.
    assert memory.max() >= 20 * np.median(memory)
    cores = {n.cpu for n in cluster.nodes}
    assert cores <= set(GENERATIONS[:, 0]) and len(cores) >= 2
    per_core = sum(g.cpu for g in cluster.guests) / sum(n.cpu for n in cluster.nodes)
    assert min(OVERCOMMITS) * 0.9 <= per_core <= max(OVERCOMMITS) * 1.1
    assert any(g.local_disk_bytes for g in cluster.guests)
    # Skewed: some nodes packed, some far emptier.
    used = np.bincount(_assign(cluster), memory, len(cluster.nodes))
    fraction = used / np.array([n.memory / GiB for n in cluster.nodes])
    assert fraction.max() > 0.85 and fraction.min() < 0.25


def test_shares_of_pinned_and_rule_bound_guests() -> None:
    cluster = generate("L", seed=4, rules=True)
    count = len(cluster.guests)
    pinned = {g for rule in cluster.rules.node_affinity for g in rule.guests}
    grouped = {g for rule in cluster.rules.guest_affinity for g in rule.guests}
    assert all(rule.strict for rule in cluster.rules.node_affinity)
    assert all(rule.hard for rule in cluster.rules.guest_affinity)
    assert len(pinned) == round(PINNED_SHARE * count)
    assert 0.5 * GROUPED_SHARE * count <= len(grouped) <= GROUPED_SHARE * count
    assert not pinned & grouped
    kinds = {rule.positive for rule in cluster.rules.guest_affinity}
    assert kinds == {True, False}
    # The initial placement satisfies every rule and every capacity.
    assert Constraints.build(cluster).violations(_assign(cluster)) == []
    assert generate("L", seed=4).rules.node_affinity == ()


def test_a_snapshot_of_it_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "skewed.yaml"
    dump(generate("M", seed=2, rules=True), path)
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(f"{path}: valid (")


def test_the_registry_names_every_generator() -> None:
    assert set(GENERATORS) == {"basic", "skewed", "new-node", "hot-rack", "mixed"}
    assert dumps(generated("skewed", "S", seed=2)) == dumps(generate("S", seed=2))
    with pytest.raises(ValueError, match="unknown generator"):
        generated("uniform", "S")


def test_a_case_names_its_generator() -> None:
    from bench.worker import Spec, case_cluster

    spec = Spec("S", 2, True, "strategy", "balance", generator="skewed")
    assert Spec.from_json(spec.to_json()) == spec
    assert dumps(case_cluster(spec)) == dumps(generate("S", seed=2, rules=True))
    assert case_cluster(Spec("S", 2, True, "strategy", "balance")).name == "bench-S"
