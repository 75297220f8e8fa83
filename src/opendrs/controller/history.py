"""The controller's durable memory: decisions, migrations, cooldowns — one SQLite file.

The daemon may be stopped or killed at any moment. Everything it must not forget across a restart
lives here: which migrations it started and has not seen finish (a restart polls them again and
records their outcome, and never starts a second migration of a guest that already has one in
flight), which nodes each guest recently left (so it is not moved back), which guests are cooling
down, and which targets a guest must avoid after a failed migration. Reports read the same file.

All times are floats in seconds of the *backend clock* (:class:`opendrs.backends.base.Clock`):
seconds since the epoch on a real cluster, simulated seconds in the simulator. This module never
reads the clock itself.

The file's schema and the upgrades of older files are in :mod:`opendrs.controller.history_file`.

Durability and concurrency
==========================

The file is in WAL mode with ``synchronous=FULL``: every committed transaction is on disk before
the call returns, even across a power loss of the controller host. ``NORMAL`` would only survive a
crash of the process; the daemon writes a handful of rows per cycle, so the extra fsync per commit
costs nothing that matters, and the one thing it protects — the record of a migration that was
started — is exactly what a restart must not lose. Foreign keys are enforced; every write is one
transaction (``BEGIN IMMEDIATE``), so a killed daemon leaves either all or nothing of it.

There is one writer (the daemon holds its own lock); readers — ``opendrs status`` and
``opendrs history``, a report — open the file with ``History(path, readonly=True)``. The writer
tells its listeners (:meth:`History.listen`: the daemon's decision log) of each decision and
migration event once it is committed. In WAL mode readers and the writer do not
block each other; a busy timeout (5 s by default) covers the short moments when they do
(checkpoints, recovery). Every failure — an unreadable, corrupt or foreign file, a schema newer
than this code, a locked database, a bad argument — is a :class:`HistoryError` whose ``str()`` is
one line; no :mod:`sqlite3` exception escapes.

Schema versions are upgraded in place, in one transaction, when a read-write :class:`History`
opens an older file; a file newer than this code is refused, never touched.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, cast

from opendrs.controller.history_file import (
    HistoryError,
    connect,
    read_error,
    sqlite_error,
)
from opendrs.controller.history_rows import (
    bound_cluster,
    check_choice,
    check_name,
    check_text,
    check_time,
    decision_columns,
    decision_record,
    migration_record,
)
from opendrs.controller.proposals import (
    ProposalRecord,
    proposal_columns,
    proposal_record,
    verdict_object,
)
from opendrs.model.cluster import Move
from opendrs.records import (
    ACTIONS,
    MODES,
    OUTCOMES,
    Action,
    Avoid,
    Cooldown,
    DecisionRecord,
    MigrationRecord,
    Mode,
    Outcome,
)

__all__ = ["BUSY_TIMEOUT", "History", "Listener"]

#: Seconds a statement waits, by default, for a lock another connection holds before it fails.
BUSY_TIMEOUT: Final = 5.0


#: Told of every decision recorded, every migration whose platform task became known (its
#: handle set) and every migration outcome recorded — each once, after its transaction committed.
Listener = Callable[[DecisionRecord | MigrationRecord], None]


class History:
    """An opendrs history file (its schema: :mod:`opendrs.controller.history_file`).

    ``History(":memory:")`` keeps everything in memory (tests, one-shot runs). ``readonly=True``
    opens an existing file for reading only: it is never created, migrated or written. ``timeout``
    is how long a call waits for a lock held by another connection before it fails.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, timeout: float = BUSY_TIMEOUT
    ) -> None:
        name = os.fsdecode(os.fspath(path))
        self._name = name
        self._readonly = readonly
        self._listeners: list[Listener] = []
        self._db: sqlite3.Connection | None = connect(name, readonly=readonly, timeout=timeout)

    # ------------------------------------------------------------------ lifecycle

    @property
    def path(self) -> str:
        return self._name

    @property
    def closed(self) -> bool:
        return self._db is None

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else ("read-only" if self._readonly else "open")
        return f"History({self._name!r}, {state})"

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` of each record written from now on (see :data:`Listener`).

        A listener is called after the write committed, in the writer's thread; what it raises
        reaches the writer, so a listener that must not stop the daemon catches its own errors.
        """
        self._listeners.append(listener)

    def _tell(self, record: DecisionRecord | MigrationRecord) -> None:
        for listener in self._listeners:
            listener(record)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise HistoryError(f"{self._name}: history is closed")
        return self._db

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; any :mod:`sqlite3` error becomes a one-line HistoryError."""
        db = self._conn()
        if self._readonly:
            raise HistoryError(f"{self._name}: cannot {what}: history is open read-only")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise sqlite_error(f"{self._name}: cannot {what}", exc) from None

    @contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        """One read transaction (a consistent view across several queries)."""
        db = self._conn()
        try:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                if db.in_transaction:
                    db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise read_error(self._name, db, f"{self._name}: cannot {what}", exc) from None

    # ------------------------------------------------------------------ cluster binding

    @property
    def cluster(self) -> str | None:
        """The cluster this history belongs to, or ``None`` before :meth:`bind`."""
        with self._read("read the history's cluster") as db:
            return bound_cluster(db)

    def bind(self, cluster: str) -> None:
        """Declare that this history belongs to ``cluster``; refused if it belongs to another."""
        cluster = check_name("cluster", cluster)
        with self._write("bind the history to a cluster") as db:
            bound = bound_cluster(db)
            if bound is None:
                db.execute("INSERT INTO state (key, value) VALUES ('cluster', ?)", (cluster,))
            elif bound != cluster:
                raise HistoryError(
                    f"{self._name}: this history belongs to cluster {bound!r}, not {cluster!r}; "
                    "use another history file"
                )

    # ------------------------------------------------------------------ evacuations

    def evacuated(self) -> dict[str, str]:
        """Guest id → the node it was evacuated from for maintenance (see ``PolicyState``)."""
        value = self._state_json("evacuated", "the evacuated guests")
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise HistoryError(f"{self._name}: the evacuated guests are not a JSON object of names")
        return value

    def set_evacuated(self, evacuated: Mapping[str, str]) -> None:
        """Remember which guests were evacuated from which node (replacing what was there)."""
        value = {check_name("guest", g): check_name("node", n) for g, n in evacuated.items()}
        self._set_state_json("evacuated", "the evacuated guests", value)

    # ------------------------------------------------------------------ nodes seen running hot

    def hot_seen(self) -> dict[str, float]:
        """Node name → when it was last seen running hot (see ``PolicyState.hot_seen``)."""
        value = self._state_json("hot_seen", "the nodes seen running hot")
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and _is_time(v) for k, v in value.items()
        ):
            raise HistoryError(
                f"{self._name}: the nodes seen running hot are not a JSON object of times"
            )
        return {k: float(v) for k, v in value.items()}

    def set_hot_seen(self, hot_seen: Mapping[str, float]) -> None:
        """Remember when each node was last seen running hot (replacing what was there)."""
        value = {check_name("node", n): float(t) for n, t in hot_seen.items()}
        self._set_state_json("hot_seen", "the nodes seen running hot", value)

    def _state_json(self, key: str, what: str) -> object:
        """The JSON value kept under ``key``: None when there is none, False when it is not
        JSON."""
        with self._read(f"read {what}") as db:
            row = db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except ValueError:
            return False

    def _set_state_json(self, key: str, what: str, value: object) -> None:
        """Keep ``value`` as JSON under ``key`` (replacing what was there)."""
        with self._write(f"record {what}") as db:
            db.execute(
                "INSERT INTO state (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    # ------------------------------------------------------------------ requests to the daemon

    def request_balance(self, by: str) -> None:
        """Ask the daemon for one decision now (``opendrs balance-now``), asked by ``by``."""
        with self._write("record a request to balance now") as db:
            db.execute(
                "INSERT INTO state (key, value) VALUES ('balance_now', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (check_text("by", by),),
            )

    def take_balance_request(self) -> str | None:
        """Who asked for a decision now since the last call (the request is taken), or None."""
        with self._write("take a request to balance now") as db:
            row = db.execute("SELECT value FROM state WHERE key = 'balance_now'").fetchone()
            if row is not None:
                db.execute("DELETE FROM state WHERE key = 'balance_now'")
        return None if row is None else str(row[0])

    # ------------------------------------------------------------------ decisions

    def record_decision(
        self,
        *,
        at: float,
        cluster: str,
        mode: Mode,
        policy: str,
        action: Action,
        reason: str,
        imbalance: float | None,
        predicted: float | None,
        summary: Mapping[str, Any],
        plan: Sequence[Mapping[str, Any]],
        code: str | None = None,
    ) -> int:
        """Record one decision; returns its id. ``code`` is what the decision is (the policy's
        ``DecisionCode``); without it, the summary's ``code`` when it has one."""
        columns = decision_columns(
            at=at,
            cluster=cluster,
            mode=mode,
            policy=policy,
            action=action,
            reason=reason,
            imbalance=imbalance,
            predicted=predicted,
            summary=summary,
            plan=plan,
            code=code,
        )
        cluster = columns["cluster"]
        with self._write("record a decision") as db:
            bound = bound_cluster(db)
            if bound is not None and bound != cluster:
                raise HistoryError(
                    f"{self._name}: this history belongs to cluster {bound!r}, "
                    f"not {cluster!r}; decision not recorded"
                )
            cursor = db.execute(
                f"INSERT INTO decisions ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})",
                tuple(columns.values()),
            )
            decision_id = int(cursor.lastrowid or 0)
            row = (
                db.execute("SELECT * FROM decisions WHERE id = ?", (decision_id,)).fetchone()
                if self._listeners
                else None
            )
        if row is not None:
            self._tell(decision_record(row))
        return decision_id

    def decisions(
        self, since: float | None = None, limit: int | None = None
    ) -> list[DecisionRecord]:
        """Decisions taken at or after ``since``, oldest first; with ``limit``, only the latest."""
        clauses, params = [], []
        if since is not None:
            clauses.append("at >= ?")
            params.append(check_time("since", since))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise HistoryError(f"limit must be an integer, got {limit!r}")
        if limit is not None and limit < 0:
            raise HistoryError(f"limit must be ≥ 0, got {limit}")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        query = f"SELECT * FROM decisions {where} ORDER BY at DESC, id DESC"
        if limit is not None:
            query += f" LIMIT {limit}"
        with self._read("read decisions") as db:
            rows = db.execute(query, params).fetchall()
        return [decision_record(row) for row in reversed(rows)]

    # ------------------------------------------------------------------ proposals (manual mode)

    def add_proposal(self, proposal: ProposalRecord, *, supersede: bool = True) -> None:
        """Store a new open ``proposal``; with ``supersede``, every other open proposal of its
        kind expires (a fresher plan replaces it)."""
        with self._write("record a proposal") as db:
            if supersede:
                db.execute(
                    "UPDATE proposals SET state = 'expired', note = ? "
                    "WHERE state = 'open' AND kind = ? AND id <> ?",
                    (f"superseded by proposal {proposal.id}", proposal.kind, proposal.id),
                )
            columns = proposal_columns(proposal)
            db.execute(
                f"INSERT OR IGNORE INTO proposals ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' * len(columns))})",
                tuple(columns.values()),
            )

    def proposals(self, *states: str) -> list[ProposalRecord]:
        """The proposals in any of ``states`` (all without), oldest first."""
        where = f"WHERE state IN ({', '.join('?' * len(states))})" if states else ""
        with self._read("read proposals") as db:
            rows = db.execute(f"SELECT * FROM proposals {where} ORDER BY at, id", states)
            return [proposal_record(row) for row in rows.fetchall()]

    def settle_proposal(
        self,
        proposal_id: str,
        state: str,
        *,
        was: tuple[str, ...] = ("open",),
        by: str | None = None,
        decided: float | None = None,
        chosen: Sequence[int] | None = None,
        note: str | None = None,
    ) -> bool:
        """Move proposal ``proposal_id`` from one of ``was`` to ``state``; whether it did (the
        proposal exists and was in one of ``was``). ``by``, ``decided`` and ``chosen`` are
        kept when given (an operator's verdict); ``note`` says why."""
        chosen_json = None if chosen is None else json.dumps(list(chosen))
        with self._write("update a proposal") as db:
            cursor = db.execute(
                f"UPDATE proposals SET state = ?, by = coalesce(?, by), "
                f"decided = coalesce(?, decided), chosen = coalesce(?, chosen), "
                f"note = coalesce(?, note) "
                f"WHERE id = ? AND state IN ({', '.join('?' * len(was))})",
                (state, by, decided, chosen_json, note, proposal_id, *was),
            )
            return cursor.rowcount == 1

    def give_verdict(
        self, proposal: ProposalRecord, state: str, *, by: str, chosen: Sequence[int] | None
    ) -> dict[str, Any] | None:
        """An operator's verdict (``approved``, ``chosen`` moves or all, or ``rejected``) on the
        open ``proposal``, given now by ``by``: its JSON object (``verdict_object``), or ``None``
        when the proposal is no longer open."""
        decided = time.time()
        if not self.settle_proposal(proposal.id, state, by=by, decided=decided, chosen=chosen):
            return None
        given = replace(
            proposal,
            state=state,
            by=by,
            decided=decided,
            chosen=None if chosen is None else tuple(chosen),
        )
        return verdict_object(given)

    def guest_names(self) -> dict[str, str]:
        """Each guest's name as the history last recorded it, by a decision that planned a move
        of it or a migration of it (the guests the history knows by name, those deleted or
        renamed since included)."""
        query = (
            "SELECT guest, name FROM ("
            "SELECT decisions.at AS at, 0 AS kind, decisions.id AS id, "
            "json_extract(move.value, '$.guest') AS guest, "
            "json_extract(move.value, '$.name') AS name "
            "FROM decisions, json_each(decisions.plan) AS move "
            "WHERE decisions.moves > 0 AND json_type(move.value, '$.name') = 'text' "
            "UNION ALL SELECT started, 1, id, guest, name FROM migrations "
            "WHERE name IS NOT NULL) ORDER BY at, kind, id"
        )
        with self._read("read guest names") as db:
            rows = db.execute(query).fetchall()
        return {str(guest): str(name) for guest, name in rows if name}

    # ------------------------------------------------------------------ migrations

    def migration_started(
        self,
        *,
        decision: int | None,
        move: Move,
        handle: str,
        at: float,
        parking: bool = False,
        name: str | None = None,
    ) -> int:
        """Record a migration the backend accepted; returns its id. ``name`` is the guest's
        name now (the history names the guest by it once the guest is gone).

        Refused when the guest already has a migration in flight, or ``decision`` is not a
        recorded decision.
        """
        if not isinstance(move, Move):
            raise HistoryError(f"move must be a Move, got {type(move).__name__}")
        guest = check_name("move guest", move.guest)
        source = check_name("move source", move.source)
        target = check_name("move target", move.target)
        if source == target:
            raise HistoryError(f"migration of {guest}: source and target are both {source!r}")
        handle = check_name("migration handle", handle)
        at = check_time("at", at)
        if not isinstance(parking, bool):
            raise HistoryError(f"parking must be true or false, got {parking!r}")
        if name is not None and not isinstance(name, str):
            raise HistoryError(f"guest name must be a string or None, got {name!r}")
        if decision is not None and (isinstance(decision, bool) or not isinstance(decision, int)):
            raise HistoryError(f"decision must be a decision id or None, got {decision!r}")
        with self._write("record a migration") as db:
            current = db.execute(
                "SELECT id, source, target, handle FROM migrations "
                "WHERE guest = ? AND outcome IS NULL",
                (guest,),
            ).fetchone()
            if current is not None:
                raise HistoryError(
                    f"guest {guest} already has migration {current['id']} in flight "
                    f"({current['source']} → {current['target']}, task {current['handle']}); "
                    "not starting another"
                )
            if (
                decision is not None
                and db.execute("SELECT 1 FROM decisions WHERE id = ?", (decision,)).fetchone()
                is None
            ):
                raise HistoryError(f"migration of {guest}: unknown decision {decision}")
            cursor = db.execute(
                "INSERT INTO migrations (decision, guest, source, target, parking, handle, "
                "started, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (decision, guest, source, target, int(parking), handle, at, name or None),
            )
            return int(cursor.lastrowid or 0)

    def migration_handle(self, migration_id: int, handle: str, *, started: float) -> None:
        """Set the backend's handle of a migration recorded before its request was answered."""
        if isinstance(migration_id, bool) or not isinstance(migration_id, int):
            raise HistoryError(f"migration id must be an integer, got {migration_id!r}")
        handle = check_name("migration handle", handle)
        started = check_time("started", started)
        with self._write("record a migration's handle") as db:
            changed = db.execute(
                "UPDATE migrations SET handle = ?, started = ? WHERE id = ? AND outcome IS NULL",
                (handle, started, migration_id),
            ).rowcount
            if not changed:
                raise HistoryError(f"no migration {migration_id} in flight")
            row = (
                db.execute("SELECT * FROM migrations WHERE id = ?", (migration_id,)).fetchone()
                if self._listeners
                else None
            )
        if row is not None:
            self._tell(migration_record(row))

    def migration_finished(
        self,
        migration_id: int,
        *,
        at: float,
        outcome: Outcome,
        error: str | None = None,
        downtime: float | None = None,
    ) -> MigrationRecord:
        """Record how a migration ended; returns the record as stored.

        Idempotent: recording the outcome it already has changes nothing (the first ``at`` and
        ``error`` are kept). A different outcome, or an unknown id, is a :class:`HistoryError`.
        ``error`` (one line) is only for ``failed`` and ``lost``; ``downtime`` (seconds, at
        least 0) only for ``done``.
        """
        if isinstance(migration_id, bool) or not isinstance(migration_id, int):
            raise HistoryError(f"migration id must be an integer, got {migration_id!r}")
        at = check_time("at", at)
        outcome = cast(Outcome, check_choice("outcome", outcome, OUTCOMES))
        if error is not None:
            if outcome == "done":
                raise HistoryError(f"migration {migration_id}: an error for outcome 'done'")
            error = check_text("error", error)
        if downtime is not None:
            if outcome != "done":
                raise HistoryError(f"migration {migration_id}: a downtime for outcome {outcome!r}")
            downtime = check_time("downtime", downtime)
            if downtime < 0:
                raise HistoryError(f"downtime must be at least 0 seconds, got {downtime!r}")
        with self._write("record a migration outcome") as db:
            row = db.execute("SELECT * FROM migrations WHERE id = ?", (migration_id,)).fetchone()
            if row is None:
                raise HistoryError(f"unknown migration {migration_id}")
            if row["outcome"] is not None:
                if row["outcome"] != outcome:
                    raise HistoryError(
                        f"migration {migration_id} of {row['guest']} already ended as "
                        f"{row['outcome']!r}; cannot record {outcome!r}"
                    )
                return migration_record(row)
            db.execute(
                "UPDATE migrations SET ended = ?, outcome = ?, error = ?, downtime = ?, "
                "ended_order = (SELECT COALESCE(MAX(ended_order), 0) + 1 FROM migrations) "
                "WHERE id = ?",
                (at, outcome, error, downtime, migration_id),
            )
            row = db.execute("SELECT * FROM migrations WHERE id = ?", (migration_id,)).fetchone()
        record = migration_record(row)
        self._tell(record)
        return record

    def migration_withdrawn(self, migration_id: int) -> None:
        """Remove the intent of a migration whose request was never sent (recorded before it, then
        given up on because starts were no longer allowed): it never happened, so it leaves no
        row. Only a migration still in flight can be withdrawn; listeners hear nothing of it
        (they are told of a migration once its handle or outcome is recorded)."""
        if isinstance(migration_id, bool) or not isinstance(migration_id, int):
            raise HistoryError(f"migration id must be an integer, got {migration_id!r}")
        with self._write("withdraw a migration") as db:
            removed = db.execute(
                "DELETE FROM migrations WHERE id = ? AND outcome IS NULL", (migration_id,)
            ).rowcount
            if not removed:
                raise HistoryError(f"no migration {migration_id} in flight")

    def in_flight(self) -> list[MigrationRecord]:
        """Migrations started and not yet finished, oldest first."""
        with self._read("read migrations in flight") as db:
            rows = db.execute(
                "SELECT * FROM migrations WHERE outcome IS NULL ORDER BY started, id"
            ).fetchall()
        return [migration_record(row) for row in rows]

    def migrations(
        self, since: float | None = None, guest: str | None = None
    ) -> list[MigrationRecord]:
        """Migrations started at or after ``since`` (of ``guest``), oldest first."""
        clauses, params = [], []
        if since is not None:
            clauses.append("started >= ?")
            params.append(check_time("since", since))
        if guest is not None:
            clauses.append("guest = ?")
            params.append(check_name("guest", guest))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read("read migrations") as db:
            rows = db.execute(
                f"SELECT * FROM migrations {where} ORDER BY started, id", params
            ).fetchall()
        return [migration_record(row) for row in rows]

    def budget_spent(self, since: float) -> list[float]:
        """When each migration that counts against the migration budget started, at or after
        ``since``, oldest first: those of a decision whose summary says ``budgeted`` (a balancing
        plan, or a repair of nodes that only run hot); for a decision recorded without it, those
        of a balancing plan (``action = 'plan'``)."""
        since = check_time("since", since)
        with self._read("read the migration budget spent") as db:
            rows = db.execute(
                "SELECT m.started FROM migrations m JOIN decisions d ON d.id = m.decision "
                "WHERE m.started >= ? AND "
                "coalesce(json_extract(d.summary, '$.budgeted'), d.action = 'plan') "
                "ORDER BY m.started, m.id",
                (since,),
            ).fetchall()
        return [float(row["started"]) for row in rows]

    def departures(self, since: float) -> dict[str, list[tuple[str, float]]]:
        """Per guest, the nodes it left by a ``done`` migration that ended at or after ``since``.

        Each entry is ``(source node, ended)``, oldest first. Failed and lost migrations are not
        departures: the guest may never have left.
        """
        since = check_time("since", since)
        result: dict[str, list[tuple[str, float]]] = {}
        with self._read("read departures") as db:
            for row in db.execute(
                "SELECT guest, source, ended FROM migrations "
                "WHERE outcome = 'done' AND ended >= ? ORDER BY ended, id",
                (since,),
            ):
                result.setdefault(row["guest"], []).append((row["source"], float(row["ended"])))
        return result

    # ------------------------------------------------------------------ cooldowns and avoid

    def set_cooldown(self, guest: str, until: float, reason: str) -> None:
        """Keep ``guest`` still until ``until`` (replaces any cooldown it had)."""
        guest = check_name("guest", guest)
        until = check_time("until", until)
        reason = check_text("reason", reason)
        with self._write("set a cooldown") as db:
            db.execute(
                "INSERT INTO cooldowns (guest, until, reason) VALUES (?, ?, ?) "
                "ON CONFLICT (guest) DO UPDATE SET until = excluded.until, "
                "reason = excluded.reason",
                (guest, until, reason),
            )

    def cooldowns(self, now: float) -> dict[str, float]:
        """Guests still cooling down at ``now`` (``now < until``) → until."""
        return {c.guest: c.until for c in self.cooldown_entries(now)}

    def cooldown_entries(self, now: float) -> list[Cooldown]:
        """The cooldowns still active at ``now`` (``now < until``), with their reasons, by guest."""
        now = check_time("now", now)
        with self._read("read cooldowns") as db:
            rows = db.execute(
                "SELECT guest, until, reason FROM cooldowns WHERE until > ? ORDER BY guest", (now,)
            ).fetchall()
        return [Cooldown(row["guest"], float(row["until"]), row["reason"]) for row in rows]

    def avoid(self, guest: str, node: str, until: float, reason: str) -> None:
        """Keep ``guest`` off ``node`` until ``until`` (replaces any such entry)."""
        guest = check_name("guest", guest)
        node = check_name("node", node)
        until = check_time("until", until)
        reason = check_text("reason", reason)
        with self._write("record a node to avoid") as db:
            db.execute(
                "INSERT INTO avoid (guest, node, until, reason) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (guest, node) DO UPDATE SET until = excluded.until, "
                "reason = excluded.reason",
                (guest, node, until, reason),
            )

    def avoided(self, now: float) -> dict[tuple[str, str], float]:
        """``(guest, node)`` pairs still to avoid at ``now`` (``now < until``) → until."""
        return {(a.guest, a.node): a.until for a in self.avoid_entries(now)}

    def avoid_entries(self, now: float) -> list[Avoid]:
        """The nodes guests keep off at ``now`` (``now < until``), with reasons, by guest, node."""
        now = check_time("now", now)
        with self._read("read avoided nodes") as db:
            rows = db.execute(
                "SELECT guest, node, until, reason FROM avoid WHERE until > ? ORDER BY guest, node",
                (now,),
            ).fetchall()
        return [
            Avoid(row["guest"], row["node"], float(row["until"]), row["reason"]) for row in rows
        ]

    def latest(self) -> float | None:
        """The time of the latest thing recorded (a decision, a migration's start or end), or
        ``None`` for an empty history."""
        with self._read("read the latest time") as db:
            row = db.execute(
                "SELECT max(t) FROM (SELECT max(at) AS t FROM decisions "
                "UNION ALL SELECT max(started) FROM migrations "
                "UNION ALL SELECT max(ended) FROM migrations)"
            ).fetchone()
        return None if row[0] is None else float(row[0])

    # ------------------------------------------------------------------ housekeeping, reports

    def prune(self, before: float) -> dict[str, int]:
        """Forget what is older than ``before``; returns the rows deleted per table.

        Deletes cooldowns and avoid entries that expired (``until <= before``), migrations that
        ended before ``before``, proposals made before ``before`` no longer open, and decisions
        taken before ``before`` that no remaining migration or proposal refers to. Migrations in
        flight are always kept, and so are their decisions. Call it with
        ``now - retention``.
        """
        before = check_time("before", before)
        with self._write("prune the history") as db:
            migrations = db.execute(
                "DELETE FROM migrations WHERE outcome IS NOT NULL AND ended < ?", (before,)
            ).rowcount
            proposals = db.execute(
                "DELETE FROM proposals WHERE at < ? AND state <> 'open'", (before,)
            ).rowcount
            decisions = db.execute(
                "DELETE FROM decisions WHERE at < ? AND NOT EXISTS "
                "(SELECT 1 FROM proposals WHERE proposals.decision = decisions.id) AND NOT EXISTS "
                "(SELECT 1 FROM migrations WHERE migrations.decision = decisions.id)",
                (before,),
            ).rowcount
            cooldowns = db.execute("DELETE FROM cooldowns WHERE until <= ?", (before,)).rowcount
            avoid = db.execute("DELETE FROM avoid WHERE until <= ?", (before,)).rowcount
        return {
            "decisions": decisions,
            "migrations": migrations,
            "cooldowns": cooldowns,
            "avoid": avoid,
            "proposals": proposals,
        }

    def summary(self, since: float) -> dict[str, Any]:
        """Counts for reports since ``since``.

        ``decisions``: by action; ``modes``: decisions by mode; ``shadow_moves``: moves proposed
        by shadow-mode decisions (they are not migrations); ``migrations``: outcomes of migrations
        that ended since ``since``, and ``in_flight``, the number in flight now; ``started``:
        migrations started since ``since``.
        """
        since = check_time("since", since)
        decisions = dict.fromkeys(ACTIONS, 0)
        modes = dict.fromkeys(MODES, 0)
        migrations = dict.fromkeys(OUTCOMES, 0)
        with self._read("summarise the history") as db:
            shadow_moves = 0
            for row in db.execute(
                "SELECT mode, action, count(*) AS n, sum(moves) AS moves FROM decisions "
                "WHERE at >= ? GROUP BY mode, action",
                (since,),
            ):
                decisions[row["action"]] += row["n"]
                modes[row["mode"]] += row["n"]
                if row["mode"] == "shadow":
                    shadow_moves += row["moves"] or 0
            for row in db.execute(
                "SELECT outcome, count(*) AS n FROM migrations "
                "WHERE outcome IS NOT NULL AND ended >= ? GROUP BY outcome",
                (since,),
            ):
                migrations[row["outcome"]] = row["n"]
            in_flight = db.execute(
                "SELECT count(*) FROM migrations WHERE outcome IS NULL"
            ).fetchone()[0]
            started = db.execute(
                "SELECT count(*) FROM migrations WHERE started >= ?", (since,)
            ).fetchone()[0]
        return {
            "since": since,
            "decisions": decisions,
            "modes": modes,
            "shadow_moves": shadow_moves,
            "migrations": {**migrations, "in_flight": in_flight},
            "started": started,
        }


def _is_time(value: object) -> bool:
    """Whether ``value`` read from JSON is a finite number of seconds."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
