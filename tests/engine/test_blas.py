"""The engine's matrix products on one BLAS thread while a strategy runs."""

from __future__ import annotations

from typing import Any

import pytest
from threadpoolctl import threadpool_info

from opendrs.engine import blas
from opendrs.engine.strategies import REGISTRY, StrategyInfo, get_strategy
from opendrs.model.snapshot import load_demo


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_thread_inside_and_as_it_was_after() -> None:
    before = _blas_threads()
    assert before, "numpy's BLAS is found"
    with blas.one_thread():
        assert _blas_threads() == [1] * len(before)
    assert _blas_threads() == before


def test_a_strategy_runs_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[int]] = []
    info = get_strategy("balance")

    class Watched:
        name, summary, Options = info.name, info.summary, info.options

        def propose(self, view: Any, request: Any, options: Any) -> Any:
            seen.append(_blas_threads())
            return info.strategy.propose(view, request, options)

    monkeypatch.setitem(REGISTRY, "balance", StrategyInfo(Watched()))
    before = _blas_threads()
    get_strategy("balance").propose(load_demo())
    assert seen and all(set(s) == {1} for s in seen)
    assert _blas_threads() == before
