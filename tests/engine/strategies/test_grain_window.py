"""The whole-step window rule (``strategies/balance/grain_window.py``), against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.strategies.balance.grain_window import (
    common_step,
    levels,
    whole_step_window,
    whole_steps,
)

EPS = 1e-9


def test_the_skewed_generators_nodes_reach_one_pp_when_the_counts_add_up() -> None:
    # Two 64-core nodes and one of 128 at 2 vCPUs per core: 512 vCPUs. All at 2.0 exactly.
    window = whole_step_window(
        np.array([64.0, 64.0, 128.0]), np.array([130.0, 126.0, 256.0]), 1, 0.01
    )
    assert window is not None
    assert window.low <= 2.0 <= window.low + 0.01
    k = window.kmin  # the 64-core nodes have one level in the window: 128
    assert k[:2].tolist() == [128, 128] and window.kmax[:2].tolist() == [128, 128]
    assert window.kmin[2] <= 256 <= window.kmax[2]


def test_no_window_when_the_small_nodes_cannot_share_the_total() -> None:
    # Two 64-core nodes with 129 vCPUs: 64 and 65 per node, 1.56 pp apart, or nothing.
    assert whole_step_window(np.array([64.0, 64.0]), np.array([100.0, 29.0]), 1, 0.01) is None
    # Half a pp more than one step is enough.
    assert whole_step_window(np.array([64.0, 64.0]), np.array([100.0, 29.0]), 1, 0.016) is not None


def test_fixed_load_is_never_taken_away() -> None:
    # Without it the empty node could hold 64 and the full one 64; with 100 fixed, no window.
    cap, load = np.array([64.0, 64.0]), np.array([100.0, 28.0])
    assert whole_step_window(cap, load, 1, 0.01) is not None
    assert whole_step_window(cap, load, 1, 0.01, fixed=np.array([100.0, 0.0])) is None


def test_offsets_are_kept() -> None:
    offset, k = levels(np.array([3.5, 7.0, 0.25]), 1.0)
    assert offset.tolist() == [0.5, 0.0, 0.25] and k.tolist() == [3, 7, 0]
    assert whole_steps(np.array([2.0, 3.0, 64.0]), 1.0)
    assert not whole_steps(np.array([2.0, 2.5]), 1.0)
    assert not whole_steps(np.array([2.0]), 0.0)


def test_the_common_step_is_the_greatest_common_divisor() -> None:
    assert common_step(np.array([2.0, 3.0, 64.0])) == 1.0  # no 1-vCPU guest: still whole vCPUs
    assert common_step(np.array([4.0, 6.0, 0.0])) == 2.0
    assert common_step(np.array([0.5, 0.75])) == 0.25
    assert common_step(np.array([0.1, 0.3, 0.7])) == pytest.approx(0.1)
    assert common_step(np.array([1.2345, 2.71828])) is None  # measured loads: no step
    assert common_step(np.array([0.0])) is None


def _brute(
    cap: list[int], load: list[int], fixed: list[int], width: float
) -> tuple[bool, float | None]:
    """Whether some whole counts (each at least its fixed part) adding up to the total have a
    spread within ``width``, and the least distance of a window of such counts from the centred
    one."""
    total = sum(load)
    centred = total / sum(cap) - width / 2
    best: float | None = None
    ranges = [range(f, total + 1) for f in fixed]
    for counts in itertools.product(*ranges):
        if sum(counts) != total:
            continue
        f = [k / c for k, c in zip(counts, cap, strict=True)]
        if max(f) - min(f) > width + EPS:
            continue
        # The windows holding these counts: low in [max f − width, min f].
        low = min(max(centred, max(f) - width), min(f))
        distance = abs(low - centred)
        best = distance if best is None else min(best, distance)
    return best is not None, best


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.data(),
    st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.2, 0.25, 0.34, 0.5]),
)
def test_the_window_exists_exactly_when_brute_force_finds_counts(
    cap: list[int], data: st.DataObject, width: float
) -> None:
    load = [data.draw(st.integers(0, 2 * c)) for c in cap]
    fixed = [data.draw(st.integers(0, k)) for k in load]
    exists, distance = _brute(cap, load, fixed, width)
    window = whole_step_window(
        np.array(cap, dtype=float), np.array(load, dtype=float), 1.0, width, np.array(fixed, float)
    )
    assert (window is not None) == exists
    if window is None:
        return
    # Its ranges are inside the window, above the fixed parts, and can add up to the total.
    assert np.all(window.kmin <= window.kmax)
    assert np.all(window.kmin >= fixed)
    assert window.kmin.sum() <= sum(load) <= window.kmax.sum()
    f_low, f_high = window.kmin / np.array(cap), window.kmax / np.array(cap)
    assert np.all(f_low >= window.low - EPS) and np.all(f_high <= window.low + width + EPS)
    # And it is the nearest to the window centred on the mean.
    centred = sum(load) / sum(cap) - width / 2
    assert distance is not None and abs(abs(window.low - centred) - distance) <= EPS


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([64, 96, 128]), min_size=2, max_size=30),
    st.data(),
    st.sampled_from([0.005, 0.01, 0.012]),
)
def test_a_window_found_is_whole_steps_adding_up(
    cap: list[int], data: st.DataObject, width: float
) -> None:
    load = np.array([data.draw(st.integers(0, 4 * c)) for c in cap], dtype=float)
    window = whole_step_window(np.array(cap, dtype=float), load, 1.0, width)
    if window is None:
        return
    # Fill the ranges greedily: the counts add up and their spread is within the width.
    counts = window.kmin.copy()
    left = int(load.sum()) - int(counts.sum())
    for n in range(len(cap)):
        take = min(left, int(window.kmax[n] - counts[n]))
        counts[n] += take
        left -= take
    assert left == 0
    f = counts / np.array(cap)
    assert f.max() - f.min() <= width + 1e-12
