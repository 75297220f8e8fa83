"""The history file: its schema, the upgrades of older files, opening it, and its one error.

:class:`~opendrs.controller.history.History` reads and writes the file; this module holds what
makes a file an opendrs history.

Schema (version 6)
==================

The version is kept in ``PRAGMA user_version``; ``PRAGMA application_id`` is ``0x6F647273``
(``"odrs"``), so ``file(1)`` and this module can tell an opendrs history from another database.

``state`` — a small key/value table.
    ``key`` (TEXT, primary key), ``value`` (TEXT). Keys in use: ``cluster``, the name of the
    cluster the file belongs to (set by :meth:`History.bind`; one history file is never used for
    two clusters); ``evacuated``, a JSON object of guest id → the node it was evacuated from for
    maintenance; ``hot_seen``, a JSON object of node name → when it was last seen running hot
    (backend clock) — both the policy's state, kept across a restart.

``decisions`` — one row per controller cycle that reached a decision.
    ``id`` (INTEGER primary key); ``at`` (REAL, backend clock); ``cluster`` (TEXT, cluster name);
    ``mode`` (``shadow`` | ``manual`` | ``active``, ``manual`` from version 5); ``policy`` (TEXT,
    the policy/strategy name); ``action`` (``none``: nothing to do, ``plan``: a rebalancing plan,
    ``repair``: moves forced by a broken rule or a node leaving); ``reason`` (TEXT, one sentence);
    ``imbalance`` (REAL or NULL, the imbalance before); ``predicted`` (REAL or NULL, the imbalance
    predicted after the plan); ``moves`` (INTEGER, the number of entries in ``plan``); ``summary``
    (TEXT, a JSON object: a summary of the inputs — nodes, guests, loads…); ``plan`` (TEXT, a JSON
    array: the ordered moves, each a JSON object such as ``{"guest": "101", "source": "pve1",
    "target": "pve2", …}``); ``code`` (TEXT or NULL, what the decision is: ``balanced``, ``plan``… —
    the policy's ``DecisionCode``; filled from the summary's ``code`` for rows written before
    version 4, NULL where it has none).

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
    NULL for a live migration, and for rows older than version 3); ``name`` (TEXT or NULL, added
    in version 6: the guest's name when the migration started, so that a guest since deleted or
    renamed is still shown as ``name (id)``; rows older than version 6 take the name their
    decision's plan recorded; NULL where no name was ever known).
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

``proposals`` — the plans of manual mode waiting for an operator (version 5).
    ``id`` (TEXT, primary key: 8 hex digits of a hash of the time and the moves); ``decision``
    (INTEGER, ``decisions.id`` of the decision that made it); ``at`` (REAL, backend clock); ``kind``
    (``balance`` | ``maintenance`` | ``return`` | ``repair``); ``reason`` (TEXT); ``imbalance``,
    ``predicted`` (REAL or NULL, the metric before and predicted after); ``moves`` (TEXT, a JSON
    array of ``{"guest", "name", "source", "target"}``); ``state`` (``open``, then ``approved`` or
    ``rejected`` by an operator, ``started`` once the daemon handed the approved moves to the
    executor, or ``expired``); ``chosen`` (TEXT or NULL, a JSON array of the approved moves' 1-based
    numbers; NULL: all); ``by`` (TEXT or NULL, who approved or rejected: the token's name, or
    ``USER@cli``); ``decided`` (REAL or NULL, when, wall clock); ``note`` (TEXT or NULL, why it
    expired, or what started).

Example, the last ten migrations with their decision::

    sqlite3 -readonly history.db "SELECT m.guest, m.source, m.target, m.outcome, d.reason
        FROM migrations m LEFT JOIN decisions d ON d.id = m.decision ORDER BY m.id DESC LIMIT 10"
"""

from __future__ import annotations

import math
import os
import sqlite3
import urllib.parse
from typing import Final

__all__ = [
    "APPLICATION_ID",
    "MEMORY",
    "SCHEMA_VERSION",
    "UPGRADES",
    "HistoryError",
    "ImmutableRead",
    "connect",
    "one_line",
    "read_error",
    "sqlite_error",
]

#: ``PRAGMA application_id`` of an opendrs history: ``"odrs"`` in ASCII.
APPLICATION_ID: Final = 0x6F647273

#: ``UPGRADES[n]`` upgrades a file from schema version ``n`` to ``n + 1`` (version 0 is an
#: empty database). Append a step to change the schema; never edit a released one.
UPGRADES: tuple[tuple[str, ...], ...] = (
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
    (
        # Manual mode: a third mode (the table is rebuilt, SQLite cannot change a CHECK), and the
        # proposals that wait for an operator.
        """CREATE TABLE decisions_manual (
            id        INTEGER PRIMARY KEY,
            at        REAL    NOT NULL,
            cluster   TEXT    NOT NULL,
            mode      TEXT    NOT NULL CHECK (mode IN ('shadow', 'manual', 'active')),
            policy    TEXT    NOT NULL,
            action    TEXT    NOT NULL CHECK (action IN ('none', 'plan', 'repair')),
            reason    TEXT    NOT NULL,
            imbalance REAL,
            predicted REAL,
            moves     INTEGER NOT NULL CHECK (moves >= 0),
            summary   TEXT    NOT NULL,
            plan      TEXT    NOT NULL,
            code      TEXT
        )""",
        "INSERT INTO decisions_manual SELECT id, at, cluster, mode, policy, action, reason, "
        "imbalance, predicted, moves, summary, plan, code FROM decisions",
        "DROP TABLE decisions",
        "ALTER TABLE decisions_manual RENAME TO decisions",
        "CREATE INDEX decisions_at ON decisions (at)",
        "CREATE INDEX decisions_code ON decisions (code, at)",
        """CREATE TABLE proposals (
            id        TEXT    PRIMARY KEY NOT NULL,
            decision  INTEGER NOT NULL REFERENCES decisions (id),
            at        REAL    NOT NULL,
            kind      TEXT    NOT NULL,
            reason    TEXT    NOT NULL,
            imbalance REAL,
            predicted REAL,
            moves     TEXT    NOT NULL,
            state     TEXT    NOT NULL DEFAULT 'open'
                      CHECK (state IN ('open', 'approved', 'rejected', 'expired', 'started')),
            chosen    TEXT,
            by        TEXT,
            decided   REAL,
            note      TEXT
        ) WITHOUT ROWID""",
        "CREATE INDEX proposals_state ON proposals (state, at)",
    ),
    (
        # The guest's name when its migration started: the history names a guest that is gone
        # as the operator knew it. Older rows take the name their decision's plan recorded.
        "ALTER TABLE migrations ADD COLUMN name TEXT",
        """UPDATE migrations SET name = (
            SELECT json_extract(move.value, '$.name')
            FROM decisions, json_each(CASE WHEN json_valid(decisions.plan)
                                      THEN decisions.plan ELSE '[]' END) AS move
            WHERE decisions.id = migrations.decision
              AND json_extract(move.value, '$.guest') = migrations.guest
              AND json_type(move.value, '$.name') = 'text'
              AND json_extract(move.value, '$.name') <> ''
            LIMIT 1)""",
    ),
)

#: The schema version this code writes.
SCHEMA_VERSION: Final = len(UPGRADES)

#: The name of a history kept in memory.
MEMORY: Final = ":memory:"


class HistoryError(Exception):
    """A history file cannot be opened, read or written, or a call was invalid; one line.

    ``passing`` is true for a problem that may pass by itself (the file is busy or locked by
    another connection, the disk is full, an I/O error): a restart may cure it. Every other
    problem (a corrupt or foreign file, a schema newer than this code, a history that belongs
    to another cluster) lasts until someone acts. ``foreign`` is true when the file is not an
    opendrs history at all (not an SQLite database, another program's database, an empty file
    opened read-only): the configuration names the wrong file.
    """

    def __init__(
        self,
        reason: str,
        *,
        passing: bool = False,
        foreign: bool = False,
        cannot_open: bool = False,
    ) -> None:
        super().__init__(one_line(reason))
        self.passing = passing
        self.foreign = foreign
        #: SQLite could not open the file (SQLITE_CANTOPEN): a file or directory it may not
        #: read or write, such as the index beside a history in write-ahead-log mode.
        self.cannot_open = cannot_open


#: SQLite's primary result codes of problems that may pass: BUSY, LOCKED, IOERR, FULL.
_PASSING_CODES: Final = frozenset({5, 6, 10, 13})


#: SQLite's result code of a file it cannot open (SQLITE_CANTOPEN).
_CANTOPEN: Final = 14

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
    return sqlite_error(f"{name}: cannot open history", exc)


def _sqlite_header(name: str) -> bool:
    """Whether the file starts as every SQLite database does."""
    try:
        with open(name, "rb") as stream:
            return stream.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def sqlite_error(prefix: str, exc: sqlite3.Error) -> HistoryError:
    """``exc`` as a one-line HistoryError after ``prefix``; ``passing`` when it may pass."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    return HistoryError(
        f"{prefix}: {exc}",
        passing=primary in _PASSING_CODES,
        cannot_open=primary == _CANTOPEN,
    )


def one_line(text: str) -> str:
    """``text`` on one line, its blanks collapsed (never empty)."""
    return " ".join(str(text).split()) or "unknown error"


def connect(name: str, *, readonly: bool, timeout: float) -> sqlite3.Connection:
    """A connection to the history file ``name`` (see :class:`~opendrs.controller.history.History`
    for the arguments), its schema checked and, read-write, upgraded."""
    if not name:
        raise HistoryError("history path is empty")
    if isinstance(timeout, bool) or not (
        isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0
    ):
        raise HistoryError(f"history timeout must be a number of seconds ≥ 0, got {timeout!r}")
    memory = name == MEMORY
    if memory and readonly:
        raise HistoryError("an in-memory history cannot be opened read-only")
    if not memory:
        _check_path(name, readonly)
    if readonly:
        try:
            return _opened(name, readonly, timeout, "mode=ro")
        except HistoryError as exc:
            if not exc.cannot_open or not _immutable_now(name):
                raise
        # Nothing is in a write-ahead log and no reader's index can be made beside the file (a
        # directory the reader may not write): read the file as it stands.
        return _opened(name, readonly, timeout, "mode=ro&immutable=1")
    return _opened(name, readonly, timeout, None)


class ImmutableRead(sqlite3.Connection):
    """A connection reading the history as an immutable file, without a lock (see
    :func:`connect`): a daemon that begins to write it meanwhile may change what it reads."""


def read_error(name: str, db: sqlite3.Connection, prefix: str, exc: sqlite3.Error) -> HistoryError:
    """``exc``, raised by ``db`` reading the history ``name``, as :func:`sqlite_error` says it —
    but from an :class:`ImmutableRead` of a history that has a write-ahead log now (a daemon
    began to write it while it was read, so what was read may be torn): a passing error."""
    return _written_while_read(name, db) or sqlite_error(prefix, exc)


def _written_while_read(name: str, db: sqlite3.Connection) -> HistoryError | None:
    """The passing error of an :class:`ImmutableRead` of ``name`` that now has a write-ahead
    log beside it, else ``None``."""
    if isinstance(db, ImmutableRead) and os.path.lexists(name + "-wal"):
        return HistoryError(
            f"{name}: the history began to be written while read; try again", passing=True
        )
    return None


def _opened(name: str, readonly: bool, timeout: float, query: str | None) -> sqlite3.Connection:
    """The connection of :func:`connect`, opened as a URI with ``query`` when given (an
    :class:`ImmutableRead` for an immutable one)."""
    try:
        if query is None:
            db = sqlite3.connect(name, timeout=timeout, isolation_level=None)
        else:
            uri = "file:" + urllib.parse.quote(os.path.abspath(name)) + "?" + query
            kind = ImmutableRead if "immutable=1" in query else sqlite3.Connection
            db = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None, factory=kind)
    except sqlite3.Error as exc:
        raise _open_error(name, exc) from None
    db.row_factory = sqlite3.Row
    try:
        _prepare(db, name, readonly, name == MEMORY)
    except sqlite3.Error as exc:
        db.close()
        raise _written_while_read(name, db) or _open_error(name, exc) from None
    except BaseException:
        db.close()
        raise
    return db


def _immutable_now(name: str) -> bool:
    """Whether the history may be read as an immutable file: no write-ahead log beside it (a
    daemon that writes it has one, and a clean stop leaves none) and a directory this process
    cannot write (where SQLite cannot make the index a reader of such a log needs)."""
    parent = os.path.dirname(os.path.abspath(name))
    return not os.path.lexists(name + "-wal") and not os.access(parent, os.W_OK)


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


def _prepare(db: sqlite3.Connection, name: str, readonly: bool, memory: bool) -> None:
    """Set the connection up, upgrading an older schema in one transaction."""
    version = _schema_version(db, name, readonly)
    if not readonly and not memory:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
    if version == SCHEMA_VERSION:
        db.execute("PRAGMA foreign_keys = ON")
        return
    if readonly:
        raise HistoryError(
            f"{name}: history schema version {version} is older than this opendrs "
            f"({SCHEMA_VERSION}); open it once read-write to upgrade it"
        )
    db.execute("BEGIN IMMEDIATE")
    try:
        version = _schema_version(
            db, name, readonly
        )  # another process may have upgraded it meanwhile
        for target, step in enumerate(UPGRADES[version:], start=version + 1):
            try:
                for statement in step:
                    db.execute(statement)
            except sqlite3.Error as exc:
                raise HistoryError(
                    f"{name}: cannot upgrade the history schema from version "
                    f"{target - 1} to {target}: {exc}"
                ) from None
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
    # Off while upgrading: a step that rebuilds a table drops the rows others refer to.
    db.execute("PRAGMA foreign_keys = ON")


def _schema_version(db: sqlite3.Connection, name: str, readonly: bool) -> int:
    """The file's schema version, after checking that it is an opendrs history we can read."""
    application = int(db.execute("PRAGMA application_id").fetchone()[0])
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if application not in (0, APPLICATION_ID):
        raise HistoryError(
            f"{name}: not an opendrs history (SQLite application id {application:#x})",
            foreign=True,
        )
    if version > SCHEMA_VERSION:
        raise HistoryError(
            f"{name}: history schema version {version} is newer than this opendrs "
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
                f"{name}: not an opendrs history (a database with tables {shown})",
                foreign=True,
            )
        if readonly:  # nothing to upgrade: an empty file, never written by opendrs
            raise HistoryError(f"{name}: not an opendrs history (an empty database)", foreign=True)
    return version
