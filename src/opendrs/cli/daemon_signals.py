"""The signals ``opendrs run`` takes — stop, reload, a cycle now — caught from the moment the
command begins, before the daemon's large modules are imported and its files opened: a reload
(``systemctl reload``) or an approval's wake-up that comes while it starts is taken then, not
the signal's default, which would end the process."""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opendrs.controller.config import Config

__all__ = ["DaemonSignals"]

log = logging.getLogger("opendrs")


class DaemonSignals:
    """SIGTERM/SIGINT ask to stop after the current step; SIGHUP asks to reload; SIGUSR1 asks
    for a cycle now."""

    def __init__(self, config_path: str) -> None:
        self.config_path = config_path
        self.stop = False
        self.reload = False
        #: SIGUSR1: a cycle now (an approval or a request to balance now is waiting).
        self.wake = False
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig, handler in (
            (signal.SIGTERM, self._on_stop),
            (signal.SIGINT, self._on_stop),
            (signal.SIGHUP, self._on_hup),
            (signal.SIGUSR1, self._on_usr1),
        ):
            self._previous[sig] = signal.signal(sig, handler)

    def restore(self, *, ignore_wakes: bool = False) -> None:
        """Give the signals back their handlers of before; with ``ignore_wakes``, SIGHUP and
        SIGUSR1 are ignored instead (their default ends the process): some thread of the
        daemon's may still send one (a request cut while it computes, an approval)."""
        for sig, handler in self._previous.items():
            if ignore_wakes and sig in (signal.SIGHUP, signal.SIGUSR1):
                handler = signal.SIG_IGN
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.reload = True

    def _on_usr1(self, signum: int, frame: FrameType | None) -> None:
        self.wake = True

    def take_wake(self) -> bool:
        """Whether SIGUSR1 (``opendrs approve``, ``balance-now``) asked for a cycle now."""
        woken, self.wake = self.wake, False
        return woken

    def holding(self) -> str | None:
        """Why no migration may start now: a stop or a reload was asked for and not yet done."""
        if self.stop:
            from opendrs.backends.base import STOPPING

            return STOPPING
        if self.reload:
            return "the configuration is being reloaded"
        return None

    def take_reload(self) -> Config | None:
        if not self.reload:
            return None
        self.reload = False
        from opendrs.controller.config import load_config
        from opendrs.model.document import DocumentError

        try:
            config = load_config(self.config_path)
        except DocumentError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            return None
        return config
