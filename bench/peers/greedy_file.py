"""ProxLB's greedy balancer end to end on a file, as one process (the end-to-end benchmark's peer).

``python -m bench.peers.greedy_file FILE OUT_JSON [--mode assigned|used] [--balanciness 5]``

ProxLB reads no file: it collects its ``ProxLbData`` from the Proxmox API, then balances. Its end
to end here is the nearest offline equivalent, all of it in this process: the file read as
``opendrs plan FILE`` reads it (a snapshot, or a proxlb-solver scenario), turned into ProxLB's
pydantic ``ProxLbData`` (:func:`bench.peers.proxlb_greedy.to_proxlb_data`: what its collectors
would build), its decision steps run (:func:`~bench.peers.proxlb_greedy.calculate`) and the moves
``Balancing.balance`` would execute written to ``OUT_JSON`` as ``{"placement": {guest: node}}``.
The API round trips and the migrations themselves are not in it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.peers import silence_peer_logs
from bench.peers.proxlb_greedy import (
    DEFAULT_BALANCINESS,
    DEFAULT_MODE,
    calculate,
    migrations,
    to_proxlb_data,
)
from opendrs.model.cluster import Cluster


def read_cluster(path: str) -> Cluster:
    """The cluster in ``path`` as ``opendrs plan`` reads it: a snapshot or a scenario."""
    from opendrs.compat.proxlb import is_proxlb_scenario, scenario_from_dict
    from opendrs.model.document import parse, read_file
    from opendrs.model.snapshot import from_dict

    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data
    if is_proxlb_scenario(document):
        return scenario_from_dict(document, filename=filename).cluster
    return from_dict(document, filename=filename)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.greedy_file",
        description="ProxLB's greedy balancer on a snapshot or scenario file (benchmark only).",
    )
    parser.add_argument("file")
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=("assigned", "used"), default=DEFAULT_MODE)
    parser.add_argument("--balanciness", type=int, default=DEFAULT_BALANCINESS)
    args = parser.parse_args(argv)
    data, notes = to_proxlb_data(
        read_cluster(args.file), mode=args.mode, balanciness=args.balanciness
    )
    silence_peer_logs()  # after ProxLB's imports: its logger sets its own level when created
    calculate(data)
    result = {"placement": migrations(data), "notes": list(notes)}
    args.out.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
