"""Closing a backend's :class:`~opendrs.backends.tries.Tries`: every try still running is given
up on, and its thread waited for a bounded time; one that outlasts it is counted and logged."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from opendrs.backends.base import Abandoned
from opendrs.backends.tries import Tries


def given_up_call(work: threading.Event) -> Tries:
    """Tries with one call on their own thread that waits for ``work``, given up on (opendrs
    stopping) while its try runs on."""
    stop = threading.Event()
    tries = Tries("Proxmox API", "test-call", lambda: "stopping" if stop.is_set() else None)

    def call() -> None:
        with pytest.raises(Abandoned):
            tries.run(work.wait, what="GET /x", seconds=60, uncertain=False)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)
    stop.set()
    caller.join(5)
    assert not caller.is_alive()
    return tries


def test_close_waits_for_a_try_that_ends(caplog: pytest.LogCaptureFixture) -> None:
    work = threading.Event()
    tries = given_up_call(work)
    threading.Timer(0.3, work.set).start()
    with caplog.at_level(logging.WARNING, logger="opendrs"):
        assert tries.close(seconds=5) == 0
    assert [t for t in threading.enumerate() if t.name == "test-call"] == []
    assert "still running" not in caplog.text


def test_a_try_outlasting_the_bound_is_left_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    work = threading.Event()
    tries = given_up_call(work)
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="opendrs"):
            assert tries.close(seconds=0.3) == 1
        assert time.monotonic() - started < 3
        assert "1 call(s) to the Proxmox API still running 0.3s after" in caplog.text
    finally:
        work.set()
