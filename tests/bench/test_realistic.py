"""The production-like benchmark generators (bench/realistic.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench.clusters import generated
from bench.generate import SIZES
from bench.realistic import (
    GENERATIONS,
    GROUPED_SHARE,
    LOCAL_DISK_SHARE,
    MEMORY_FILL,
    NODE_FILL,
    SKEWS,
    generate,
)

from opendrs.cli.main import main
from opendrs.engine.constraints import Constraints
from opendrs.model.cluster import Cluster
from opendrs.model.snapshot import dump, dumps

GiB = 1024**3


def _fractions(cluster: Cluster) -> np.ndarray:
    used = {n.name: 0 for n in cluster.nodes}
    for guest in cluster.guests:
        used[guest.node] += guest.memory
    return np.array([used[n.name] / n.memory for n in cluster.nodes])


def _assign(cluster: Cluster) -> np.ndarray:
    index = cluster.node_index
    return np.array([index[g.node] for g in cluster.guests])


@pytest.mark.parametrize("skew", SKEWS)
def test_the_same_seed_gives_the_same_cluster(skew: str) -> None:
    first = dumps(generate("M", skew=skew, seed=7, rules=True))
    assert first == dumps(generate("M", skew=skew, seed=7, rules=True))
    assert first != dumps(generate("M", skew=skew, seed=8, rules=True))


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("seed", [11, 12])
def test_shape_at_l(skew: str, seed: int) -> None:
    cluster = generated(skew, "L", seed=seed, rules=True)
    assert (len(cluster.nodes), len(cluster.guests)) == (SIZES["L"].nodes, SIZES["L"].guests)
    assert {(n.cpu, n.memory // GiB) for n in cluster.nodes} <= set(GENERATIONS)
    fractions = _fractions(cluster)
    assert fractions.max() <= NODE_FILL + 1e-9
    total = sum(g.memory for g in cluster.guests) / sum(n.memory for n in cluster.nodes)
    assert MEMORY_FILL[0] - 0.03 <= total <= MEMORY_FILL[1] + 0.02
    if skew != "hot-rack":  # the new node is the last one, and empty
        assert fractions[-1] == 0 and cluster.nodes[-1].memory == 1024 * GiB
    else:  # one rack well above the rest
        assert fractions.max() - np.median(fractions) >= 0.05
    vcpus = np.array([g.cpu for g in cluster.guests])
    assert np.mean(vcpus <= 4) >= 0.6 and vcpus.max() >= 8
    disks = np.mean([bool(g.disks) for g in cluster.guests])
    assert abs(disks - LOCAL_DISK_SHARE) < 0.03


@pytest.mark.parametrize("skew", SKEWS)
def test_rules_hold_in_the_placement_and_half_the_groups_are_tags(skew: str) -> None:
    cluster = generate("L", skew=skew, seed=5, rules=True)
    grouped = {g for rule in cluster.rules.guest_affinity for g in rule.guests}
    count = len(cluster.guests)
    assert 0.6 * GROUPED_SHARE * count <= len(grouped) <= GROUPED_SHARE * count
    assert all(2 <= len(rule.guests) <= 5 for rule in cluster.rules.guest_affinity)
    assert {rule.positive for rule in cluster.rules.guest_affinity} == {True, False}
    tags = [rule for rule in cluster.rules.guest_affinity if rule.origin == "tag"]
    assert abs(len(tags) - len(cluster.rules.guest_affinity) / 2) <= 1
    tagged = {g.id: g.tags for g in cluster.guests if g.tags}
    assert all(rule.name in tagged[guest] for rule in tags for guest in rule.guests)
    assert cluster.rules.node_affinity and all(r.strict for r in cluster.rules.node_affinity)
    assert Constraints.build(cluster).violations(_assign(cluster)) == []
    assert generate("L", skew=skew, seed=5).rules.guest_affinity == ()


def test_a_snapshot_of_it_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mixed.yaml"
    dump(generate("M", skew="mixed", seed=2, rules=True), path)
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(f"{path}: valid (")


def test_an_unknown_skew_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown skew 'sideways'"):
        generate("S", skew="sideways")
