""":class:`IncusBackend`: the :class:`~opendrs.backends.base.Backend` protocol for an Incus (or
LXD) cluster, made of the API client, the observer and the migrator.

Beyond the protocol, it has the optional hook
:class:`~opendrs.backends.base.PlatformMaintenance` (:meth:`IncusBackend.evacuate`,
:meth:`IncusBackend.restore`: Incus's own evacuate and restore, for ``opendrs maintenance``), and
it tells the controller three things the platform knows:

* :meth:`IncusBackend.standby` — with ``leader_only``, why this member must stay idle (it is not
  the cluster's database leader), or ``None``;
* :meth:`IncusBackend.last_moves` — when each instance last moved, by either balancer
  (``volatile.rebalance.last_move``), for the cooldown;
* :meth:`IncusBackend.policy_defaults` — the policy fields Incus's ``cluster.rebalance.*`` keys
  set (:mod:`opendrs.backends.incus.rebalance`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from opendrs.backends.base import BackendError, Handle, Interrupts, Progress, StartGate
from opendrs.backends.incus.client import Client
from opendrs.backends.incus.config import IncusConfig
from opendrs.backends.incus.migration import Migrator
from opendrs.backends.incus.observe import Observer
from opendrs.backends.incus.rebalance import policy_defaults
from opendrs.backends.incus.values import object_of
from opendrs.model.cluster import Cluster, Move, Settings

log = logging.getLogger(__name__)


class IncusBackend:
    """An Incus or LXD cluster, through its API (see :mod:`opendrs.backends.incus`)."""

    name = "incus"
    read_only = False

    def __init__(
        self,
        config: IncusConfig,
        settings: Settings,
        *,
        cluster_name: str | None = None,
        should_stop: Callable[[], bool] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic``: the clock a move's ``migration_timeout`` is measured on."""
        self.config = config
        self.settings = settings
        self.should_stop: Callable[[], bool] = should_stop or (lambda: False)
        if config.addresses and not config.verify:
            log.warning(
                "TLS verification of the Incus API is off (verify: false): anyone on the network "
                "path can pose as the server; set server_cert instead"
            )
        # A call ends early when opendrs is stopping, or before a move whose start may no longer
        # go on (a reload).
        self._interrupts = Interrupts(lambda: self.should_stop())
        self._client = Client(config, self._interrupts)
        self._observer = Observer(self._client, config, settings, cluster_name)
        self._migrator = Migrator(self._client, config, settings, self._observer, monotonic)

    def __repr__(self) -> str:
        return f"IncusBackend({self.config.where}, project {self._scope})"

    @property
    def _scope(self) -> str:
        return "*" if self.config.all_projects else self.config.project

    def observe(self) -> Cluster:
        return self._observer.observe()

    def start_migration(self, move: Move, gate: StartGate | None = None) -> Handle:
        with self._interrupts.starting(gate or StartGate()) as started:
            return self._guarded(
                f"cannot move {move.guest}", lambda: self._migrator.start(move, started)
            )

    def poll(self, handle: Handle) -> Progress:
        return self._guarded(f"cannot follow {handle.id}", lambda: self._migrator.poll(handle))

    def find_migration(self, move: Move, since: float) -> Handle | None:
        return self._guarded(
            f"cannot look for the move of {move.guest}", lambda: self._migrator.find(move, since)
        )

    def cancel(self, handle: Handle) -> bool:
        return self._guarded(f"cannot stop {handle.id}", lambda: self._migrator.cancel(handle))

    def set_maintenance(self, node: str, enabled: bool) -> None:
        self._guarded(
            f"cannot {'evacuate' if enabled else 'restore'} {node}",
            lambda: self._migrator.set_maintenance(node, enabled),
        )

    def evacuate(self, node: str) -> None:
        """Incus's evacuation of member ``node`` (the ``PlatformMaintenance`` hook)."""
        self.set_maintenance(node, True)

    def restore(self, node: str) -> None:
        """Incus's restore of member ``node``: its instances come back."""
        self.set_maintenance(node, False)

    def standby(self) -> str | None:
        """With ``leader_only``: why this member stays idle, as the last observation saw it."""
        if not self.config.leader_only:
            return None
        local, leader = self._observer.local, self._observer.leader
        if local and local == leader:
            return None
        if not local:
            return "leader_only: the server did not say which member it is"
        return f"member {local} is not the database leader ({leader or 'none is known'}): idle"

    def last_moves(self) -> Mapping[str, float]:
        """When each instance last moved (Unix seconds), as the last observation read it."""
        return dict(self._observer.last_moves)

    def policy_defaults(self, strategy: str) -> tuple[dict[str, Any], list[str]]:
        """The policy fields ``cluster.rebalance.*`` set, and notes (see
        :mod:`~opendrs.backends.incus.rebalance`); none with ``rebalance_keys: false``."""
        if not self.config.rebalance_keys:
            return {}, []

        def read() -> dict[str, str]:
            if not self._observer.server_config:
                server = object_of(self._client.get("/1.0"), "/1.0")
                config = server.get("config") or {}
                return {str(k): str(v) for k, v in config.items()}
            return self._observer.server_config

        return policy_defaults(self._guarded("cannot read the server's config", read), strategy)

    def close(self) -> None:
        self._client.close()

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        """Nothing but :class:`BackendError` escapes a backend method."""
        try:
            return call()
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"{what}: {type(exc).__name__}: {exc}") from None
