"""Proxmox's node selection: the crate's own evaluation (``pve decide``) and the batched one (the
pve strategies) are one arithmetic — they agree to rounding on every move."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.engine.mcdm import topsis_scores
from opendrs.engine.pve_selection import (
    TOPSIS_WEIGHTS,
    MigrationCandidate,
    NodeStats,
    combined_loads,
    cv_after_moves,
    fraction_shift,
    fractions_of,
    node_imbalance,
    pve_topsis_alternative,
    select_best_migration_topsis,
    stats_with_migration,
    topsis_alternatives,
    truncate_imbalance,
)

GIB = 1024**3


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[tuple[str, NodeStats]], list[MigrationCandidate]]:
    """Nodes with the guests on them, and every (guest, other node) move."""
    n_nodes = draw(st.integers(2, 6))
    names = [f"n{i}" for i in range(n_nodes)]
    guests = draw(
        st.lists(
            st.tuples(
                st.integers(0, n_nodes - 1),
                st.floats(0.05, 4.0, allow_nan=False),
                st.integers(1, 16).map(lambda g: g * GIB // 4),
            ),
            min_size=1,
            max_size=10,
        )
    )
    stats = [
        NodeStats(0.0, draw(st.integers(4, 64)), 0, draw(st.integers(32, 256)) * GIB) for _ in names
    ]
    for node, cpu, mem in guests:
        stats[node].add_running(cpu, mem)
    candidates = [
        MigrationCandidate(f"vm:{100 + j}", names[node], target, cpu, mem)
        for j, (node, cpu, mem) in enumerate(guests)
        for target in names
        if target != names[node]
    ]
    return list(zip(names, stats, strict=True)), candidates


def _arrays(
    nodes: list[tuple[str, NodeStats]], candidates: list[MigrationCandidate]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batched form: node loads, capacities, and each move's source, target and shift."""
    index = {name: i for i, (name, _) in enumerate(nodes)}
    load = np.array([[s.cpu, s.mem] for _, s in nodes], dtype=float)
    cap = np.array([[s.maxcpu, s.maxmem] for _, s in nodes], dtype=float)
    src = np.array([index[c.source] for c in candidates], dtype=np.intp)
    tgt = np.array([index[c.target] for c in candidates], dtype=np.intp)
    shift = np.stack([fraction_shift(np.array([c.cpu, float(c.mem)]), cap) for c in candidates])
    return load, cap, src, tgt, shift


@settings(max_examples=80, deadline=None)
@given(clusters())
def test_the_imbalance_after_each_move_agrees(
    case: tuple[list[tuple[str, NodeStats]], list[MigrationCandidate]],
) -> None:
    nodes, candidates = case
    load, cap, src, tgt, shift = _arrays(nodes, candidates)
    usable = np.ones(len(nodes), dtype=bool)
    batched = cv_after_moves(combined_loads(load, cap), usable, src, shift.mean(axis=2))
    for k, candidate in enumerate(candidates):
        crate = node_imbalance(stats_with_migration(nodes, candidate))
        assert batched[k, tgt[k]] == pytest.approx(crate, rel=1e-9, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(clusters())
def test_the_topsis_alternatives_and_choice_agree(
    case: tuple[list[tuple[str, NodeStats]], list[MigrationCandidate]],
) -> None:
    nodes, candidates = case
    load, cap, src, tgt, shift = _arrays(nodes, candidates)
    usable = np.ones(len(nodes), dtype=bool)
    rows = np.arange(len(candidates))
    matrix = topsis_alternatives(
        fractions_of(load, cap), usable, src, tgt, shift[rows, src], shift[rows, tgt]
    )
    crate = [pve_topsis_alternative(stats_with_migration(nodes, c)) for c in candidates]
    assert matrix == pytest.approx(np.array(crate), rel=1e-12)
    picked = select_best_migration_topsis(nodes, candidates)
    assert picked is not None
    scores = topsis_scores(matrix, TOPSIS_WEIGHTS)
    best = float(np.max(scores))
    # the crate's pick is among the batched best, to rounding
    assert scores[candidates.index(picked[0])] == pytest.approx(best, abs=1e-9)


def test_truncation_is_element_wise_and_exact() -> None:
    values = np.array([0.7231749488916931, 0.723174948891693, 1.0])
    assert truncate_imbalance(values).tolist() == [
        float(truncate_imbalance(v)) for v in values.tolist()
    ]
    assert truncate_imbalance(values)[0] == truncate_imbalance(values)[1]
