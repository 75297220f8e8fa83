"""The controller's durable memory: decisions, migrations, cooldowns — one SQLite file.

The daemon may be stopped or killed at any moment. Everything it must not forget across a restart
lives here: which migrations it started and has not seen finish (a restart polls them again and
records their outcome, and never starts a second migration of a guest that already has one in
flight), which nodes each guest recently left (so it is not moved back), which guests are cooling
down, and which targets a guest must avoid after a failed migration. Reports read the same file.

All times are floats in seconds of the *backend clock* (:class:`opendrs.backends.base.Clock`):
seconds since the epoch on a real cluster, simulated seconds in the simulator. This module never
reads the clock itself.

Schema (version 4)
==================

The version is kept in ``PRAGMA user_version``; ``PRAGMA application_id`` is ``0x6F647273``
(``"odrs"``), so ``file(1)`` and this module can tell an opendrs history from another database.

``state`` — a small key/value table.
    ``key`` (TEXT, primary key), ``value`` (TEXT). Keys in use: ``cluster``, the name of the
    cluster the file belongs to (set by :meth:`History.bind`; one history file is never used for
    two clusters).

``decisions`` — one row per controller cycle that reached a decision.
    ``id`` (INTEGER primary key); ``at`` (REAL, backend clock); ``cluster`` (TEXT, cluster name);
    ``mode`` (``shadow`` | ``active``); ``policy`` (TEXT, the policy/strategy name); ``action``
    (``none``: nothing to do, ``plan``: a rebalancing plan, ``repair``: moves forced by a broken
    rule or a node leaving); ``reason`` (TEXT, one sentence); ``imbalance`` (REAL or NULL, the
    imbalance before); ``predicted`` (REAL or NULL, the imbalance predicted after the plan);
    ``moves`` (INTEGER, the number of entries in ``plan``); ``summary`` (TEXT, a JSON object: a
    summary of the inputs — nodes, guests, loads…); ``plan`` (TEXT, a JSON array: the ordered moves,
    each a JSON object such as ``{"guest": "101", "source": "pve1", "target": "pve2", …}``);
    ``code`` (TEXT or NULL, what the decision is: ``balanced``, ``plan``… — the policy's
    ``DecisionCode``; filled from the summary's ``code`` for rows written before version 4, NULL
    where it has none).

``migrations`` — one row per migration the controller really started.
    ``id`` (INTEGER primary key); ``decision`` (INTEGER or NULL, ``decisions.id`` of the decision
    that asked for it; NULL for a migration started without one, e.g. by hand); ``guest``,
    ``source``, ``target`` (TEXT; ``source`` ≠ ``target``); ``parking`` (0/1: a transient move to a
    parking node, part of a longer chain); ``handle`` (TEXT, the backend's own id for the task, e.g.
    a Proxmox UPID — with guest, source and target it is enough to poll the task again after a
    restart; ``(pending)`` from the moment the intent is recorded until the platform answers the
    request, and for good when the answer was lost — an intent whose request was then not sent,
    because starts were no longer allowed, is removed); ``started`` (REAL); ``ended`` (REAL or
    NULL); ``outcome`` (NULL while in flight, then ``done``, ``failed``, or ``lost``: the guest
    disappeared or ended on another node than either end of the migration);
    ``error`` (TEXT or NULL, one line, for ``failed`` and ``lost``); ``ended_order`` (INTEGER or
    NULL: 1, 2, … in the order the outcomes were recorded, so that migrations ending at one
    instant are told in that order; added in version 2, which numbers older outcomes by ``id``);
    ``downtime`` (REAL or NULL, added in version 3: for ``done``, the seconds the guest did not run
    because the move stopped it — a restart move, or a VM moved by a stateful stop and start;
    NULL for a live migration, and for rows older than version 3).
    ``ended`` and ``outcome`` are NULL together. A partial unique index (``migrations_in_flight``)
    makes it impossible to hold two in-flight rows for one guest.

    *Shadow moves are not migrations.* In shadow mode nothing is migrated; the moves shadow mode
    would have made are only in the decision's ``plan`` (``decisions.mode = 'shadow'``). Keeping
    them out of this table means that every row here happened to the cluster: departures,
    in-flight reconciliation and outcome counts need no filter, and a shadow move can never block
    a real one as a "recent departure". :meth:`History.summary` counts shadow moves from the plans.

``cooldowns`` — guests that must not be moved before a time.
    ``guest`` (TEXT, primary key); ``until`` (REAL: the cooldown is active while ``now < until``);
    ``reason`` (TEXT). Setting a cooldown again replaces it.

``avoid`` — a target node a guest must keep off, e.g. after a failed migration there.
    ``guest``, ``node`` (TEXT, primary key together); ``until`` (REAL, active while
    ``now < until``); ``reason`` (TEXT). Setting it again replaces it.

Example, the last ten migrations with their decision::

    sqlite3 -readonly history.db "SELECT m.guest, m.source, m.target, m.outcome, d.reason
        FROM migrations m LEFT JOIN decisions d ON d.id = m.decision ORDER BY m.id DESC LIMIT 10"

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
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Final, cast

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

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "History",
    "HistoryError",
    "Listener",
]

#: ``PRAGMA application_id`` of an opendrs history: ``"odrs"`` in ASCII.
APPLICATION_ID: Final = 0x6F647273

#: ``_MIGRATIONS[n]`` upgrades a file from schema version ``n`` to ``n + 1`` (version 0 is an
#: empty database). Append a step to change the schema; never edit a released one.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE state (
            key   TEXT PRIMARY KEY NOT NULL,
            value TEXT NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE decisions (
            id        INTEGER PRIMARY KEY,
            at        REAL    NOT NULL,
            cluster   TEXT    NOT NULL,
            mode      TEXT    NOT NULL CHECK (mode IN ('shadow', 'active')),
            policy    TEXT    NOT NULL,
            action    TEXT    NOT NULL CHECK (action IN ('none', 'plan', 'repair')),
            reason    TEXT    NOT NULL,
            imbalance REAL,
            predicted REAL,
            moves     INTEGER NOT NULL CHECK (moves >= 0),
            summary   TEXT    NOT NULL,
            plan      TEXT    NOT NULL
        )""",
        "CREATE INDEX decisions_at ON decisions (at)",
        """CREATE TABLE migrations (
            id       INTEGER PRIMARY KEY,
            decision INTEGER REFERENCES decisions (id),
            guest    TEXT    NOT NULL,
            source   TEXT    NOT NULL,
            target   TEXT    NOT NULL CHECK (target <> source),
            parking  INTEGER NOT NULL DEFAULT 0 CHECK (parking IN (0, 1)),
            handle   TEXT    NOT NULL,
            started  REAL    NOT NULL,
            ended    REAL,
            outcome  TEXT    CHECK (outcome IN ('done', 'failed', 'lost')),
            error    TEXT,
            CHECK ((ended IS NULL) = (outcome IS NULL))
        )""",
        "CREATE UNIQUE INDEX migrations_in_flight ON migrations (guest) WHERE outcome IS NULL",
        "CREATE INDEX migrations_started ON migrations (started)",
        "CREATE INDEX migrations_guest ON migrations (guest, started)",
        "CREATE INDEX migrations_ended ON migrations (ended)",
        "CREATE INDEX migrations_decision ON migrations (decision)",
        """CREATE TABLE cooldowns (
            guest  TEXT PRIMARY KEY NOT NULL,
            until  REAL NOT NULL,
            reason TEXT NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE avoid (
            guest  TEXT NOT NULL,
            node   TEXT NOT NULL,
            until  REAL NOT NULL,
            reason TEXT NOT NULL,
            PRIMARY KEY (guest, node)
        ) WITHOUT ROWID""",
    ),
    (
        # The order in which outcomes were recorded: two migrations that end at one instant are
        # told in that order (by the decision log as it goes, by `opendrs history` afterwards).
        "ALTER TABLE migrations ADD COLUMN ended_order INTEGER",
        "UPDATE migrations SET ended_order = id WHERE outcome IS NOT NULL",
    ),
    (
        # How long a done move stopped its guest (NULL: it ran throughout).
        "ALTER TABLE migrations ADD COLUMN downtime REAL",
    ),
    (
        # What each decision is (the policy's DecisionCode), a column of its own; older rows
        # kept it only in their summary.
        "ALTER TABLE decisions ADD COLUMN code TEXT",
        """UPDATE decisions SET code = CASE WHEN json_valid(summary) THEN
            CASE WHEN json_type(summary, '$.code') = 'text' THEN json_extract(summary, '$.code')
            END END""",
        "CREATE INDEX decisions_code ON decisions (code, at)",
    ),
)

#: The schema version this code writes.
SCHEMA_VERSION: Final = len(_MIGRATIONS)

_MEMORY = ":memory:"


class HistoryError(Exception):
    """A history file cannot be opened, read or written, or a call was invalid; one line.

    ``passing`` is true for a problem that may pass by itself (the file is busy or locked by
    another connection, the disk is full, an I/O error): a restart may cure it. Every other
    problem (a corrupt or foreign file, a schema newer than this code, a history that belongs
    to another cluster) lasts until someone acts. ``foreign`` is true when the file is not an
    opendrs history at all (not an SQLite database, another program's database, an empty file
    opened read-only): the configuration names the wrong file.
    """

    def __init__(self, reason: str, *, passing: bool = False, foreign: bool = False) -> None:
        super().__init__(_one_line(reason))
        self.passing = passing
        self.foreign = foreign


#: SQLite's primary result codes of problems that may pass: BUSY, LOCKED, IOERR, FULL.
_PASSING_CODES: Final = frozenset({5, 6, 10, 13})


#: SQLite's result code of a file that is not a database, and the first bytes of every one.
_NOTADB: Final = 26
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"


def _open_error(name: str, exc: sqlite3.Error) -> HistoryError:
    """The error of a history that cannot be opened: a file that does not even start as an
    SQLite database is said to be no history at all (a damaged one is corrupt)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) == _NOTADB and not _sqlite_header(name):
        return HistoryError(
            f"{name}: not an opendrs history (not an SQLite database)", foreign=True
        )
    return _sqlite_error(f"{name}: cannot open history", exc)


def _sqlite_header(name: str) -> bool:
    """Whether the file starts as every SQLite database does."""
    try:
        with open(name, "rb") as stream:
            return stream.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def _sqlite_error(prefix: str, exc: sqlite3.Error) -> HistoryError:
    code = getattr(exc, "sqlite_errorcode", None)
    passing = isinstance(code, int) and (code & 0xFF) in _PASSING_CODES
    return HistoryError(f"{prefix}: {exc}", passing=passing)


#: Told of every decision recorded, every migration whose platform task became known (its
#: handle set) and every migration outcome recorded — each once, after its transaction committed.
Listener = Callable[[DecisionRecord | MigrationRecord], None]


class History:
    """An opendrs history file (see the module documentation for the schema).

    ``History(":memory:")`` keeps everything in memory (tests, one-shot runs). ``readonly=True``
    opens an existing file for reading only: it is never created, migrated or written. ``timeout``
    is how long a call waits for a lock held by another connection before it fails.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, timeout: float = 5.0
    ) -> None:
        name = os.fsdecode(os.fspath(path))
        self._name = name
        self._readonly = readonly
        self._db: sqlite3.Connection | None = None
        self._listeners: list[Listener] = []
        if not name:
            raise HistoryError("history path is empty")
        if isinstance(timeout, bool) or not (
            isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0
        ):
            raise HistoryError(f"history timeout must be a number of seconds ≥ 0, got {timeout!r}")
        memory = name == _MEMORY
        if memory and readonly:
            raise HistoryError("an in-memory history cannot be opened read-only")
        if not memory:
            self._check_path(name, readonly)
        try:
            if memory:
                db = sqlite3.connect(_MEMORY, timeout=timeout, isolation_level=None)
            elif readonly:
                uri = "file:" + urllib.parse.quote(os.path.abspath(name)) + "?mode=ro"
                db = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
            else:
                db = sqlite3.connect(name, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise _open_error(name, exc) from None
        db.row_factory = sqlite3.Row
        try:
            self._open(db, memory)
        except sqlite3.Error as exc:
            db.close()
            raise _open_error(name, exc) from None
        except BaseException:
            db.close()
            raise
        self._db = db

    # ------------------------------------------------------------------ opening and schema

    @staticmethod
    def _check_path(name: str, readonly: bool) -> None:
        if os.path.isdir(name):
            raise HistoryError(f"{name}: cannot open history: it is a directory")
        if readonly:
            if not os.path.exists(name):
                raise HistoryError(f"{name}: cannot open history: no such file")
            return
        parent = os.path.dirname(os.path.abspath(name))
        if not os.path.isdir(parent):
            raise HistoryError(f"{name}: cannot open history: directory {parent} does not exist")

    def _open(self, db: sqlite3.Connection, memory: bool) -> None:
        version = self._check_schema(db)
        if not self._readonly and not memory:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
        if version == SCHEMA_VERSION:
            return
        if self._readonly:
            raise HistoryError(
                f"{self._name}: history schema version {version} is older than this opendrs "
                f"({SCHEMA_VERSION}); open it once read-write to upgrade it"
            )
        db.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_schema(db)  # another process may have upgraded it meanwhile
            for target, step in enumerate(_MIGRATIONS[version:], start=version + 1):
                try:
                    for statement in step:
                        db.execute(statement)
                except sqlite3.Error as exc:
                    raise HistoryError(
                        f"{self._name}: cannot upgrade the history schema from version "
                        f"{target - 1} to {target}: {exc}"
                    ) from None
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        finally:
            if db.in_transaction:
                db.execute("ROLLBACK")

    def _check_schema(self, db: sqlite3.Connection) -> int:
        """The file's schema version, after checking that it is an opendrs history we can read."""
        application = int(db.execute("PRAGMA application_id").fetchone()[0])
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if application not in (0, APPLICATION_ID):
            raise HistoryError(
                f"{self._name}: not an opendrs history (SQLite application id {application:#x})",
                foreign=True,
            )
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"{self._name}: history schema version {version} is newer than this opendrs "
                f"({SCHEMA_VERSION}); upgrade opendrs"
            )
        if version == 0:
            tables = [
                row[0]
                for row in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
                )
            ]
            if tables:
                shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
                raise HistoryError(
                    f"{self._name}: not an opendrs history (a database with tables {shown})",
                    foreign=True,
                )
            if self._readonly:  # nothing to upgrade: an empty file, never written by opendrs
                raise HistoryError(
                    f"{self._name}: not an opendrs history (an empty database)", foreign=True
                )
        return version

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
            raise _sqlite_error(f"{self._name}: cannot {what}", exc) from None

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
            raise _sqlite_error(f"{self._name}: cannot {what}", exc) from None

    # ------------------------------------------------------------------ cluster binding

    @property
    def cluster(self) -> str | None:
        """The cluster this history belongs to, or ``None`` before :meth:`bind`."""
        with self._read("read the history's cluster") as db:
            return _bound(db)

    def bind(self, cluster: str) -> None:
        """Declare that this history belongs to ``cluster``; refused if it belongs to another."""
        cluster = _name("cluster", cluster)
        with self._write("bind the history to a cluster") as db:
            bound = _bound(db)
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
        with self._read("read the evacuated guests") as db:
            row = db.execute("SELECT value FROM state WHERE key = 'evacuated'").fetchone()
        if row is None:
            return {}
        try:
            value = json.loads(row[0])
        except ValueError:
            value = None
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise HistoryError(f"{self._name}: the evacuated guests are not a JSON object of names")
        return value

    def set_evacuated(self, evacuated: Mapping[str, str]) -> None:
        """Remember which guests were evacuated from which node (replacing what was there)."""
        value = json.dumps({_name("guest", g): _name("node", n) for g, n in evacuated.items()})
        with self._write("record the evacuated guests") as db:
            db.execute(
                "INSERT INTO state (key, value) VALUES ('evacuated', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (value,),
            )

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
        at = _time("at", at)
        cluster = _name("cluster", cluster)
        mode = cast(Mode, _choice("mode", mode, MODES))
        policy = _name("policy", policy)
        action = cast(Action, _choice("action", action, ACTIONS))
        reason = _text("reason", reason)
        imbalance = _optional_number("imbalance", imbalance)
        predicted = _optional_number("predicted", predicted)
        summary_json, plan_json = _decision_json(summary, plan)
        if code is None and isinstance(summary.get("code"), str):
            code = summary["code"]
        code = None if code is None else _name("decision code", code)
        with self._write("record a decision") as db:
            bound = _bound(db)
            if bound is not None and bound != cluster:
                raise HistoryError(
                    f"{self._name}: this history belongs to cluster {bound!r}, "
                    f"not {cluster!r}; decision not recorded"
                )
            cursor = db.execute(
                "INSERT INTO decisions (at, cluster, mode, policy, action, reason, imbalance, "
                "predicted, moves, summary, plan, code) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    at,
                    cluster,
                    mode,
                    policy,
                    action,
                    reason,
                    imbalance,
                    predicted,
                    len(plan),
                    summary_json,
                    plan_json,
                    code,
                ),
            )
            decision_id = int(cursor.lastrowid or 0)
            row = (
                db.execute("SELECT * FROM decisions WHERE id = ?", (decision_id,)).fetchone()
                if self._listeners
                else None
            )
        if row is not None:
            self._tell(_decision(row))
        return decision_id

    def decisions(
        self, since: float | None = None, limit: int | None = None
    ) -> list[DecisionRecord]:
        """Decisions taken at or after ``since``, oldest first; with ``limit``, only the latest."""
        clauses, params = [], []
        if since is not None:
            clauses.append("at >= ?")
            params.append(_time("since", since))
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
        return [_decision(row) for row in reversed(rows)]

    # ------------------------------------------------------------------ migrations

    def migration_started(
        self,
        *,
        decision: int | None,
        move: Move,
        handle: str,
        at: float,
        parking: bool = False,
    ) -> int:
        """Record a migration the backend accepted; returns its id.

        Refused when the guest already has a migration in flight, or ``decision`` is not a
        recorded decision.
        """
        if not isinstance(move, Move):
            raise HistoryError(f"move must be a Move, got {type(move).__name__}")
        guest = _name("move guest", move.guest)
        source = _name("move source", move.source)
        target = _name("move target", move.target)
        if source == target:
            raise HistoryError(f"migration of {guest}: source and target are both {source!r}")
        handle = _name("migration handle", handle)
        at = _time("at", at)
        if not isinstance(parking, bool):
            raise HistoryError(f"parking must be true or false, got {parking!r}")
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
                "started) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (decision, guest, source, target, int(parking), handle, at),
            )
            return int(cursor.lastrowid or 0)

    def migration_handle(self, migration_id: int, handle: str, *, started: float) -> None:
        """Set the backend's handle of a migration recorded before its request was answered."""
        if isinstance(migration_id, bool) or not isinstance(migration_id, int):
            raise HistoryError(f"migration id must be an integer, got {migration_id!r}")
        handle = _name("migration handle", handle)
        started = _time("started", started)
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
            self._tell(_migration(row))

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
        at = _time("at", at)
        outcome = cast(Outcome, _choice("outcome", outcome, OUTCOMES))
        if error is not None:
            if outcome == "done":
                raise HistoryError(f"migration {migration_id}: an error for outcome 'done'")
            error = _text("error", error)
        if downtime is not None:
            if outcome != "done":
                raise HistoryError(f"migration {migration_id}: a downtime for outcome {outcome!r}")
            downtime = _time("downtime", downtime)
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
                return _migration(row)
            db.execute(
                "UPDATE migrations SET ended = ?, outcome = ?, error = ?, downtime = ?, "
                "ended_order = (SELECT COALESCE(MAX(ended_order), 0) + 1 FROM migrations) "
                "WHERE id = ?",
                (at, outcome, error, downtime, migration_id),
            )
            row = db.execute("SELECT * FROM migrations WHERE id = ?", (migration_id,)).fetchone()
        record = _migration(row)
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
        return [_migration(row) for row in rows]

    def migrations(
        self, since: float | None = None, guest: str | None = None
    ) -> list[MigrationRecord]:
        """Migrations started at or after ``since`` (of ``guest``), oldest first."""
        clauses, params = [], []
        if since is not None:
            clauses.append("started >= ?")
            params.append(_time("since", since))
        if guest is not None:
            clauses.append("guest = ?")
            params.append(_name("guest", guest))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read("read migrations") as db:
            rows = db.execute(
                f"SELECT * FROM migrations {where} ORDER BY started, id", params
            ).fetchall()
        return [_migration(row) for row in rows]

    def budget_spent(self, since: float) -> list[float]:
        """When each migration that counts against the migration budget started, at or after
        ``since``, oldest first: those of a decision whose summary says ``budgeted`` (a balancing
        plan, or a repair of nodes that only run hot); for a decision recorded without it, those
        of a balancing plan (``action = 'plan'``)."""
        since = _time("since", since)
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
        since = _time("since", since)
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
        guest = _name("guest", guest)
        until = _time("until", until)
        reason = _text("reason", reason)
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
        now = _time("now", now)
        with self._read("read cooldowns") as db:
            rows = db.execute(
                "SELECT guest, until, reason FROM cooldowns WHERE until > ? ORDER BY guest", (now,)
            ).fetchall()
        return [Cooldown(row["guest"], float(row["until"]), row["reason"]) for row in rows]

    def avoid(self, guest: str, node: str, until: float, reason: str) -> None:
        """Keep ``guest`` off ``node`` until ``until`` (replaces any such entry)."""
        guest = _name("guest", guest)
        node = _name("node", node)
        until = _time("until", until)
        reason = _text("reason", reason)
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
        now = _time("now", now)
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
        ended before ``before``, and decisions taken before ``before`` that no remaining migration
        refers to. Migrations in flight are always kept, and so are their decisions. Call it with
        ``now - retention``.
        """
        before = _time("before", before)
        with self._write("prune the history") as db:
            migrations = db.execute(
                "DELETE FROM migrations WHERE outcome IS NOT NULL AND ended < ?", (before,)
            ).rowcount
            decisions = db.execute(
                "DELETE FROM decisions WHERE at < ? AND NOT EXISTS "
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
        }

    def summary(self, since: float) -> dict[str, Any]:
        """Counts for reports since ``since``.

        ``decisions``: by action; ``modes``: decisions by mode; ``shadow_moves``: moves proposed
        by shadow-mode decisions (they are not migrations); ``migrations``: outcomes of migrations
        that ended since ``since``, and ``in_flight``, the number in flight now; ``started``:
        migrations started since ``since``.
        """
        since = _time("since", since)
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


# ---------------------------------------------------------------------- helpers


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "unknown error"


def _bound(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT value FROM state WHERE key = 'cluster'").fetchone()
    return None if row is None else str(row[0])


def _time(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HistoryError(f"{what} must be a time in seconds, got {value!r}")
    if not math.isfinite(value):
        raise HistoryError(f"{what} must be a finite time in seconds, got {value!r}")
    return float(value)


def _optional_number(what: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HistoryError(f"{what} must be a finite number or None, got {value!r}")
    return float(value)


def _name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HistoryError(f"{what} must be a non-empty string, got {value!r}")
    if value != value.strip() or any(c in value for c in "\r\n\t\0"):
        raise HistoryError(f"{what} must be one word without surrounding blanks, got {value!r}")
    return value


def _text(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise HistoryError(f"{what} must be a non-empty string, got {value!r}")
    return _one_line(value)


def _choice(what: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices or not isinstance(value, str):
        raise HistoryError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _json_default(value: object) -> object:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json(what: str, value: object) -> str:
    try:
        return json.dumps(
            value,
            default=_json_default,
            allow_nan=False,
            ensure_ascii=False,
            separators=(",", ":"),
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise HistoryError(f"{what} cannot be stored as JSON: {exc}") from None


def _decision(row: sqlite3.Row) -> DecisionRecord:
    return DecisionRecord(
        id=int(row["id"]),
        at=float(row["at"]),
        cluster=row["cluster"],
        mode=row["mode"],
        policy=row["policy"],
        action=row["action"],
        reason=row["reason"],
        imbalance=None if row["imbalance"] is None else float(row["imbalance"]),
        predicted=None if row["predicted"] is None else float(row["predicted"]),
        summary=MappingProxyType(json.loads(row["summary"])),
        plan=tuple(MappingProxyType(step) for step in json.loads(row["plan"])),
        code=row["code"],
    )


def _decision_json(summary: object, plan: object) -> tuple[str, str]:
    """A decision's summary (a mapping) and plan (a sequence of mappings) as JSON text."""
    if not isinstance(summary, Mapping):
        raise HistoryError(f"decision summary must be a mapping, got {type(summary).__name__}")
    if isinstance(plan, str | bytes) or not isinstance(plan, Sequence):
        raise HistoryError(f"decision plan must be a sequence, got {type(plan).__name__}")
    for index, step in enumerate(plan):
        if not isinstance(step, Mapping):
            raise HistoryError(
                f"decision plan[{index}] must be a mapping, got {type(step).__name__}"
            )
    return _json("decision summary", summary), _json("decision plan", list(plan))


def _migration(row: sqlite3.Row) -> MigrationRecord:
    return MigrationRecord(
        id=int(row["id"]),
        decision=None if row["decision"] is None else int(row["decision"]),
        move=Move(row["guest"], row["source"], row["target"]),
        handle=row["handle"],
        started=float(row["started"]),
        parking=bool(row["parking"]),
        ended=None if row["ended"] is None else float(row["ended"]),
        outcome=row["outcome"],
        error=row["error"],
        ended_order=None if row["ended_order"] is None else int(row["ended_order"]),
        downtime=None if row["downtime"] is None else float(row["downtime"]),
    )
