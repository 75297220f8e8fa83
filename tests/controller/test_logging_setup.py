"""``setup_logging``: what the daemon's commands log, and what they keep quiet."""

from __future__ import annotations

import logging

import pytest

from opendrs.cli.process import setup_logging


@pytest.mark.usefixtures("restore_logging")
def test_http_requests_are_logged_at_the_debug_level_only() -> None:
    # httpx logs each request at INFO: at the info level an observation would log dozens of
    # lines (the Incus backend's calls); httpcore's steps never.
    setup_logging("info")
    assert logging.getLogger().level == logging.INFO
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    setup_logging("debug")
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpcore").isEnabledFor(logging.DEBUG)
