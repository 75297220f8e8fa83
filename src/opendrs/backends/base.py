"""The backend protocol: how the controller sees and changes a cluster.

One controller drives every environment — a snapshot file, the simulator, Proxmox VE — through
this protocol, the way pve-ha-manager runs one manager against real and simulated hardware:

* :meth:`Backend.observe` returns the cluster as it is now (guests in flight carry
  ``migrating_to``, so the engine counts them on both nodes);
* :meth:`Backend.start_migration` starts one live migration and returns a :class:`Handle` at once,
  sending its request only while the caller's :class:`StartGate` still lets it;
* :meth:`Backend.poll` tells whether it is still running, done, or failed and why;
* :meth:`Backend.cancel` asks the platform to stop a migration that is given up on;
* :meth:`Backend.set_maintenance` puts a node into maintenance or takes it out, where the platform
  has it.

A backend whose platform evacuates a node itself and brings its guests back (Incus's evacuate and
restore) also has the optional hook :class:`PlatformMaintenance`, which ``opendrs maintenance``
drives; the others (Proxmox VE, whose API has no such call; the simulator; a file) have not.
The other optional abilities are small protocols too, each checked with :func:`isinstance`:
:class:`Standby` (a daemon that only acts where it leads: Proxmox VE, Incus), :class:`LastMoves`
(moves the platform records, by any balancer: Incus), :class:`PolicyDefaults` (policy fields the
platform's own settings set: Incus, the simulator of an Incus scenario),
:class:`PlatformMotions` (moves the platform makes itself: Proxmox VE's HA manager) and
:class:`RenewsSecret` (a secret read from a file again at a reload: Proxmox VE's API token).

Time also comes from the backend (:class:`Clock`): the real clock for a real cluster, simulated
time for the simulator, whose ``sleep`` advances the simulation. The controller never calls
:mod:`time` itself, so anything it does can be replayed in the simulator in milliseconds.

Every failure is a :class:`BackendError` with a one-line reason; nothing else may escape a backend
method, so the executor can record it and work around it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, runtime_checkable

from opendrs.model.cluster import Cluster, Move
from opendrs.model.snapshot import refused

__all__ = [
    "GATEWAY_STATUS",
    "STOPPING",
    "Abandoned",
    "Backend",
    "BackendError",
    "Clock",
    "Handle",
    "HttpError",
    "Interrupts",
    "LastMoves",
    "NotStarted",
    "PlatformMaintenance",
    "PlatformMotions",
    "PolicyDefaults",
    "Progress",
    "RenewsSecret",
    "Standby",
    "StartGate",
    "SystemClock",
    "after_tries",
    "check_observation",
    "stop_reason",
]

#: HTTP statuses a proxy in front of an API answers when the API behind it gave no usable answer
#: (502 Bad Gateway) or none in time (504 Gateway Timeout): a request that changes the cluster may
#: have reached the API and taken effect all the same, so its outcome is uncertain.
GATEWAY_STATUS: Final = frozenset({502, 504})

#: Why the calls of a backend's API client end when opendrs is stopping.
STOPPING: Final = "opendrs is stopping"

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
    """An error answer of a platform's HTTP API: its status and message.

    ``uncertain`` as for :class:`BackendError`: a proxy's 502 or 504 (:data:`GATEWAY_STATUS`) to
    a request that changes the cluster.
    """

    def __init__(
        self, reason: str, status: int, message: str, *, transient: bool, uncertain: bool = False
    ) -> None:
        super().__init__(reason, transient=transient, uncertain=uncertain)
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
    """A call given up on: opendrs is stopping, the observation it served failed, or the start it
    served may no longer send its request (:class:`StartGate`). Unless ``uncertain``, nothing it
    was to change was sent."""


class NotStarted(Abandoned):
    """A migration given up on before its request was sent: starts are no longer allowed (the
    daemon is leaving active mode, a reload or a stop request came). The platform was not asked."""


class StartGate:
    """Whether a migration may still be started: the one check every backend makes right before
    the request that moves a guest.

    ``why_not()`` says why no migration may start now (the controller is not in active mode, a
    reload or a stop request is pending), or ``None``. :meth:`Backend.start_migration` reads what
    it needs first (a guest's status, its config, the platform's own precheck), then calls
    :meth:`enter` and sends the request that moves the guest, with nothing in between; the calls
    it makes before that end early once :meth:`closed` gives a reason (:class:`Interrupts`), as any
    call does when opendrs is stopping. Once entered, only a stop request ends the request under
    way (its outcome is then uncertain).
    """

    def __init__(self, why_not: Callable[[], str | None] = lambda: None) -> None:
        self._why_not = why_not
        #: Whether :meth:`enter` let the request go.
        self.entered = False

    def closed(self) -> str | None:
        """Why the start must be given up now; ``None`` while it may go on, and once its request
        is on its way."""
        return None if self.entered else self._why_not()

    def enter(self, what: str) -> None:
        """Right before the request that moves the guest (``what`` names it): raises
        :class:`NotStarted` when starts are no longer allowed, else lets the request go."""
        reason = self.closed()
        if reason is not None:
            raise NotStarted(f"{what}: not sent: {reason}")
        self.entered = True


class Interrupts:
    """When the calls of a backend's API client must end early: opendrs is stopping
    (``should_stop()``), or the start under way (:meth:`starting`) may no longer send its
    request. A backend gives it to its client as the client's ``should_stop``; :meth:`reason`
    says which (:func:`stop_reason`)."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop
        self._gate: StartGate | None = None

    def __call__(self) -> bool:
        return self.reason() is not None

    def reason(self) -> str | None:
        """Why the calls must end now: opendrs is stopping, or why the start under way may no
        longer send its request (its gate's :meth:`StartGate.closed`); ``None`` while they may
        go on."""
        if self._should_stop():
            return STOPPING
        gate = self._gate
        return None if gate is None else gate.closed()

    @contextlib.contextmanager
    def starting(self, gate: StartGate) -> Iterator[StartGate]:
        """While a start runs: its calls before its request also end when ``gate`` closes."""
        self._gate = gate
        try:
            yield gate
        finally:
            self._gate = None


def stop_reason(should_stop: Callable[[], bool]) -> str | None:
    """Why an API client's calls must end now, given its ``should_stop``: the reason an
    :class:`Interrupts` gives (a stop, or a closed start gate), else :data:`STOPPING` when
    ``should_stop()`` is true; ``None`` while they may go on."""
    if isinstance(should_stop, Interrupts):
        return should_stop.reason()
    return STOPPING if should_stop() else None


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
    """Where a migration stands: ``running``, ``done``, or ``failed`` with a reason.

    A ``done`` migration that stopped the guest — a restart move, or a "live" move the platform
    made by a stateful stop and start — says how in ``reason`` and for how many seconds the guest
    did not run in ``downtime``; a live migration has neither.
    """

    state: ProgressState
    reason: str | None = None
    downtime: float | None = None

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
        """Seconds (since the epoch for a real cluster, since the start for the simulator): the
        wall clock, which history records and the operator reads; it may be stepped."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock no step of the wall clock moves (from an arbitrary origin): what
        durations (timeouts, waits) are measured on. The simulator's time, never stepped, is
        both."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait — in the simulator, advance the simulation by this much."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class InFlightAges:
    """How long each migration in flight has been known to this process, by its handle's id, on
    a monotonic clock (``monotonic``), so that a step of the wall clock neither gives a migration
    up nor prolongs it: from its start in this process, or, for one started before a restart
    (known only by the wall clock, which may have been stepped since), from when this process
    first asks about it. At most ``limit`` are kept (the oldest are forgotten first)."""

    def __init__(self, monotonic: Callable[[], float], limit: int = 4096) -> None:
        self._monotonic = monotonic
        self._limit = limit
        self._since: dict[str, float] = {}

    def start(self, key: str) -> None:
        """The migration ``key`` starts now."""
        self._since.pop(key, None)
        self.age(key)

    def age(self, key: str) -> float:
        """Seconds since ``key`` started, or since it was first asked about."""
        now = self._monotonic()
        since = self._since.setdefault(key, now)
        while len(self._since) > self._limit:
            del self._since[next(iter(self._since))]
        return now - since

    def forget(self, key: str) -> None:
        """``key`` is over."""
        self._since.pop(key, None)


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

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        """Start migrating ``move.guest`` from ``move.source`` to ``move.target``.

        Right before the request that moves the guest, ``gate.enter()`` is called (see
        :class:`StartGate`); the calls before it end early once the gate closes. Returns as soon
        as the platform accepted the request. Raises :class:`BackendError` when it refuses, and
        :class:`Abandoned` (not ``uncertain``) when the request was not sent (the gate closed,
        opendrs is stopping).
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


@runtime_checkable
class Standby(Protocol):
    """The optional ability of a backend whose daemon acts only where it leads (``leader_only``):
    another node or member may be the one that acts."""

    def standby(self) -> str | None:
        """Why this instance stays idle, as the last observation saw it; ``None`` when it acts."""
        ...


@runtime_checkable
class RenewsSecret(Protocol):
    """The optional ability of a backend that logs in with a secret it reads from a file or the
    environment (Proxmox VE's API token): a reload reads it again, so that a renewed secret is
    taken without a restart."""

    def read_secret(self) -> Callable[[], None]:
        """Read the secret again, not yet used: the function that makes the calls after it log
        in with it (when it changed), called once nothing can refuse the reload any more.
        Raises :class:`BackendError` (one line naming the setting, never the secret) when it
        cannot be read; the one in use stays."""
        ...


@runtime_checkable
class LastMoves(Protocol):
    """The optional ability of a backend whose platform records when each guest last moved, by
    any balancer (Incus's ``volatile.rebalance.last_move``)."""

    def last_moves(self) -> Mapping[str, float]:
        """When each guest last moved (seconds on the backend's clock), as last observed."""
        ...


@runtime_checkable
class PolicyDefaults(Protocol):
    """The optional ability of a backend whose platform's own settings set policy fields
    (Incus's ``cluster.rebalance.*``)."""

    def policy_defaults(self, strategy: str) -> tuple[dict[str, Any], list[str]]:
        """The policy fields the platform sets for ``strategy``, and notes to log."""
        ...


@runtime_checkable
class PlatformMotions(Protocol):
    """The optional ability of a backend whose platform moves guests itself (Proxmox VE's HA
    manager): no migration starts while it does."""

    def platform_motions(self) -> dict[str, str]:
        """The moves the platform has queued or under way now, by guest id (read now)."""
        ...
