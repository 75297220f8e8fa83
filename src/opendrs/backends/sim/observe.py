"""The guests the simulator shows: the snapshot's guests with the fields it changes filled in
(:class:`GuestBuilder`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from opendrs.model.cluster import Guest, updater

__all__ = ["DYNAMIC", "GuestBuilder"]

#: Guest fields the simulator changes; the others stay as in the snapshot. ``observe()`` copies
#: every running guest each time (its use and uptime change every step), with a fast ``replace``.
DYNAMIC: Final = (
    "node",
    "state",
    "cpu_used",
    "memory_used",
    "uptime",
    "ha_state",
    "migrating_to",
)
BUILD_GUEST: Final = updater(Guest, *DYNAMIC)

#: What the last remembered build was made of: cpu, memory, uptime, stamps, and its guests.
Built = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[Guest, ...]]


class GuestBuilder:
    """Builds the observed guests from the snapshot's (``templates``, for the fields that never
    change). Guests whose observed fields did not change since the last remembered build are the
    same objects; the others are built anew (running guests change every step: their use and
    their uptime)."""

    def __init__(self, templates: Sequence[Guest]) -> None:
        self.templates = list(templates)
        self.last: Built | None = None

    def build(
        self,
        *,
        nodes: Sequence[str],
        states: Sequence[str],
        cpu: np.ndarray,
        memory: np.ndarray,
        uptime: np.ndarray,
        ha_states: Sequence[str | None],
        targets: Sequence[str | None],
        stamp: np.ndarray,
        remember: bool,
    ) -> tuple[Guest, ...]:
        """The guests with these fields; ``stamp`` bumps when a guest's state changes. With
        ``remember``, the next build starts from this one."""
        last = self.last if remember else None
        columns = (
            nodes,
            states,
            cpu.tolist(),
            memory.tolist(),
            uptime.tolist(),
            ha_states,
            targets,
        )
        changed = None
        if last is not None:
            changed = np.flatnonzero(
                (cpu != last[0]) | (memory != last[1]) | (uptime != last[2]) | (stamp != last[3])
            )
        if last is None or changed is None or changed.size > len(self.templates) // 2:
            guests = tuple(map(BUILD_GUEST, self.templates, *columns))
        else:
            built = list(last[4])
            for j in changed.tolist():
                built[j] = BUILD_GUEST(self.templates[j], *(column[j] for column in columns))
            guests = tuple(built)
        if remember:
            self.last = (cpu, memory, uptime, stamp.copy(), guests)
        return guests
