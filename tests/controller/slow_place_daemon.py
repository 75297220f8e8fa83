"""``python -m slow_place_daemon run --config FILE``: ``opendrs run`` with parts of it slowed (or
broken) as the environment says, for a test to stop the daemon while a request computes
(``tests/controller`` on its ``PYTHONPATH``):

- ``SLOW_PLACE``: seconds more the place view takes to build what the answers on each
  observation share — as the first ``POST /api/place`` after an observation of a cluster far
  larger than the test's would; one WARNING line (:data:`SLOWED`) says the build started;
- ``SLOW_WRITE``: seconds more a write of the dashboard's takes — a request to balance now
  before its transaction (as one waiting out SQLite's busy timeout), an approval after its
  verdict is committed, before its decision-log line (a slow disk); one WARNING line
  (:data:`WRITING`) says the write is slowed;
- ``SLOW_CLOSE``: seconds more the daemon's files take to close (a history checkpointing);
- ``BREAK_AFTER_STOP``: once the controller has stopped, the daemon fails with a RuntimeError (a
  bug of the stop path).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from opendrs.cli import daemon as daemon_module
from opendrs.cli.main import main
from opendrs.controller import http_write
from opendrs.controller.history import History
from opendrs.engine.observed_placement import ObservedPlacement
from opendrs.model.cluster import Cluster

#: The log line that says a slowed build has started.
SLOWED = "test: the place view's build is slowed"
#: The log line that says a write is slowed.
WRITING = "test: the write is slowed"

_build = ObservedPlacement.build
_request_balance = History.request_balance
_append_to_log = http_write.append_to_log
_close = daemon_module.DaemonFiles.close
_exit_status = daemon_module.DaemonRun.exit_status


def _slowed(variable: str, line: str) -> None:
    seconds = float(os.environ[variable])
    logging.getLogger("opendrs").warning("%s by %gs", line, seconds)
    time.sleep(seconds)


def _slow_build(cluster: Cluster) -> ObservedPlacement:
    _slowed("SLOW_PLACE", SLOWED)
    return _build(cluster)


def _slow_request_balance(self: History, by: str) -> None:
    _slowed("SLOW_WRITE", WRITING)
    _request_balance(self, by)


def _slow_append_to_log(path: str | None, verdict: dict[str, Any]) -> None:
    _slowed("SLOW_WRITE", WRITING)
    _append_to_log(path, verdict)


def _slow_close(self: daemon_module.DaemonFiles) -> None:
    time.sleep(float(os.environ["SLOW_CLOSE"]))
    _close(self)


def _broken_exit_status(self: daemon_module.DaemonRun, controller: Any) -> int:
    raise RuntimeError("test: a bug once the controller has stopped")


if __name__ == "__main__":
    if "SLOW_PLACE" in os.environ:
        ObservedPlacement.build = _slow_build  # type: ignore[method-assign]
    if "SLOW_WRITE" in os.environ:
        History.request_balance = _slow_request_balance  # type: ignore[method-assign]
        http_write.append_to_log = _slow_append_to_log
    if "SLOW_CLOSE" in os.environ:
        daemon_module.DaemonFiles.close = _slow_close  # type: ignore[method-assign]
    if "BREAK_AFTER_STOP" in os.environ:
        daemon_module.DaemonRun.exit_status = _broken_exit_status  # type: ignore[method-assign]
    sys.exit(main())
