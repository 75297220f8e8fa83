"""bench.month: what a migration budget buys on the built-in month (small budgets, one day)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.month import Month, above, day_zero, foresight, main

from opendrs.backends.scenario import builtin_scenario


@pytest.fixture(scope="module")
def month() -> Month:
    return Month.load(builtin_scenario("month"), days=1)


def test_budgets_are_kept_and_buy_balance(month: Month) -> None:
    start = above(month, month.start, 1)
    assert start == 100.0  # packed onto five nodes: above the threshold all day
    assert np.array_equal(foresight(month, 0, 1), month.start)
    searched = foresight(month, 20, 1)
    causal = day_zero(month, 20)
    for placement in (searched, causal):
        assert 0 < np.count_nonzero(placement != month.start) <= 20
    # Knowing the day judged beats knowing the day before, and both beat the start.
    assert above(month, searched, 1) <= above(month, causal, 1) < start
    assert np.array_equal(day_zero(month, 20), causal)  # deterministic


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--moves", "0", "--days", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | 100.0 % | 100.0 % |" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["--moves", "a,b"])
    assert exit_info.value.code == 2
    assert "--moves: expected whole numbers" in capsys.readouterr().err
