"""``POST /api/place``: how long the daemon takes to answer where a new guest should start.

``python -m bench.place [--sizes S,M,L,XL] [--repeats 20] [--seed 1] [--request JSON]
[--affinity] [--markdown FILE]``. On the ``basic`` generator's cluster of each size (with its
rules), the place view is fed that cluster as one observation, then a server on a free loopback
port (``http.token_file``'s token) is asked ``--repeats`` times for ``--request`` (default
``{"cpu": 4, "memory": "8GiB"}``) over HTTP (one connection per request, as curl makes). The
first request after the observation builds what every answer on it shares (timed apart, as
"built once"); the table gives the median and the slowest answer after it, measured around the
whole request by the client (wall time), and the median CPU time of the same answer computed in
the process without HTTP: from the observation as the server does, and with the constraints
built for the request alone (what every request cost before the observation was kept).
``--affinity`` asks each size a second time, the request with a hard affinity to one of the
cluster's guests (the first that no node-affinity rule names) added.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.generate import SIZES, generate
from bench.report import emit
from opendrs.controller.config import HttpConfig
from opendrs.controller.http_server import MetricsServer
from opendrs.controller.loop import Cycle
from opendrs.controller.metrics import DaemonMetrics
from opendrs.controller.place_api import PlaceView, place_for
from opendrs.engine.observed_placement import ObservedPlacement
from opendrs.model.cluster import Cluster

TOKEN = "bench-token"
REQUEST = {"cpu": 4, "memory": "8GiB"}


def _ask(address: str, body: dict[str, Any]) -> float:
    """Seconds for one ``POST /api/place`` of ``body`` answered 200."""
    request = urllib.request.Request(
        f"http://{address}/api/place",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
        assert answer.status == 200
    return time.perf_counter() - start


def with_affinity(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a hard affinity to the cluster's first guest that no node-affinity rule
    names (the new guest would run with it: its partner rows are the request's to add)."""
    pinned = {g for rule in cluster.rules.node_affinity for g in rule.guests}
    partner = next(g.id for g in cluster.guests if g.id not in pinned)
    return {**body, "affinity": [*body.get("affinity", []), partner]}


def measure(size: str, repeats: int, seed: int, body: dict[str, Any], affinity: bool) -> list[str]:
    """A row of the table for ``size``, asked ``body`` (with ``affinity``: and
    :func:`with_affinity`)."""
    cluster = generate(size, seed=seed, rules=True)
    if affinity:
        body = with_affinity(cluster, body)
    view = PlaceView()
    view.cycle(Cycle(time.time(), cluster, None))
    server = MetricsServer(HttpConfig("127.0.0.1", 0), DaemonMetrics(), TOKEN, None, view)
    server.start()
    try:
        first = _ask(server.address, body)  # builds the observation's share
        http = sorted(_ask(server.address, body) for _ in range(repeats))
    finally:
        server.stop()
    observed = ObservedPlacement.build(cluster)
    rebuilt = _timed(lambda: place_for(cluster, body), repeats)
    kept = _timed(lambda: place_for(cluster, body, observed), repeats)
    ms = 1000.0
    return [
        size,
        "hard affinity" if affinity else "as given",
        f"{len(cluster.nodes):,}",
        f"{len(cluster.guests):,}",
        f"{first * ms:.1f}",
        f"{statistics.median(http) * ms:.1f}",
        f"{http[-1] * ms:.1f}",
        f"{statistics.median(kept) * ms:.1f}",
        f"{statistics.median(rebuilt) * ms:.1f}",
    ]


def _timed(answer: Callable[[], object], repeats: int) -> list[float]:
    """CPU seconds of the process for each of ``repeats`` calls of ``answer`` (its server is
    stopped by then: the calls are all it runs; on a loaded machine wall time is not theirs)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        answer()
        times.append(time.process_time() - start)
    return times


def _request(text: str) -> dict[str, Any]:
    """``--request``: a JSON object."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.place")
    parser.add_argument("--sizes", default="S,M,L,XL")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--request", type=_request, default=REQUEST, help="a JSON object")
    parser.add_argument(
        "--affinity",
        action="store_true",
        help="also ask each size with a hard affinity to one of its guests",
    )
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size {unknown[0]!r} (known: {', '.join(SIZES)})")
    header = (
        "| size | request | nodes | guests | HTTP first ms (built once) | HTTP median ms"
        " | HTTP slowest ms | in process CPU ms | in process, rebuilt per request CPU ms |"
    )
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for size in sizes:
        for affinity in (False, True) if args.affinity else (False,):
            row = measure(size, args.repeats, args.seed, args.request, affinity)
            lines.append("| " + " | ".join(row) + " |")
    emit("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
