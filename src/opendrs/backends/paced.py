"""A simulated clock held to a pace of wall time, so that a person (or a browser test) can watch.

The simulator's own clock (:class:`opendrs.backends.sim.Simulator`) jumps ahead as fast as it
computes: a simulated day passes in a second. :class:`PacedClock` wraps it: each ``sleep`` of
``s`` simulated seconds waits ``s / speed`` seconds of wall time, in slices, advancing the
simulation slice by slice, and returns early once ``should_stop`` says so (a signal asked the
daemon to stop). ``backend: {type: sim, speed: N}`` in a configuration uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from opendrs.backends.base import Clock

__all__ = ["PacedClock"]

#: The longest wall-time slice of a sleep: how soon a stop is seen.
SLICE = 0.1


class PacedClock:
    """``clock``'s time, passing ``speed`` simulated seconds per second of wall time at most."""

    def __init__(
        self, clock: Clock, speed: float, should_stop: Callable[[], bool] | None = None
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be more than 0, not {speed!r}")
        self.clock = clock
        self.speed = float(speed)
        self.should_stop = should_stop or (lambda: False)

    def now(self) -> float:
        return self.clock.now()

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep(self, seconds: float) -> None:
        """Advance the simulation by ``seconds``, over ``seconds / speed`` of wall time."""
        left = float(seconds)
        while left > 0 and not self.should_stop():
            step = min(left, SLICE * self.speed)
            time.sleep(step / self.speed)
            before = self.clock.now()
            self.clock.sleep(step)
            if self.clock.now() <= before:  # the simulation has ended: nothing more to wait for
                return
            left -= step
