"""Imbalance metrics: Proxmox's golden values and hand-checked figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.imbalance import (
    balance_objective,
    balance_spread,
    combined,
    cv,
    cv_normalized,
    rms,
    spread,
    summarise,
    weighted_variance,
)

MiB = 1024**2
GiB = 1024**3

# proxmox-resource-scheduling tests/scheduler.rs: usage of three nodes.
USAGE = np.array([[1.7, 12334 * MiB], [15.184, 529 * MiB], [5.2, 9381 * MiB]])


def _fractions(caps: list[tuple[float, float]]) -> np.ndarray:
    return USAGE / np.array(caps, dtype=float)


def test_proxmox_homogeneous_imbalance() -> None:
    loads = combined(_fractions([(16, 64 * GiB)] * 3), [1, 1])
    assert cv(loads) == pytest.approx(0.4893954724628247, rel=1e-12)
    assert cv_normalized(loads) == pytest.approx(0.3460548572604576, rel=1e-12)


def test_proxmox_heterogeneous_imbalance() -> None:
    loads = combined(_fractions([(16, 128 * GiB), (32, 96 * GiB), (24, 64 * GiB)]), [1, 1])
    assert cv(loads) == pytest.approx(0.33026013056867354, rel=1e-12)
    assert cv_normalized(loads) == pytest.approx(0.23352917788066363, rel=1e-12)


def test_four_equal_guests_on_one_of_three_nodes() -> None:
    loads = np.array([0.4, 0.0, 0.0])
    assert cv(loads) == pytest.approx(math.sqrt(2))
    assert cv_normalized(loads) == pytest.approx(1.0)
    assert spread(loads) == pytest.approx(0.4)


def test_degenerate_cases_are_zero() -> None:
    assert cv(np.array([0.5])) == 0.0
    assert cv(np.array([0.0, 0.0, 0.0])) == 0.0
    assert cv(np.array([0.3, 0.3, 0.3])) == 0.0
    assert cv_normalized(np.array([0.7])) == 0.0
    assert spread(np.array([0.9])) == 0.0


def test_rms_and_per_column() -> None:
    f = np.array([[0.0, 0.5], [0.6, 0.5]])
    assert rms(f).tolist() == pytest.approx([math.sqrt(0.18), 0.5])
    assert spread(f).tolist() == pytest.approx([0.6, 0.0])


def test_weighted_variance_is_zero_iff_fractions_equal() -> None:
    cap = np.array([[16.0], [8.0], [4.0]])
    equal = np.array([[8.0], [4.0], [2.0]])  # every node at 0.5
    assert weighted_variance(equal, cap)[0] == pytest.approx(0.0)
    uneven = np.array([[4.0], [4.0], [4.0]])  # fractions 0.25, 0.5, 1
    # mean = (4 + 4 + 4) / 28 = 3/7
    mean = 12 / 28
    expected = (16 * (0.25 - mean) ** 2 + 8 * (0.5 - mean) ** 2 + 4 * (1 - mean) ** 2) / 28
    assert weighted_variance(uneven, cap)[0] == pytest.approx(expected)


def test_weighted_variance_by_group_and_without_capacity() -> None:
    cap = np.array([[16.0], [8.0], [4.0], [0.0]])
    load = np.array([[4.0], [4.0], [4.0], [9.0]])
    # Groups {0, 1} (mean 8/24) and {2} (its own mean: no term); node 3 takes no part.
    mean = 8 / 24
    expected = (16 * (0.25 - mean) ** 2 + 8 * (0.5 - mean) ** 2) / 28
    grouped = weighted_variance(load, cap, np.array([0, 0, 1, -1]))
    assert grouped[0] == pytest.approx(expected)
    # Without capacity a node takes no part, whatever its group says.
    assert weighted_variance(load, cap)[0] == pytest.approx(weighted_variance(load[:3], cap[:3])[0])
    assert weighted_variance(np.zeros((0, 2)), np.zeros((0, 2))).tolist() == [0.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(0, 1e3), min_size=2 * n, max_size=2 * n),
            st.lists(st.sampled_from([0.0, 1.0, 4.0, 16.0, 64.0]), min_size=2 * n, max_size=2 * n),
            st.lists(st.integers(-1, 2), min_size=n, max_size=n),
            st.integers(1, 4),
        )
    )
)
def test_the_objective_of_many_placements_at_once_is_each_ones(
    case: tuple[list[float], list[float], list[int], int],
) -> None:
    loads, caps, groups, k = case
    cap = np.array(caps).reshape(-1, 2)
    group = np.array(groups)
    rng = np.random.default_rng(len(loads))
    many = np.array(loads).reshape(1, -1, 2) * rng.uniform(0.5, 2.0, size=(k, 1, 1))
    weights = np.array([0.25, 0.75])
    together = balance_objective(many, cap, weights, group)
    assert together.shape == (k,)
    for i in range(k):
        one = balance_objective(many[i], cap, weights, group)
        assert one.shape == () and float(one) == together[i]  # bit for bit
        assert float(one) >= 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(0, 1e12), min_size=2 * n, max_size=2 * n),
            st.lists(st.floats(1e-3, 1e12), min_size=2 * n, max_size=2 * n),
            st.integers(1, 3),
        )
    )
)
def test_one_group_of_every_node_is_the_general_case_bit_for_bit(
    case: tuple[list[float], list[float], int],
) -> None:
    # Every node in one group with capacity in every resource takes a shorter path; a last node
    # without capacity takes the general one and adds nothing: the values are the same bits.
    loads, caps, k = case
    cap = np.array(caps).reshape(-1, 2)
    load = np.array(loads).reshape(1, -1, 2) * np.linspace(1.0, 0.5, k)[:, None, None]
    short = weighted_variance(load, cap)
    general = weighted_variance(
        np.concatenate([load, np.zeros((k, 1, 2))], axis=1), np.vstack([cap, np.zeros((1, 2))])
    )
    assert np.array_equal(short, general)
    assert np.array_equal(weighted_variance(load[0], cap), short[0])


def test_summary_has_every_resource_and_combined() -> None:
    summary = summarise(np.array([[0.2, 0.4], [0.6, 0.4]]), ("cpu", "memory"), [1, 1])
    assert set(summary.as_dict()) == {"cpu", "memory", "combined"}
    assert summary.resources["cpu"].spread == pytest.approx(0.4)
    assert summary.combined.mean == pytest.approx(0.4)
    assert summary.combined.min == pytest.approx(0.3)


@settings(max_examples=200, deadline=None)
@given(
    # Load fractions: 0, or between a millionth and 10 (subnormal floats lose the last digits).
    st.lists(st.just(0.0) | st.floats(1e-6, 10), min_size=2, max_size=30),
    st.floats(0.01, 100),
)
def test_cv_is_scale_invariant_and_non_negative(values: list[float], scale: float) -> None:
    arr = np.array(values)
    base = cv(arr)
    assert base >= 0
    if arr.sum() > 1e-9:
        assert cv(arr * scale) == pytest.approx(base, rel=1e-9, abs=1e-12)
    # The normalised form is at most 1 (all load on one node).
    assert cv_normalized(arr) <= 1 + 1e-9


def test_balance_spread_takes_the_worst_weighted_resource() -> None:
    f = np.array([[0.2, 0.5], [0.6, 0.4], [0.3, 0.45]])
    assert balance_spread(f, [1.0, 1.0]) == pytest.approx(0.4)
    assert balance_spread(f, [0.0, 1.0]) == pytest.approx(0.1)
    assert balance_spread(f, [0.0, 0.0]) == 0.0
    assert balance_spread(f[:1], [1.0, 1.0]) == 0.0
    with_inf = np.array([[0.2, 0.1], [np.inf, 0.1], [0.5, 0.1]])
    assert balance_spread(with_inf, [1.0, 1.0]) == pytest.approx(0.3)
