"""What the dashboard may change, when ``http.write`` allows it: approve or reject a proposal of
manual mode, ask for a decision now.

``POST /api/proposals/ID/approve`` (a JSON body ``{"moves": [1, "web1"]}`` approves only those
moves), ``POST /api/proposals/ID/reject``, ``POST /api/balance-now``, and ``GET /api/proposals``
(the open ones). The HTTP server (:mod:`opendrs.controller.http_server`) lets a request reach
:class:`DashboardWriter` only with the bearer token and from no other origin; each verdict is
kept in the history with the token's name (``http.token_name``, as ``NAME@http``) and the time,
as ``opendrs approve`` keeps the local user's, and appended to the decision log. The writer
opens the history for each request (the HTTP server's threads never share the daemon's
connection) and then sends the daemon SIGUSR1, so that it takes the request at once.

Once the daemon stops (:meth:`DashboardWriter.stop`), a write is refused (503) and no SIGUSR1 is
sent; the stop waits for the write under way, so that the process never ends between a verdict
committed to the history and its line in the decision log, nor sends itself a signal once its
handlers are given back — for a time only: a write still under way then (a decision log on a
hung disk) is left, and the process ends without it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Final

from opendrs.controller.decision_log import append_to_log
from opendrs.controller.history import History
from opendrs.controller.history_file import HistoryError
from opendrs.controller.proposals import choose_moves, open_proposal

__all__ = ["MAX_BODY", "DashboardWriter", "is_write_path"]

#: The largest request body taken (a list of moves).
MAX_BODY: Final = 4096

_VERDICT = re.compile(r"/api/proposals/([0-9A-Fa-f]{1,16})/(approve|reject)")

Answer = tuple[HTTPStatus, dict[str, Any]]


def is_write_path(path: str) -> bool:
    """Whether ``path`` is one of the writer's (``GET /api/proposals`` or a POST); a proposal's
    id is 1 to 16 hexadecimal digits."""
    return path in ("/api/proposals", "/api/balance-now") or _VERDICT.fullmatch(path) is not None


def _wake_this_daemon() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)


class DashboardWriter:
    """The writes of the dashboard, on the history at ``history_path``, made as ``by``."""

    def __init__(
        self,
        history_path: str,
        by: str,
        wake: Callable[[], None] = _wake_this_daemon,
        decision_log: str | None = None,
    ) -> None:
        self.history_path = history_path
        self.by = by
        self.wake = wake
        #: The decision log a verdict is appended to (``log.decisions``), or ``None``.
        self.decision_log = decision_log
        #: Guards the two below: whether the daemon stops, the writes under way.
        self._gate = threading.Condition()
        self._stopping = False
        self._writing = 0

    def handles(self, path: str) -> bool:
        """Whether ``path`` is one of the writer's POST paths."""
        return path == "/api/balance-now" or _VERDICT.fullmatch(path) is not None

    def open_proposals(self) -> Answer:
        """``GET /api/proposals``: the open proposals, as ``opendrs proposals --format json``."""
        try:
            with History(self.history_path, readonly=True) as history:
                proposals = history.proposals("open")
        except HistoryError as exc:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
        return HTTPStatus.OK, {"proposals": [p.as_dict() for p in proposals]}

    def stop(self, timeout: float) -> tuple[int, int]:
        """Refuse every write from now on and wait up to ``timeout`` seconds for those under way
        to end (each statement waits at most the history's busy timeout), so that none is left
        half-done unless a write outlasts it (a decision log on a hung disk): how many were
        under way, and how many of them still are."""
        with self._gate:
            self._stopping = True
            under_way = self._writing
            self._gate.wait_for(lambda: self._writing == 0, timeout)
            return under_way, self._writing

    def post(self, path: str, body: bytes) -> Answer:
        """Carry out the POST of ``path`` with ``body`` (503 once the daemon stops): the status
        and the JSON answer."""
        with self._gate:
            if self._stopping:
                return HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the daemon is stopping"}
            self._writing += 1
        try:
            return self._write(path, body)
        finally:
            with self._gate:
                self._writing -= 1
                self._gate.notify_all()

    def _write(self, path: str, body: bytes) -> Answer:
        """The write of :meth:`post`, then the daemon woken unless it stops (no cycle would
        take the signal). Counted among the writes under way: :meth:`stop` returns once this
        one has ended, the signal sent or not, before the daemon gives its signals back."""
        try:
            with History(self.history_path) as history:
                if path == "/api/balance-now":
                    history.request_balance(self.by)
                    answer: Answer = (HTTPStatus.ACCEPTED, {"asked": "balance-now", "by": self.by})
                else:
                    answer = self._verdict(history, path, body)
        except HistoryError as exc:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
        if answer[0] < 300 and not self._stopping:
            self.wake()
        return answer

    def _verdict(self, history: History, path: str, body: bytes) -> Answer:
        match = _VERDICT.fullmatch(path)
        assert match is not None
        proposal_id, verb = match.groups()
        try:
            items = _moves(body) if verb == "approve" else None
        except ValueError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        try:
            proposal = open_proposal(history.proposals(), proposal_id)
            chosen = None if items is None else choose_moves(proposal, items)
        except LookupError as exc:
            return HTTPStatus.NOT_FOUND, {"error": str(exc.args[0])}
        except ValueError as exc:
            return HTTPStatus.CONFLICT, {"error": str(exc)}
        state = "approved" if verb == "approve" else "rejected"
        verdict = history.give_verdict(proposal, state, by=self.by, chosen=chosen)
        if verdict is None:
            return HTTPStatus.CONFLICT, {"error": f"proposal {proposal.id} is no longer open"}
        append_to_log(self.decision_log, verdict)
        return HTTPStatus.OK, {"id": proposal.id, "state": state, "by": self.by, "chosen": chosen}


def _moves(body: bytes) -> list[str] | None:
    """The ``moves`` of an approval's JSON body (``None``: all); ValueError when it is not a
    JSON object whose ``moves`` is a list."""
    if not body.strip():
        return None
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(data, dict) or set(data) - {"moves"}:
        raise ValueError('the body must be a JSON object {"moves": [...]}')
    moves = data.get("moves")
    if moves is None:
        return None
    if not isinstance(moves, list) or not all(isinstance(m, str | int) for m in moves):
        raise ValueError("moves must be a list of move numbers or guest names")
    return [str(m) for m in moves]
