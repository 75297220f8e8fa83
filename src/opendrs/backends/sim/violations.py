"""Whose each capacity violation is (:class:`ViolationCauses`).

A (node, step) pair over a hard capacity limit is counted once, under the first cause that
accounts for it:

* ``moves`` — the controller's: one of its migrations in flight takes a guest onto the node (a
  migrating guest loads both nodes), or the node would be within its limits without the guests
  the controller moved there less than 30 minutes before
  (:data:`~opendrs.backends.sim.simulator.MOVE_ACCOUNTED`: a plan judges each guest on its use
  over the hold, 30 minutes), or is over a configured limit it would be within without any of
  the guests the controller moved there;
* ``platform`` — the platform's: one of its migrations in flight (an HA failback, one already in
  flight in the snapshot) takes a guest onto the node, or the node would be within every limit
  without the guests the platform put where they are (restarted there by HA recovery, moved
  there by a failback): nothing checked those against opendrs's plan;
* ``placement`` — none of those, the node over a configured limit (vCPUs or memory committed
  beyond the overcommit, local disks beyond their pool) with the guests it had at the start;
* ``load`` — none of those: in dynamic mode, the guests on the node using more CPU or memory
  than it has, with no move of the last 30 minutes needed for it. A guest the controller moved
  there earlier counts here: a plan is checked against the use measured when it is made, not
  against the use that comes hours or days later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ViolationCauses"]


@dataclass
class ViolationCauses:
    """The capacity violations counted so far, by whose they are (mutable)."""

    moves: int = 0
    platform: int = 0
    placement: int = 0
    load: int = 0

    def add(
        self,
        over: np.ndarray,
        *,
        by_moves: np.ndarray,
        by_platform: np.ndarray,
        cfg_over: np.ndarray,
    ) -> None:
        """Count the (node, step) pairs of ``over`` (nodes, steps): those of ``by_moves`` as the
        controller's, the rest of ``by_platform`` as the platform's, the rest over a configured
        limit (``cfg_over``, per node) as the placement's and what is left as the load's."""
        moves = over & by_moves
        left = over & ~moves
        platform = left & by_platform
        left &= ~platform
        placement = left & cfg_over[:, None]
        self.moves += int(np.count_nonzero(moves))
        self.platform += int(np.count_nonzero(platform))
        self.placement += int(np.count_nonzero(placement))
        self.load += int(np.count_nonzero(left & ~placement))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
