"""Usage accounting: which guests load which nodes, in each mode."""

from __future__ import annotations

import numpy as np
import pytest

from opendrs.engine.usage import CapacityModel, Dimension, DimensionKind, LoadModel, loaded_nodes
from opendrs.model.cluster import Cluster, Disk, Guest, Node, Settings

GiB = 1024**3


def _cluster(mode: str = "dynamic", **settings: object) -> Cluster:
    nodes = (
        Node("a", 8, 32 * GiB, storage={"local": 100 * GiB}, base_cpu=0.5, base_memory=GiB),
        Node("b", 16, 64 * GiB, reserve_cpu=2, reserve_memory=4 * GiB),
    )
    guests = (
        Guest("1", "a", cpu=2, memory=4 * GiB, cpu_used=1.5, memory_used=3 * GiB),
        Guest("2", "a", cpu=4, memory=8 * GiB, state="stopped", disks=(Disk("local", 10 * GiB),)),
        Guest("3", "b", cpu=1, memory=2 * GiB, migrating_to="a"),
        Guest("4", "b", cpu=2, memory=2 * GiB, state="paused", cpu_used=0.0, memory_used=GiB),
    )
    return Cluster(nodes, guests, settings=Settings(mode=mode, **settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ha_state", "expected"),
    [
        ("stopped", ()),
        ("request_start", ()),
        ("started", ("a",)),
        ("request_stop", ("a",)),
        ("fence", ("a",)),
        ("freeze", ("a",)),
        ("error", ("a",)),
        ("recovery", ("a",)),
        ("migrate", ("a", "b")),
        ("relocate", ("a", "b")),
        ("request_start_balance", ("b",)),
    ],
)
def test_proxmox_ha_states_load_nodes(ha_state: str, expected: tuple[str, ...]) -> None:
    guest = Guest("1", "a", ha=True, ha_state=ha_state, migrating_to="b")
    assert loaded_nodes(guest) == expected


def test_plain_guest_states() -> None:
    assert loaded_nodes(Guest("1", "a")) == ("a",)
    assert loaded_nodes(Guest("1", "a", state="paused")) == ("a",)
    assert loaded_nodes(Guest("1", "a", state="stopped")) == ()
    assert loaded_nodes(Guest("1", "a", migrating_to="b")) == ("a", "b")


def test_dynamic_mode_uses_measured_use_base_and_reserves() -> None:
    model = LoadModel.build(_cluster("dynamic"))
    loads = model.loads()
    # a: base 0.5 + guest 1 (1.5) + migrating guest 3 (its configured cpu 1, not measured)
    assert loads[0].tolist() == [0.5 + 1.5 + 1.0, float(GiB + 3 * GiB + 2 * GiB)]
    # b: guest 3 (source) + paused guest 4 (measured 0 cpu, 1 GiB)
    assert loads[1].tolist() == [1.0, float(2 * GiB + GiB)]
    assert model.capacity.tolist() == [[8.0, 32.0 * GiB], [14.0, 60.0 * GiB]]


def test_static_mode_uses_configured_sizes() -> None:
    loads = LoadModel.build(_cluster("static")).loads()
    assert loads.tolist() == [[2 + 1, 6.0 * GiB], [1 + 2, 4.0 * GiB]]


def test_basic_mode_counts_guests() -> None:
    model = LoadModel.build(_cluster("basic"))
    assert model.loads().tolist() == [[2, 2], [2, 2]]
    assert model.fractions().tolist() == [[2, 2], [2, 2]]


def test_loads_for_another_assignment() -> None:
    model = LoadModel.build(_cluster("static"))
    assign = np.array([1, 1, 1, 1])
    # Guest 3 is still migrating to a, so a keeps its share.
    assert model.loads(assign).tolist() == [[1.0, 2.0 * GiB], [5.0, 8.0 * GiB]]


def test_capacity_dimensions_and_commitments() -> None:
    cap = CapacityModel.build(_cluster("dynamic", cpu_overcommit=2.0, reserve_memory=GiB))
    assert tuple(map(str, cap.dimensions)) == (
        "vcpus",
        "memory",
        "cpu_used",
        "memory_used",
        "storage:local",
    )
    # a: 8 cores * 2; 32 GiB - 1 GiB default reserve; b has its own reserves.
    assert cap.limit[0].tolist() == [16.0, 31.0 * GiB, 8.0, 31.0 * GiB, 100.0 * GiB]
    assert cap.limit[1].tolist() == [28.0, 60.0 * GiB, 14.0, 60.0 * GiB, 0.0]
    committed = cap.committed()
    # The stopped guest 2 commits its local disk but no cpu or memory.
    assert committed[0].tolist() == [3.0, 6.0 * GiB, 0.5 + 1.5 + 1.0, 6.0 * GiB, 10.0 * GiB]
    assert committed[1].tolist() == [3.0, 4.0 * GiB, 1.0, 3.0 * GiB, 0.0]
    assert not cap.over(committed).any()
    # The dimensions are typed; their names are their string form.
    assert cap.dimensions[-1] == Dimension(DimensionKind.STORAGE, "local")
    assert cap.storage_cols.tolist() == [False, False, False, False, True]
    assert cap.measured_cols.tolist() == [False, False, True, True, False]
    # What a guest brings to a node it moves to: the stopped guest 2 only its local disk.
    assert cap.moving[1].tolist() == [0.0, 0.0, 0.0, 0.0, 10.0 * GiB]
    assert cap.moving[0].tolist() == cap.demand[0].tolist()
