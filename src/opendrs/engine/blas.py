"""The engine's matrix products on one BLAS thread.

numpy's BLAS (OpenBLAS) splits a product over as many threads as the machine has cores; the
engine's products are small in one dimension (two resources), and its other threads then spend
more time waiting for work than doing it — CPU taken from the other jobs of a shared machine
(`balance` at XXL on the skewed generator: a third of its CPU time). On one thread a product's
every element is computed as before, and a reduction no longer depends on how many cores the
machine has.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import cache

from threadpoolctl import ThreadpoolController


@cache
def _controller() -> ThreadpoolController:
    """The BLAS libraries loaded (numpy's), found once."""
    return ThreadpoolController()


def one_thread() -> AbstractContextManager[object]:
    """A context in which BLAS runs on one thread; the number it had is restored after."""
    return _controller().limit(limits=1, user_api="blas")
