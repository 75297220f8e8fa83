"""TOPSIS and AHP: Proxmox's topsis.rs golden ranks, the AHP numbers, properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.mcdm import (
    RANDOM_INDEX,
    AhpResult,
    McdmError,
    ahp_weights,
    topsis_rank,
    topsis_scores,
)

# --------------------------------------------------------------------------- TOPSIS goldens
# proxmox-resource-scheduling tests/topsis.rs, upstream's own cases.
# "+" maximises a criterion (weight 1), "-" minimises it (weight -1).

SIGN = {"+": 1.0, "-": -1.0}

SINGLE_CRITERION = [
    ([[0], [2]], "+", [1, 0]),
    ([[0], [2]], "-", [0, 1]),
    ([[1], [2], [5], [3], [4]], "+", [2, 4, 3, 1, 0]),
    ([[1], [2], [5], [3], [4]], "-", [0, 1, 3, 4, 2]),
    ([[-2], [-5], [-4], [1], [-3]], "+", [3, 0, 4, 2, 1]),
    ([[-2], [-5], [-4], [1], [-3]], "-", [1, 2, 4, 0, 3]),
]

TWO_CRITERIA_A = [[0, 1], [1, 0], [1, -1], [1, 1], [0, 0]]
TWO_CRITERIA_B = [[7, 4], [1, 0.5], [-1, -1], [-8.5, 11.5], [4, 7]]
TWO_CRITERIA = [
    (TWO_CRITERIA_A, "+-", [2, 1, 4, 3, 0]),
    (TWO_CRITERIA_A, "-+", [0, 3, 4, 1, 2]),
    (TWO_CRITERIA_A, "--", [2, 4, 1, 0, 3]),
    (TWO_CRITERIA_A, "++", [3, 0, 1, 4, 2]),
    (TWO_CRITERIA_B, "+-", [0, 1, 4, 2, 3]),
    (TWO_CRITERIA_B, "-+", [3, 2, 4, 1, 0]),
    (TWO_CRITERIA_B, "--", [2, 3, 1, 0, 4]),
    (TWO_CRITERIA_B, "++", [4, 0, 1, 3, 2]),
]

WEIGHTS = [(10, 0.2, 0.1), (0.2, 10, 0.1), (0.2, 0.1, 10), (-10, -5, 0.1)]
IDENTITY = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
IDENTITY_1000 = [[1, 0, 0], [0, 1, 0], [0, 0, 1000]]
NEGATED = [[-1, 0, 0], [0, -1, 0], [0, 0, 1]]
WEIGHTED = [
    (IDENTITY, WEIGHTS[0], [0, 1, 2]),
    (IDENTITY, WEIGHTS[1], [1, 0, 2]),
    (IDENTITY, WEIGHTS[2], [2, 0, 1]),
    (IDENTITY, WEIGHTS[3], [2, 1, 0]),
    (IDENTITY_1000, WEIGHTS[0], [0, 1, 2]),
    (IDENTITY_1000, WEIGHTS[1], [1, 0, 2]),
    (IDENTITY_1000, WEIGHTS[2], [2, 0, 1]),
    (IDENTITY_1000, WEIGHTS[3], [2, 1, 0]),
    (NEGATED, WEIGHTS[0], [2, 1, 0]),
    (NEGATED, WEIGHTS[1], [2, 0, 1]),
    (NEGATED, WEIGHTS[2], [2, 1, 0]),
    (NEGATED, WEIGHTS[3], [0, 1, 2]),
    ([[0, 0, 0], [0, 1, 0], [0, 0, 1]], WEIGHTS[0], [1, 2, 0]),
]


@pytest.mark.parametrize(("matrix", "signs", "expected"), SINGLE_CRITERION + TWO_CRITERIA)
def test_topsis_rank_sign_combinations(
    matrix: list[list[float]], signs: str, expected: list[int]
) -> None:
    assert topsis_rank(matrix, [SIGN[s] for s in signs]) == expected


@pytest.mark.parametrize(("matrix", "weights", "expected"), WEIGHTED)
def test_topsis_rank_weighted(
    matrix: list[list[float]], weights: tuple[float, ...], expected: list[int]
) -> None:
    assert topsis_rank(matrix, weights) == expected


def test_topsis_nan_is_an_error() -> None:
    with pytest.raises(McdmError, match="not finite"):
        topsis_scores([[0.0, 1.0], [math.nan, 2.0]], [1.0, 1.0])


def test_topsis_infinity_is_an_error() -> None:
    with pytest.raises(McdmError, match="not finite"):
        topsis_rank([[math.inf], [1.0]], [1.0])


def test_topsis_all_zero_weights_are_an_error() -> None:
    with pytest.raises(McdmError, match="non-zero weight"):
        topsis_scores([[1.0, 2.0], [3.0, 4.0]], [0.0, 0.0])


def test_topsis_non_finite_weight_is_an_error() -> None:
    with pytest.raises(McdmError, match="weight 1 is not finite"):
        topsis_scores([[1.0, 2.0]], [1.0, math.nan])


def test_topsis_shape_errors() -> None:
    with pytest.raises(McdmError, match="2 weights"):
        topsis_scores([[1.0, 2.0, 3.0]], [1.0, 1.0])
    with pytest.raises(McdmError, match="2-D"):
        topsis_scores([[[1.0]]], [1.0])
    with pytest.raises(McdmError, match="numbers"):
        topsis_scores([["a"]], [1.0])
    assert isinstance(McdmError("x"), ValueError)


def test_topsis_all_equal_alternatives_score_zero_and_keep_order() -> None:
    scores = topsis_scores([[1.0, 2.0]] * 3, [1.0, -1.0])
    assert scores.tolist() == [0.0, 0.0, 0.0]
    assert topsis_rank([[1.0, 2.0]] * 3, [1.0, -1.0]) == [0, 1, 2]


def test_topsis_all_zero_column_is_kept() -> None:
    # the zero column neither errors nor influences the order
    assert topsis_rank([[0.0, 1.0], [0.0, 3.0], [0.0, 2.0]], [5.0, 1.0]) == [1, 2, 0]


def test_topsis_no_alternatives() -> None:
    assert topsis_scores([], [1.0, 1.0]).shape == (0,)
    assert topsis_rank([], [1.0]) == []


def test_topsis_scores_known_values() -> None:
    scores = topsis_scores([[0.0], [2.0]], [1.0])
    assert scores.tolist() == [0.0, 1.0]


# --------------------------------------------------------------------------- AHP
# The Proxmox RFC "add vm loadbalancing" preferences.

AHP_MATRIX = [
    [1, 9, 9, 9, 9],
    [1 / 9, 1, 3, 3, 5],
    [1 / 9, 1 / 3, 1, 3, 3],
    [1 / 9, 1 / 3, 1 / 3, 1, 2],
    [1 / 9, 1 / 5, 1 / 3, 1 / 2, 1],
]


def test_ahp_eigenvector() -> None:
    result = ahp_weights(AHP_MATRIX)
    assert isinstance(result, AhpResult)
    assert result.method == "eigenvector"
    np.testing.assert_allclose(
        result.weights, [0.67094, 0.15300, 0.08817, 0.05156, 0.03632], atol=5e-6
    )
    assert result.weights.sum() == pytest.approx(1.0)
    assert result.lambda_max == pytest.approx(5.41397, abs=5e-6)
    assert result.ci == pytest.approx(0.1035, abs=5e-5)
    assert result.cr == pytest.approx(0.0924, abs=5e-5)
    assert result.consistent


def test_ahp_column_average() -> None:
    result = ahp_weights(AHP_MATRIX, "column-average")
    np.testing.assert_allclose(
        result.weights, [0.63490, 0.16406, 0.10252, 0.05852, 0.04000], atol=5e-6
    )
    assert result.weights.sum() == pytest.approx(1.0)
    assert result.cr < 0.1


def test_ahp_geometric_mean() -> None:
    result = ahp_weights(AHP_MATRIX, "geometric-mean")
    np.testing.assert_allclose(result.weights, [0.6601, 0.1570, 0.0914, 0.0543, 0.0372], atol=5e-5)
    assert result.weights.sum() == pytest.approx(1.0)


def test_ahp_column_sums_match_the_reference() -> None:
    sums = np.array(AHP_MATRIX).sum(axis=0)
    np.testing.assert_allclose(sums, [1.4444, 10.8667, 13.6667, 16.5, 20], atol=5e-5)


def test_ahp_consistent_matrix() -> None:
    w = np.array([0.5, 0.3, 0.2])
    matrix = w[:, None] / w[None, :]
    for method in ("eigenvector", "column-average", "geometric-mean"):
        result = ahp_weights(matrix, method)
        np.testing.assert_allclose(result.weights, w, atol=1e-12)
        assert result.lambda_max == pytest.approx(3.0)
        assert result.ci == pytest.approx(0.0, abs=1e-12)
        assert result.cr == pytest.approx(0.0, abs=1e-12)


def test_ahp_small_matrices() -> None:
    one = ahp_weights([[1.0]])
    assert one.weights.tolist() == [1.0]
    assert (one.ci, one.cr) == (0.0, 0.0)
    two = ahp_weights([[1, 3], [1 / 3, 1]])
    np.testing.assert_allclose(two.weights, [0.75, 0.25])
    assert two.cr == 0.0


def test_ahp_random_index_table() -> None:
    assert RANDOM_INDEX[3] == 0.58
    assert RANDOM_INDEX[5] == 1.12
    assert RANDOM_INDEX[10] == 1.49


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[1, 2, 3], [0.5, 1, 2]], "square"),
        ([[1, 2], [2, 1]], "not reciprocal"),
        ([[1, -2], [-0.5, 1]], "not positive"),
        ([[2, 2], [0.5, 1]], "diagonal"),
        ([[1, math.nan], [1, 1]], "non-finite"),
        ([["x"]], "numbers"),
        ([], "square"),
    ],
)
def test_ahp_validation(matrix: list[list[float]], message: str) -> None:
    with pytest.raises(McdmError, match=message):
        ahp_weights(matrix)


def test_ahp_unknown_method() -> None:
    with pytest.raises(McdmError, match="unknown AHP method"):
        ahp_weights(AHP_MATRIX, "median")  # type: ignore[arg-type]


def test_ahp_tolerates_rounded_reciprocals() -> None:
    result = ahp_weights([[1, 3], [0.333, 1]])
    assert result.weights[0] > result.weights[1]


# --------------------------------------------------------------------------- properties

# Values on a 0.1 grid: distinct values are well separated, equal values are exact ties,
# so summation-order rounding cannot turn a near-tie into a different ranking.
finite = st.integers(min_value=-1000, max_value=1000).map(lambda i: i / 10)
grid_weight = st.integers(min_value=-100, max_value=100).map(lambda i: i / 10)


@st.composite
def topsis_inputs(draw: st.DrawFn) -> tuple[list[list[float]], list[float]]:
    rows = draw(st.integers(min_value=1, max_value=7))
    cols = draw(st.integers(min_value=1, max_value=4))
    matrix = draw(
        st.lists(st.lists(finite, min_size=cols, max_size=cols), min_size=rows, max_size=rows)
    )
    weights = draw(
        st.lists(grid_weight, min_size=cols, max_size=cols).filter(lambda w: any(x != 0 for x in w))
    )
    return matrix, weights


@settings(max_examples=150, deadline=None)
@given(topsis_inputs())
def test_topsis_scores_are_in_unit_interval(data: tuple[list[list[float]], list[float]]) -> None:
    matrix, weights = data
    scores = topsis_scores(matrix, weights)
    assert scores.shape == (len(matrix),)
    assert np.all((scores >= 0.0) & (scores <= 1.0))


@settings(max_examples=150, deadline=None)
@given(topsis_inputs(), st.randoms(use_true_random=False))
def test_topsis_ranking_is_permutation_invariant(
    data: tuple[list[list[float]], list[float]], rnd: object
) -> None:
    matrix, weights = data
    order = list(range(len(matrix)))
    rnd.shuffle(order)  # type: ignore[attr-defined]
    scores = topsis_scores(matrix, weights)
    permuted = topsis_scores([matrix[i] for i in order], weights)
    # each alternative keeps its score (up to summation-order rounding) ...
    np.testing.assert_allclose(permuted, scores[order], rtol=1e-9, atol=1e-12)
    # ... so the ranking is the same up to ties
    ranked = [order[i] for i in topsis_rank([matrix[i] for i in order], weights)]
    for better, worse in itertools.pairwise(ranked):
        assert scores[better] >= scores[worse] - 1e-9


@settings(max_examples=100, deadline=None)
@given(topsis_inputs())
def test_topsis_is_deterministic(data: tuple[list[list[float]], list[float]]) -> None:
    matrix, weights = data
    first = topsis_scores(matrix, weights)
    second = topsis_scores(np.array(matrix), tuple(weights))
    assert first.tobytes() == second.tobytes()
    assert topsis_rank(matrix, weights) == topsis_rank(matrix, weights)


@settings(max_examples=100, deadline=None)
@given(topsis_inputs(), st.floats(min_value=0.01, max_value=100))
def test_topsis_weight_scale_does_not_change_the_ranking(
    data: tuple[list[list[float]], list[float]], factor: float
) -> None:
    matrix, weights = data
    scaled = topsis_scores(matrix, [w * factor for w in weights])
    np.testing.assert_allclose(scaled, topsis_scores(matrix, weights), rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.05, max_value=20), min_size=2, max_size=7))
def test_ahp_recovers_consistent_weights(raw: list[float]) -> None:
    w = np.array(raw) / sum(raw)
    matrix = w[:, None] / w[None, :]
    result = ahp_weights(matrix, "eigenvector", tolerance=1e-9)
    np.testing.assert_allclose(result.weights, w, rtol=1e-6)
    assert result.cr == pytest.approx(0.0, abs=1e-6)
