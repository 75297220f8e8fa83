"""``engine.distinct``: ``np.unique`` of an integer array, without numpy's masked arrays."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from opendrs.engine.distinct import distinct

_SHAPES = hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=40)


@given(hnp.arrays(st.sampled_from([np.int64, np.intp, np.int32]), _SHAPES))
def test_distinct_is_np_unique(values: np.ndarray) -> None:
    got, expected = distinct(values), np.unique(values)
    assert got.dtype == expected.dtype
    assert got.tolist() == expected.tolist()


def test_distinct_leaves_its_argument_as_it_was() -> None:
    values = np.array([3, 1, 3, 2])
    assert distinct(values).tolist() == [1, 2, 3]
    assert values.tolist() == [3, 1, 3, 2]
