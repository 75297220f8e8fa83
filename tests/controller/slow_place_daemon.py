"""``python -m slow_place_daemon run --config FILE``: ``opendrs run`` whose place view takes
``SLOW_PLACE`` seconds more to build what the answers on each observation share — as the first
``POST /api/place`` after an observation of a cluster far larger than the test's would. A test
starts it (``tests/controller`` on its ``PYTHONPATH``) to stop the daemon while a request
computes; it logs one WARNING line when the slowed build starts."""

from __future__ import annotations

import logging
import os
import sys
import time

from opendrs.cli.main import main
from opendrs.engine.observed_placement import ObservedPlacement
from opendrs.model.cluster import Cluster

#: The log line that says a slowed build has started.
SLOWED = "test: the place view's build is slowed"

_build = ObservedPlacement.build


def _slow_build(cluster: Cluster) -> ObservedPlacement:
    seconds = float(os.environ["SLOW_PLACE"])
    logging.getLogger("opendrs").warning("%s by %gs", SLOWED, seconds)
    time.sleep(seconds)
    return _build(cluster)


if __name__ == "__main__":
    ObservedPlacement.build = _slow_build  # type: ignore[method-assign]
    sys.exit(main())
