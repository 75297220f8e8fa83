"""Adapters that run the peers — ProxLB's greedy balancer and proxlb-solver — on opendrs clusters.

The peers are GPL-3.0 tools installed only for benchmarking (the ``bench`` extra); opendrs's own
package never imports them. Each adapter has two halves:

* a *spec* function that turns an opendrs :class:`~opendrs.model.cluster.Cluster` into plain data
  in the peer's model shape (dicts and lists, no peer import), so the conversion can be tested
  without the peer installed;
* a ``run`` function that validates the spec into the peer's pydantic models, runs the peer
  offline and reads its placement back as a :class:`PeerResult`.

Every result is then evaluated by the benchmark with opendrs's own code, like opendrs's
strategies' results.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Peer name → adapter module.
PEERS: dict[str, str] = {
    "proxlb-greedy": "bench.peers.proxlb_greedy",
    "proxlb-solver": "bench.peers.proxlb_solver",
}

#: The logger both peers write to (ProxLB's ``SystemdLogger`` logs to stdout).
PEER_LOGGER = "ProxLB"


@dataclass(frozen=True)
class PeerResult:
    """What a peer decided, in opendrs's terms."""

    peer: str
    #: Guest id → its new node, for every guest the peer moves (unmoved guests are left out).
    placement: Mapping[str, str]
    #: Seconds spent in the peer's own code (conversion to its model excluded).
    seconds: float
    #: Peer-specific figures for the report (status, plan steps, …): JSON-compatible values.
    info: Mapping[str, object] = field(default_factory=dict)
    #: What the conversion could not express in the peer's model.
    notes: tuple[str, ...] = ()


def silence_peer_logs() -> None:
    """Keep the peers' log lines (ProxLB logs warnings to stdout) out of the benchmark output."""
    logging.getLogger(PEER_LOGGER).setLevel(logging.CRITICAL + 1)


__all__ = ["PEERS", "PEER_LOGGER", "PeerResult", "silence_peer_logs"]
