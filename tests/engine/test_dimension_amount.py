"""A capacity dimension's amount as an operator reads it: cores or bytes, never a rounded 0."""

from __future__ import annotations

from opendrs.engine.constraints.rejection import Shortfall
from opendrs.engine.usage import Dimension, DimensionKind


def test_a_fraction_of_a_core_is_not_said_as_zero() -> None:
    used = Dimension(DimensionKind.CPU_USED)
    assert used.amount(0.006) == "0.006 cores"
    assert used.amount(0.25) == "0.25 cores"
    assert used.amount(0.0) == "0.0 cores"
    assert used.amount(14.44) == "14.4 cores"
    said = str(Shortfall(used, 0.006, 0.0))
    assert said == "cpu_used needs 0.006 cores, free 0.0 cores"


def test_bytes_take_their_unit() -> None:
    assert Dimension(DimensionKind.MEMORY).amount(8 * 1024**3) == "8.0 GiB"
    assert Dimension(DimensionKind.STORAGE, "local-zfs").amount(1024**4) == "1.0 TiB"
