""":class:`ProxmoxBackend`: the :class:`~opendrs.backends.base.Backend` protocol for a Proxmox VE
cluster, made of the API client, the observer and the migrator.

Beyond the protocol it tells the controller two things the platform knows:

* :meth:`ProxmoxBackend.standby` — with ``leader_only``, why this daemon must stay idle (its node
  is not the HA manager's current master), or ``None``;
* :meth:`ProxmoxBackend.platform_motions` — the moves the HA manager has queued or under way, by
  guest: the executor starts nothing while one that is not its own is there.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from opendrs.backends.base import Handle, Interrupts, Progress, StartGate
from opendrs.backends.proxmox.client import Client
from opendrs.backends.proxmox.config import ProxmoxConfig
from opendrs.backends.proxmox.migration import Migrator
from opendrs.backends.proxmox.observe import Observer
from opendrs.backends.proxmox.secret import load_secret
from opendrs.model.cluster import Cluster, Move, Settings

log = logging.getLogger(__name__)


class ProxmoxBackend:
    """A Proxmox VE cluster, through its API (see :mod:`opendrs.backends.proxmox`)."""

    name = "proxmox"
    read_only = False

    def __init__(
        self,
        config: ProxmoxConfig,
        settings: Settings,
        *,
        cluster_name: str | None = None,
        environ: Mapping[str, str] | None = None,
        should_stop: Callable[[], bool] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic``: the clock the HA manager's grace to start a move is measured on."""
        self.config = config
        #: Asked while a call waits for its answer: once true, the call is abandoned.
        self.should_stop: Callable[[], bool] = should_stop or (lambda: False)
        self.settings = settings
        if not config.verify_tls:
            log.warning(
                "TLS verification of the Proxmox API is off (verify_tls: false): anyone on the "
                "network path can read the credentials; set ca_file instead"
            )
        self._environ = os.environ if environ is None else environ
        secret = load_secret(config, self._environ)
        # A call ends early when opendrs is stopping, or before a migration request whose start
        # may no longer go on (a reload).
        self._interrupts = Interrupts(lambda: self.should_stop())
        self._client = Client(config, secret, self._interrupts)
        self._observer = Observer(self._client, config, settings, cluster_name)
        self._migrator = Migrator(self._client, settings, self._observer, monotonic)

    def __repr__(self) -> str:
        return f"ProxmoxBackend({', '.join(self.config.hosts)} as {self.config.auth_id})"

    def observe(self) -> Cluster:
        return self._observer.observe()

    def read_secret(self) -> Callable[[], None]:
        secret = load_secret(self.config, self._environ)
        return lambda: self._client.renew(secret)

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        with self._interrupts.starting(gate or StartGate()) as started:
            return self._migrator.start(move, started)

    def poll(self, handle: Handle) -> Progress:
        return self._migrator.poll(handle)

    def find_migration(self, move: Move, since: float) -> Handle | None:
        """The migration task of ``move`` on its source node started at ``since`` or later (a
        request whose answer was lost; for an HA-managed guest, the HA manager's task)."""
        return self._migrator.find(move, since)

    def cancel(self, handle: Handle) -> bool:
        """Stop the migration's task; false when there is none to stop (see
        :meth:`Migrator.cancel <opendrs.backends.proxmox.migration.Migrator.cancel>`)."""
        return self._migrator.cancel(handle)

    def standby(self) -> str | None:
        """With ``leader_only``: why this daemon stays idle, as the last observation saw it.

        The node whose HA manager is the current master acts. When no master is current (the
        HA manager is idle: no HA resource is configured, or its master stopped writing its
        status), the first online node by name acts, so that exactly one daemon does.
        """
        if not self.config.leader_only:
            return None
        me = self.config.node or socket.gethostname().partition(".")[0]
        observer = self._observer
        if me not in observer.nodes:
            return (
                f"node {me} (this host) is not a node of the cluster ({', '.join(observer.nodes)})"
                ": set backend.node to the node this daemon runs on"
            )
        master = observer.master
        if master.current:
            if master.node == me:
                return None
            return f"node {me} is not the HA manager's master ({master.node}): idle"
        first = min(observer.online, default=None)
        if first == me:
            return None
        return (
            f"node {me} is not the first online node ({first or 'none is online'}), which acts "
            "while the HA manager has no current master: idle"
        )

    def platform_motions(self) -> dict[str, str]:
        """The moves the HA manager has queued or under way now, by guest id (read now)."""
        return {m.guest: str(m) for m in self._migrator.ha_motions()}

    def set_maintenance(self, node: str, enabled: bool) -> None:
        self._migrator.set_maintenance(node, enabled)

    def close(self) -> None:
        self._client.close()
