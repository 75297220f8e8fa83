"""The skewed, overcommitted proxlb-solver scenario generator (bench/proxlb_scale.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from bench.proxlb_scale import CPU_OVERCOMMIT, MEMORY_FILL, dumps, main, scenario

from opendrs.compat.proxlb import is_proxlb_scenario, load_scenario, scenario_from_dict
from opendrs.model.document import parse


def test_the_same_seed_gives_the_same_scenario() -> None:
    assert dumps(scenario(600, seed=3)) == dumps(scenario(600, seed=3))
    assert scenario(600, seed=3) != scenario(600, seed=4)


def test_the_scenario_reads_back_and_fits_its_nodes() -> None:
    document = scenario(2_000, seed=1)
    assert is_proxlb_scenario(document)
    assert parse(dumps(document)) == document
    loaded = scenario_from_dict(document)
    cluster = loaded.cluster
    assert (len(cluster.nodes), len(cluster.guests)) == (20, 2_000)
    assert loaded.notes == ()
    assert cluster.settings.cpu_overcommit == CPU_OVERCOMMIT == 2.0
    memory: Counter[str] = Counter()
    vcpus: Counter[str] = Counter()
    for guest in cluster.guests:
        memory[guest.node] += guest.memory
        vcpus[guest.node] += int(guest.cpu)
        assert 0 <= guest.cpu_load <= guest.cpu
    for node in cluster.nodes:
        assert memory[node.name] <= node.memory * MEMORY_FILL
        assert vcpus[node.name] <= node.cpu * CPU_OVERCOMMIT
    shares = sorted(memory[n.name] / n.memory for n in cluster.nodes)
    assert shares[-1] - shares[0] > 0.3  # skewed: full nodes and nearly empty ones
    total_vcpus = sum(vcpus.values()) / sum(n.cpu * CPU_OVERCOMMIT for n in cluster.nodes)
    assert 0.6 < total_vcpus <= 1.0


def test_the_command_writes_a_scenario_file(tmp_path: Path) -> None:
    out = tmp_path / "scale.yaml"
    assert main([str(out), "--vms", "300", "--seed", "2"]) == 0
    assert len(load_scenario(out).vms) == 300
    with pytest.raises(ValueError, match="vms"):
        scenario(0)
