"""A read-only backend: a snapshot file, read again at every observation.

It lets the controller run in shadow mode against a cluster written by hand or exported by
another tool: ``opendrs run`` then records what it would do. Any attempt to migrate fails with a
:class:`BackendError` that is not transient.
"""

from __future__ import annotations

import os
from dataclasses import replace

from opendrs.backends.base import BackendError, Handle, Progress, StartGate
from opendrs.model.cluster import Cluster, Move, Settings
from opendrs.model.snapshot import SnapshotError, load


class FileBackend:
    """Observe a snapshot file; never act."""

    name = "file"
    read_only = True

    def __init__(self, path: str | os.PathLike[str], settings: Settings | None = None) -> None:
        self.path = os.fspath(path)
        self.settings = settings

    def observe(self) -> Cluster:
        try:
            cluster = load(self.path)
        except SnapshotError as exc:
            raise BackendError(str(exc), transient=True) from None
        if self.settings is not None:
            cluster = replace(cluster, settings=self.settings)
        return cluster

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        # Read-only: no request is ever sent, whatever the gate says.
        raise BackendError(
            f"cannot migrate {move.guest}: the file backend is read-only", transient=False
        )

    def poll(self, handle: Handle) -> Progress:
        raise BackendError(
            f"no migration {handle.id}: the file backend is read-only", transient=False
        )

    def find_migration(self, move: Move, since: float) -> Handle | None:
        return None

    def cancel(self, handle: Handle) -> bool:
        return False

    def set_maintenance(self, node: str, enabled: bool) -> None:
        raise BackendError("the file backend is read-only: no maintenance", transient=False)

    def close(self) -> None:
        return None
