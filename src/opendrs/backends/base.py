"""The backend protocol: how the controller sees and changes a cluster.

One controller drives every environment — a snapshot file, the simulator, Proxmox VE — through
this protocol, the way pve-ha-manager runs one manager against real and simulated hardware:

* :meth:`Backend.observe` returns the cluster as it is now (guests in flight carry
  ``migrating_to``, so the engine counts them on both nodes);
* :meth:`Backend.start_migration` starts one live migration and returns a :class:`Handle` at once;
* :meth:`Backend.poll` tells whether it is still running, done, or failed and why;
* :meth:`Backend.cancel` asks the platform to stop a migration that is given up on;
* :meth:`Backend.set_maintenance` puts a node into maintenance or takes it out, where the platform
  has it.

A backend whose platform evacuates a node itself and brings its guests back (Incus's evacuate and
restore) also has the optional hook :class:`PlatformMaintenance`, which ``opendrs maintenance``
drives; the others (Proxmox VE, whose API has no such call; the simulator; a file) have not.

Time also comes from the backend (:class:`Clock`): the real clock for a real cluster, simulated
time for the simulator, whose ``sleep`` advances the simulation. The controller never calls
:mod:`time` itself, so anything it does can be replayed in the simulator in milliseconds.

Every failure is a :class:`BackendError` with a one-line reason; nothing else may escape a backend
method, so the executor can record it and work around it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from opendrs.model.cluster import Cluster, Move
from opendrs.model.snapshot import refused

__all__ = [
    "Abandoned",
    "Backend",
    "BackendError",
    "Clock",
    "Handle",
    "HttpError",
    "PlatformMaintenance",
    "Progress",
    "SystemClock",
    "after_tries",
    "check_observation",
]

ProgressState = Literal["running", "done", "failed"]


class BackendError(Exception):
    """An operation on the cluster failed; ``str()`` is one line that says why.

    ``transient`` is true when trying again later may succeed (a timeout, an API error, a node
    that is busy), false when it will not (bad credentials, a guest that does not exist, a backend
    that is read-only).

    ``uncertain`` is true when a request that changes the cluster (a migration) may have reached
    the platform although no answer came back (the connection broke after the request was sent,
    the call's deadline passed, the daemon was asked to stop meanwhile): the caller must look at
    the platform to learn what happened, and must not simply send it again.
    """

    def __init__(self, reason: str, *, transient: bool = True, uncertain: bool = False) -> None:
        super().__init__(reason)
        self.reason = " ".join(reason.split()) or "unknown error"
        self.transient = transient
        self.uncertain = uncertain

    def __str__(self) -> str:
        return self.reason


def check_observation(cluster: Cluster, fields: dict[str, str]) -> Cluster:
    """``cluster`` when the snapshot format would take its nodes and guests — the same rules
    (:func:`~opendrs.model.snapshot.refused`) — else a :class:`BackendError`, one line naming
    the node or guest and the API field its value came from: ``fields`` maps a snapshot key
    (``guest.memory``, ``node.usage``, the longest that matches) to the field's description."""
    found = refused(cluster)
    if found is None:
        return cluster
    key = f"{found.kind}.{found.key}"
    while key not in fields and "." in key:
        key = key.rsplit(".", 1)[0].split("[", 1)[0]
    source = fields.get(key, found.key)
    raise BackendError(
        f"the observation is refused: {found.kind} {found.name}: {found.key}, from {source}: "
        f"{found.reason}"
    )


class HttpError(BackendError):
    """An error answer of a platform's HTTP API: its status and message."""

    def __init__(self, reason: str, status: int, message: str, *, transient: bool) -> None:
        super().__init__(reason, transient=transient)
        self.status = status
        self.message = message


def after_tries(last: BackendError, retries: int) -> BackendError:
    """The error to raise when every try of a call failed, ``last`` the last one's: a
    transient one says how many tries were made (an :class:`HttpError` keeps its status)."""
    if not (retries and last.transient):
        return last
    reason = f"{last.reason} (after {retries + 1} tries)"
    if isinstance(last, HttpError):
        return HttpError(reason, last.status, last.message, transient=True)
    return BackendError(reason, transient=True)


class Abandoned(BackendError):
    """A call given up on: opendrs is stopping, or the observation it served failed."""


@dataclass(frozen=True, slots=True)
class Handle:
    """A migration the backend has started.

    ``id`` is the backend's own name for it (a Proxmox task UPID, a simulator operation number);
    together with ``move`` it is enough to poll the migration again after a restart, so the
    controller stores both in its history.
    """

    id: str
    move: Move
    #: Backend clock (seconds since the epoch, or simulated seconds) when it started.
    started: float


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a migration stands: ``running``, ``done``, or ``failed`` with a reason."""

    state: ProgressState
    reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.state != "running"


RUNNING = Progress("running")
DONE = Progress("done")


def failed(reason: str) -> Progress:
    return Progress("failed", " ".join(reason.split()) or "unknown error")


@runtime_checkable
class Clock(Protocol):
    """Time as the controller sees it."""

    def now(self) -> float:
        """Seconds (since the epoch for a real cluster, since the start for the simulator)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait — in the simulator, advance the simulation by this much."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@runtime_checkable
class Backend(Protocol):
    """A cluster the controller can observe and act on."""

    #: Short name for logs and reports (``file``, ``sim``, ``proxmox``).
    name: str
    #: True when the backend can only observe (``start_migration`` always fails).
    read_only: bool

    def observe(self) -> Cluster:
        """The cluster now. Raises :class:`BackendError` when it cannot be observed.

        Measured usage (each guest's ``cpu_used`` and ``memory_used``, each node's own load) is
        the backend's average over a window it documents — Proxmox: the RRD averages over its
        ``usage_window``, the last hour by default; the simulator: the current step; a snapshot
        file: what the file says. The policy smooths on top of that (``policy.smoothing``), and
        its documentation says how the two windows combine (docs/configuration.md).
        """
        ...

    def start_migration(self, move: Move) -> Handle:
        """Start migrating ``move.guest`` from ``move.source`` to ``move.target``.

        Returns as soon as the platform accepted it. Raises :class:`BackendError` when it refuses.
        """
        ...

    def poll(self, handle: Handle) -> Progress:
        """Where the migration stands now. Raises :class:`BackendError` when it cannot be asked."""
        ...

    def find_migration(self, move: Move, since: float) -> Handle | None:
        """The platform's migration of ``move`` that started at ``since`` or later, if it shows one.

        For a request whose answer was lost: the handle lets the caller follow (and stop) the
        migration it started. ``None`` when the platform shows none, or cannot tell. Raises
        :class:`BackendError` when the platform cannot be asked.
        """
        ...

    def cancel(self, handle: Handle) -> bool:
        """Ask the platform to stop a migration that is given up on (best effort).

        Returns True when the platform was asked, False when it has no way to stop one. The
        migration may still end either way: the caller looks at where the guest is afterwards.
        Raises :class:`BackendError` when the request failed.
        """
        ...

    def set_maintenance(self, node: str, enabled: bool) -> None:
        """Put ``node`` into maintenance or take it out; :class:`BackendError` if unsupported."""
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...


@runtime_checkable
class PlatformMaintenance(Protocol):
    """The optional hook of a backend whose platform empties a node and refills it itself: each
    call returns once the platform has finished (its guests moved off, or back), and raises
    :class:`BackendError` when it failed or did not finish in the backend's time limit."""

    def evacuate(self, node: str) -> None:
        """Put ``node`` into the platform's maintenance: its guests move elsewhere."""
        ...

    def restore(self, node: str) -> None:
        """Take ``node`` out of maintenance: the platform brings its guests back."""
        ...
