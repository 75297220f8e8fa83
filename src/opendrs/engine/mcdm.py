"""Multi-criteria decision making: TOPSIS and AHP.

Pure and deterministic functions, used to score placement alternatives.

* :func:`topsis_scores` / :func:`topsis_rank` reproduce Proxmox's
  ``proxmox-resource-scheduling`` ``topsis.rs`` bit for bit: the same
  normalisation, the same ideal alternatives and the same floating-point
  operation order (sums are folded left to right, as Rust's ``fold`` does),
  so that ties break exactly as they do in Proxmox.
* :func:`ahp_weights` derives criterion weights from a pairwise-comparison
  matrix (Saaty's Analytic Hierarchy Process) and reports its consistency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "RANDOM_INDEX",
    "AhpMethod",
    "AhpResult",
    "McdmError",
    "ahp_weights",
    "topsis_rank",
    "topsis_scores",
]

ArrayLike = npt.ArrayLike | Sequence[Sequence[float]]


class McdmError(ValueError):
    """Invalid input for a multi-criteria decision method."""


# --------------------------------------------------------------------------- TOPSIS


def _as_matrix(matrix: ArrayLike, n_weights: int) -> npt.NDArray[np.float64]:
    try:
        values = np.array(matrix, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise McdmError(f"matrix must be a 2-D array of numbers ({exc})") from None
    if values.ndim == 1 and values.size == 0:
        values = values.reshape(0, n_weights)
    if values.ndim != 2:
        raise McdmError(f"matrix must be 2-D (alternatives x criteria), got {values.ndim}-D")
    if values.shape[1] != n_weights:
        raise McdmError(
            f"matrix has {values.shape[1]} criteria (columns) but {n_weights} weights were given"
        )
    if not np.all(np.isfinite(values)):
        row, col = (int(i) for i in np.argwhere(~np.isfinite(values))[0])
        raise McdmError(
            f"matrix value at row {row}, criterion {col} is not finite ({values[row, col]})"
        )
    return values


def _normalised_weights(weights: ArrayLike) -> tuple[npt.NDArray[np.float64], list[bool]]:
    """Mirror ``TopsisCriteria::new``: |w| / Σ|w|, sign → maximise (w ≥ 0) or minimise."""
    try:
        raw = np.array(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise McdmError(f"weights must be a 1-D sequence of numbers ({exc})") from None
    if raw.ndim != 1 or raw.size == 0:
        raise McdmError("weights must be a non-empty 1-D sequence of numbers")
    if not np.all(np.isfinite(raw)):
        index = int(np.argwhere(~np.isfinite(raw))[0][0])
        raise McdmError(f"weight {index} is not finite ({raw[index]})")
    maximise = [bool(w >= 0.0) for w in raw]
    magnitudes = np.abs(raw)
    divisor = 0.0
    for weight in magnitudes:  # left fold, as in Rust
        divisor = divisor + float(weight)
    if divisor == 0.0:
        raise McdmError("no criterion has a non-zero weight (the weights sum to zero)")
    normalised = magnitudes / divisor
    if not np.all(np.isfinite(normalised)):
        raise McdmError("the weights cannot be normalised to finite values")
    return normalised, maximise


def _fold_sum_of_squares_rows(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Σ over rows of value², folded row by row (vectorised across columns)."""
    acc = np.zeros(values.shape[1], dtype=np.float64)
    for row in values:
        acc = acc + row * row
    return acc


def _fold_sum_of_squares_cols(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Σ over columns of value², folded column by column (vectorised across rows)."""
    acc = np.zeros(values.shape[0], dtype=np.float64)
    for col in values.T:
        acc = acc + col * col
    return acc


def topsis_scores(matrix: ArrayLike, weights: ArrayLike) -> npt.NDArray[np.float64]:
    """Closeness of each alternative (row) to the ideal one, in [0, 1]; higher is better.

    Mirrors ``topsis::score_alternatives`` of proxmox-resource-scheduling:

    1. a negative weight means *minimise* that criterion; weights are divided by
       the sum of their absolute values (a zero sum is an error);
    2. every column is divided by its L2 norm (an all-zero column stays as is);
       a non-finite value is an error;
    3. the ideal and anti-ideal alternatives come from the *unweighted*
       normalised matrix;
    4. ``d± = ‖w ⊙ (x − ideal±)‖₂`` and the score is ``d⁻ / (d⁺ + d⁻)``,
       or 0 when that sum is 0 (all alternatives equal).

    Raises:
        McdmError: on a malformed matrix, non-finite values or all-zero weights.
    """
    w, maximise = _normalised_weights(weights)
    x = _as_matrix(matrix, w.size)
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)

    norms = np.sqrt(_fold_sum_of_squares_rows(x))
    nonzero = norms != 0.0
    x = x.copy()
    x[:, nonzero] = x[:, nonzero] / norms[nonzero]
    if not np.all(np.isfinite(x)):
        raise McdmError("normalising the matrix produced a non-finite value")

    col_max = x.max(axis=0)
    col_min = x.min(axis=0)
    best = np.where(maximise, col_max, col_min)
    worst = np.where(maximise, col_min, col_max)

    d_best = np.sqrt(_fold_sum_of_squares_cols((x - best) * w))
    d_worst = np.sqrt(_fold_sum_of_squares_cols((x - worst) * w))
    divisor = d_worst + d_best
    safe = np.where(divisor == 0.0, 1.0, divisor)
    scores = np.where(divisor == 0.0, 0.0, d_worst / safe)
    if not np.all(np.isfinite(scores)):
        raise McdmError("TOPSIS produced a non-finite score")
    return scores


def topsis_rank(matrix: ArrayLike, weights: ArrayLike) -> list[int]:
    """Indices of the alternatives, best first (a stable sort by descending score).

    Mirrors ``topsis::rank_alternatives``: alternatives with equal scores keep
    their input order.
    """
    scores = topsis_scores(matrix, weights)
    return sorted(range(scores.size), key=lambda i: -float(scores[i]))


# --------------------------------------------------------------------------- AHP

AhpMethod = Literal["eigenvector", "column-average", "geometric-mean"]

#: Saaty's random consistency index RI(n) for n = 1 … 15.
RANDOM_INDEX: dict[int, float] = {
    1: 0.0,
    2: 0.0,
    3: 0.58,
    4: 0.90,
    5: 1.12,
    6: 1.24,
    7: 1.32,
    8: 1.41,
    9: 1.45,
    10: 1.49,
    11: 1.51,
    12: 1.48,
    13: 1.56,
    14: 1.57,
    15: 1.59,
}


@dataclass(frozen=True)
class AhpResult:
    """Weights derived from a pairwise-comparison matrix and its consistency.

    Attributes:
        weights: criterion weights, summing to 1, in the matrix's row order.
        lambda_max: the principal eigenvalue (or its estimate ``mean((A·w)/w)``
            for the approximate methods).
        ci: consistency index ``(λmax − n) / (n − 1)`` (0 for n = 1).
        cr: consistency ratio ``CI / RI(n)`` (0 when RI(n) is 0, i.e. n ≤ 2);
            below 0.1 is conventionally acceptable.
        method: the method used.
    """

    weights: npt.NDArray[np.float64]
    lambda_max: float
    ci: float
    cr: float
    method: str

    @property
    def consistent(self) -> bool:
        """Whether the consistency ratio is below Saaty's 0.1 limit."""
        return self.cr < 0.1


def _validate_pairwise(pairwise: ArrayLike, tolerance: float) -> npt.NDArray[np.float64]:
    try:
        a = np.array(pairwise, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise McdmError(f"pairwise matrix must be a square array of numbers ({exc})") from None
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise McdmError(f"pairwise matrix must be square and non-empty, got shape {a.shape}")
    n = a.shape[0]
    if n not in RANDOM_INDEX:
        raise McdmError(f"pairwise matrix has {n} criteria; at most {max(RANDOM_INDEX)} supported")
    if not np.all(np.isfinite(a)):
        raise McdmError("pairwise matrix contains a non-finite value")
    if np.any(a <= 0.0):
        i, j = (int(k) for k in np.argwhere(a <= 0.0)[0])
        raise McdmError(f"pairwise matrix entry ({i}, {j}) = {a[i, j]} is not positive")
    for i in range(n):
        if abs(a[i, i] - 1.0) > tolerance:
            raise McdmError(f"pairwise matrix diagonal entry ({i}, {i}) = {a[i, i]} is not 1")
        for j in range(i + 1, n):
            if abs(a[i, j] * a[j, i] - 1.0) > tolerance:
                raise McdmError(
                    f"pairwise matrix is not reciprocal: entry ({i}, {j}) = {a[i, j]} but "
                    f"({j}, {i}) = {a[j, i]}, expected {1.0 / a[i, j]}"
                )
    return a


def _principal_eigenvector(a: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], float]:
    """Perron eigenvector (normalised to sum 1) and eigenvalue of a positive matrix."""
    eigenvalues, eigenvectors = np.linalg.eig(a)
    index = int(np.argmax(eigenvalues.real))
    vector = np.abs(eigenvectors[:, index].real)
    return vector / vector.sum(), float(eigenvalues[index].real)


def ahp_weights(
    pairwise: ArrayLike,
    method: AhpMethod = "eigenvector",
    *,
    tolerance: float = 1e-2,
) -> AhpResult:
    """Criterion weights from Saaty's pairwise-comparison matrix.

    Args:
        pairwise: square matrix, ``a[i][j]`` = how much more important criterion
            i is than j; it must be positive with ``a[j][i] = 1 / a[i][j]``.
        method: ``"eigenvector"`` (principal eigenvector, the classic AHP),
            ``"column-average"`` (average of the column-normalised rows) or
            ``"geometric-mean"`` (normalised row geometric means).
        tolerance: allowed absolute deviation of ``a[i][j]·a[j][i]`` from 1
            (so that ``0.333`` may stand for ``1/3``).

    Raises:
        McdmError: if the matrix is not square, not positive or not reciprocal,
            or the method is unknown.
    """
    a = _validate_pairwise(pairwise, tolerance)
    n = a.shape[0]
    if method == "eigenvector":
        weights, lambda_max = _principal_eigenvector(a)
    elif method == "column-average":
        weights = (a / a.sum(axis=0)).mean(axis=1)
        weights = weights / weights.sum()
        lambda_max = float(np.mean((a @ weights) / weights))
    elif method == "geometric-mean":
        weights = np.exp(np.log(a).mean(axis=1))
        weights = weights / weights.sum()
        lambda_max = float(np.mean((a @ weights) / weights))
    else:
        raise McdmError(
            f"unknown AHP method {method!r}; use 'eigenvector', 'column-average' "
            "or 'geometric-mean'"
        )
    ci = 0.0 if n == 1 else (lambda_max - n) / (n - 1)
    ri = RANDOM_INDEX[n]
    cr = 0.0 if ri == 0.0 else ci / ri
    if not (math.isfinite(ci) and math.isfinite(cr)):  # pragma: no cover - defensive
        raise McdmError("the consistency index is not finite")
    return AhpResult(
        weights=weights.astype(np.float64), lambda_max=lambda_max, ci=ci, cr=cr, method=method
    )
