"""RowMask and Partners give what the dense arrays and lists they stand for give."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.sparse_rows import Partners, RowMask, pairs_within


@st.composite
def masks(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A table of rows (some repeated) and an index into it."""
    n_nodes = draw(st.integers(0, 11))
    n_rows = draw(st.integers(1, 5))
    table = np.array(
        draw(st.lists(st.lists(st.booleans(), min_size=n_nodes, max_size=n_nodes), **_n(n_rows))),
        dtype=bool,
    ).reshape(n_rows, n_nodes)
    index = np.array(draw(st.lists(st.integers(0, n_rows - 1), max_size=20)), dtype=np.intp)
    return index, table


def _n(n: int) -> dict[str, int]:
    return {"min_size": n, "max_size": n}


@settings(max_examples=200, deadline=None)
@given(masks())
def test_a_row_mask_indexes_as_its_dense_array(case: tuple[np.ndarray, np.ndarray]) -> None:
    index, table = case
    dense = table[index]
    mask = RowMask.build(index, table)
    assert mask.shape == dense.shape
    assert np.array_equal(mask.dense(), dense)
    assert len(mask.table) == len({row.tobytes() for row in dense})
    assert np.array_equal(mask.row_all(), dense.all(axis=1))
    assert np.array_equal(mask.row_any(), dense.any(axis=1))
    assert np.array_equal((~mask).dense(), ~dense)
    rows = np.arange(len(index))[::-1]
    assert np.array_equal(mask[rows], dense[rows])
    assert np.array_equal(mask[1:], dense[1:])
    for j in range(len(index)):
        assert np.array_equal(mask[j], dense[j])
        for n in range(dense.shape[1]):
            assert mask[j, n] == dense[j, n]
    if dense.shape[1]:
        cols = np.arange(len(index)) % dense.shape[1]
        assert np.array_equal(mask[rows, cols], dense[rows, cols])


@settings(max_examples=200, deadline=None)
@given(masks())
def test_distinct_numbers_rows_as_unique_over_packed_rows(
    case: tuple[np.ndarray, np.ndarray],
) -> None:
    index, table = case
    dense = table[index]
    packed = np.packbits(dense, axis=1)
    expected = np.zeros(len(dense), dtype=np.intp)
    if packed.shape[1]:
        expected = np.unique(packed.view(f"V{packed.shape[1]}").ravel(), return_inverse=True)[1]
    assert RowMask.build(index, table).distinct().tolist() == expected.ravel().tolist()


@settings(max_examples=100, deadline=None)
@given(masks(), st.data())
def test_combine_is_the_and_of_the_rows(
    case: tuple[np.ndarray, np.ndarray], data: st.DataObject
) -> None:
    index, table = case
    other = np.array(data.draw(st.lists(st.booleans(), **_n(table.size))), dtype=bool)
    other = other.reshape(table.shape)[::-1]
    usable = np.array(data.draw(st.lists(st.booleans(), **_n(table.shape[1]))), dtype=bool)
    a, b = RowMask.build(index, table), RowMask.build(index[::-1], other)
    combined = RowMask.combine([a, b], usable)
    assert np.array_equal(combined.dense(), usable[None, :] & a.dense() & b.dense())


def test_a_shared_row_is_read_only() -> None:
    mask = RowMask.build(np.zeros(3, dtype=np.intp), np.ones((1, 2), dtype=bool))
    with pytest.raises(ValueError):
        mask[0][0] = False
    with pytest.raises(TypeError):
        np.ones((3, 2), dtype=bool) & mask  # type: ignore[operator]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 8), st.lists(st.lists(st.integers(0, 7), max_size=4), max_size=4))
def test_partners_are_the_sorted_others_of_each_set(n_guests: int, sets: list[list[int]]) -> None:
    sets = [[g for g in s if g < n_guests] for s in sets]
    expected: list[set[int]] = [set() for _ in range(n_guests)]
    for s in sets:
        for a in s:
            expected[a].update(b for b in s if b != a)
    partners = Partners.within(n_guests, [np.array(s, dtype=np.intp) for s in sets])
    assert len(partners) == n_guests
    assert [p.tolist() for p in partners] == [sorted(e) for e in expected]
    assert partners.counts().tolist() == [len(e) for e in expected]
    assert partners.having().tolist() == [j for j, e in enumerate(expected) if e]
    assert all(p.dtype == np.intp for p in partners)


def test_pairs_within_nothing_is_empty() -> None:
    guest, partner = pairs_within([])
    assert guest.size == partner.size == 0


@settings(max_examples=200, deadline=None)
@given(masks(), st.data())
def test_a_row_appended_to_a_mask_is_the_dense_array_with_that_row(
    case: tuple[np.ndarray, np.ndarray], data: st.DataObject
) -> None:
    index, table = case
    mask = RowMask.build(index, table)
    row = np.array(data.draw(st.lists(st.booleans(), **_n(table.shape[1]))), dtype=bool)
    grown = mask.with_row(row)
    assert np.array_equal(grown.dense(), np.vstack([table[index], row[None, :]]))
    assert len(grown.table) == len({r.tobytes() for r in (*mask.table, row)})


def test_a_guest_appended_to_partners_keeps_the_others_rows() -> None:
    partners = Partners.within(4, [np.array([0, 2]), np.array([1, 2, 3])])
    grown = partners.with_row(np.array([1, 3], dtype=np.intp))
    assert [p.tolist() for p in grown] == [*([p.tolist() for p in partners]), [1, 3]]
    assert grown.counts().tolist() == [*partners.counts().tolist(), 2]
    assert [p.tolist() for p in Partners.within(0, []).with_row(np.zeros(0))] == [[]]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.data())
def test_rows_replaced_in_partners_are_those_rows_the_others_kept(
    n_guests: int, data: st.DataObject
) -> None:
    sets = data.draw(st.lists(st.lists(st.integers(0, max(n_guests - 1, 0)), max_size=3)))
    partners = Partners.within(n_guests, [np.array(s, dtype=np.intp) for s in sets if n_guests])
    row = st.lists(st.integers(0, n_guests), unique=True, max_size=3).map(sorted)
    rows = data.draw(st.dictionaries(st.integers(0, n_guests), row, max_size=3))
    grown = partners.with_rows({j: np.array(r, dtype=np.intp) for j, r in rows.items()})
    expected = [p.tolist() for p in partners] + ([[]] if n_guests in rows else [])
    for j, r in rows.items():
        expected[j] = r
    assert [p.tolist() for p in grown] == expected
    assert grown.counts().tolist() == [len(e) for e in expected]
