"""``/healthz``'s answer (:meth:`DaemonMetrics.health`) measures the age of the last successful
cycle on the monotonic clock: a wall clock stepped forward makes no false alarm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client")

from fakes import FakeClock
from opendrs.controller.loop import Cycle
from opendrs.controller.metrics import DaemonMetrics


class _SteppedWall(FakeClock):
    """A host's clock whose wall clock (``now``) is ``step`` seconds off its monotonic time."""

    step = 0.0

    def now(self) -> float:
        return self.t + self.step


def test_a_wall_clock_stepped_forward_leaves_the_daemon_healthy() -> None:
    clock = _SteppedWall()
    controller = SimpleNamespace(
        clock=clock,
        policy=SimpleNamespace(interval=300, threshold=0.1),
        executor=SimpleNamespace(in_flight=()),
        standing_by=None,
    )
    metrics = DaemonMetrics()
    metrics.follow(controller)  # type: ignore[arg-type]
    metrics.cycle(Cycle(clock.now(), None, None))
    assert metrics.health() is None
    clock.step = 7200.0
    assert metrics.health() is None
    clock.sleep(601)
    assert metrics.health() == ("no successful cycle for 601 s (interval 300 s): no cycle since")
