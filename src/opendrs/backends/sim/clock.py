"""Simulated time: the steps of a run and the queue of its pending events."""

from __future__ import annotations

import heapq
from typing import Any

__all__ = ["EventQueue", "count_steps"]


def count_steps(t: float, step: float, *, inclusive: bool) -> int:
    """How many step starts ``k·step`` are ``≤ t`` (``< t`` unless ``inclusive``), uncapped."""
    if t < 0:
        return 0
    k = int(t // step) + 1
    while k > 0 and ((k - 1) * step > t if inclusive else (k - 1) * step >= t):
        k -= 1
    while k * step <= t if inclusive else k * step < t:
        k += 1
    return k


class EventQueue:
    """The events still to happen, by time; events of the same instant in the order pushed."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = 0

    def push(self, when: float, kind: str, args: tuple[Any, ...]) -> None:
        """Add the event ``kind`` with ``args`` at ``when``."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, args))

    def next_time(self, target: float) -> float | None:
        """The time of the next event if it is at ``target`` or before, else None."""
        if self._heap and self._heap[0][0] <= target:
            return self._heap[0][0]
        return None

    def pop(self) -> tuple[str, tuple[Any, ...]]:
        """Remove the next event: its kind and arguments."""
        _, _, kind, args = heapq.heappop(self._heap)
        return kind, args
