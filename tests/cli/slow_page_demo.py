"""``python -m slow_page_demo demo …``: ``opendrs demo`` with its dashboard's page slowed by
``SLOW_PAGE`` seconds (as drawing its charts on a slow machine), for a test to end the demo while
a page is drawn (``tests/cli`` on its ``PYTHONPATH``). A line on stderr (:data:`DRAWING`) says a
slowed page has started."""

from __future__ import annotations

import os
import signal
import sys
import time

from opendrs.cli.main import main
from opendrs.controller.dashboard import Dashboard

#: The stderr line that says a slowed page is being drawn.
DRAWING = "test: the page is slowed"

_page = Dashboard.page


def _slow_page(self: Dashboard) -> str:
    print(DRAWING, file=sys.stderr, flush=True)
    time.sleep(float(os.environ["SLOW_PAGE"]))
    return _page(self)


if __name__ == "__main__":
    # Ctrl-C stops the demo even where the test runs with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    Dashboard.page = _slow_page  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
