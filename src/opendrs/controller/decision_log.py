"""The daemon's decision log: one JSON object per line for each decision and migration event.

``log: {decisions: FILE}`` in the configuration. The daemon appends to ``FILE`` what it records in
the history as it records it — each decision, each migration whose platform task became known
(``started``), each migration outcome — in the form :mod:`opendrs.records` defines, the one
``opendrs history --format jsonl`` prints; an operator's verdict on a proposal is appended by
whoever gives it (``opendrs approve`` or ``reject``, the dashboard: :func:`append_to_log`). Each
line is written with one ``write`` on a file opened append-only, so a log shipper never reads
half a line and two writers never mix theirs.

Rotation: the file is opened again on SIGHUP (with the configuration), and before a line is
written whenever the path no longer names the open file (it was renamed or removed), so
``logrotate`` works with or without a ``postrotate`` signal. The file is never opened through a
symbolic link. A line that cannot be written (a full disk) is logged as a warning and the daemon
goes on: the history still has everything. A line is written whole or not at all: when only part
of it could be written, that part is cut off the file again, so the next line does not continue
a half one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Mapping
from typing import Any

from opendrs.records import DecisionRecord, MigrationRecord, jsonl, record_object

log = logging.getLogger(__name__)

__all__ = ["DecisionLog", "DecisionLogError", "append_to_log"]

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class DecisionLogError(Exception):
    """The decision log cannot be opened; ``str()`` is one line."""


def _open(path: str) -> tuple[int, tuple[int, int]]:
    """An append-only descriptor on ``path`` and the file's (device, inode)."""
    try:
        fd = os.open(path, _FLAGS, 0o640)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DecisionLogError(
                f"{path}: the decision log is a symbolic link: refused (name the file itself)"
            ) from None
        raise DecisionLogError(
            f"{path}: cannot open the decision log: {exc.strerror or exc}"
        ) from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise DecisionLogError(f"{path}: the decision log is not a regular file")
    return fd, (status.st_dev, status.st_ino)


class DecisionLog:
    """The decision log, or none (``path`` ``None``); :meth:`record` is a
    :data:`~opendrs.controller.history.Listener`."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd, self._identity = _open(path) if path is not None else (-1, (0, 0))
        self._failing = False

    def reopen(self, path: str | None) -> None:
        """Open ``path`` (the same one after a rotation, or another), or close the log for
        ``None``. When ``path`` cannot be opened, :class:`DecisionLogError` says why and the file
        open now stays open."""
        if path is None:
            self.close()
            self.path = None
            return
        fd, identity = _open(path)
        self.close()
        self._fd, self._identity, self.path = fd, identity, path

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def record(self, record: DecisionRecord | MigrationRecord) -> None:
        """Append the line of a record just written to the history; never raises."""
        self.append(record_object(record))

    def append(self, item: Mapping[str, Any]) -> None:
        """Append ``item`` as one line; never raises."""
        if self.path is not None:
            self._write(self.path, jsonl(item).encode("utf-8"))

    def _rotated(self, path: str) -> bool:
        try:
            status = os.stat(path, follow_symlinks=False)
        except OSError:
            return True
        return (status.st_dev, status.st_ino) != self._identity

    def _write(self, path: str, line: bytes) -> None:
        try:
            if self._fd < 0 or self._rotated(path):
                self.reopen(path)
            written = os.write(self._fd, line)
            if written != len(line):
                self._cut(written)
                raise OSError(errno.ENOSPC, f"only {written} of {len(line)} bytes written")
        except DecisionLogError as exc:
            self._failed(str(exc))
            return
        except OSError as exc:
            self._failed(f"{path}: cannot write the decision log: {exc.strerror or exc}")
            return
        if self._failing:
            log.info("%s: writing the decision log again", path)
            self._failing = False

    def _cut(self, written: int) -> None:
        """Remove the ``written`` bytes of a line that did not fit from the end of the file
        (where the append-only write put them), unless something was appended after them."""
        end = os.lseek(self._fd, 0, os.SEEK_CUR)
        if os.fstat(self._fd).st_size == end:
            os.ftruncate(self._fd, end - written)

    def _failed(self, why: str) -> None:
        """A line is lost: said once, until a line is written again."""
        if not self._failing:
            log.warning("%s; the history still records everything", why)
        self._failing = True

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_to_log(path: str | None, item: Mapping[str, Any]) -> None:
    """Append ``item`` to the decision log at ``path`` (``None``: there is none) from a command
    or thread other than the daemon's recording (an operator's verdict): the file is opened for
    this line and closed; a problem is a warning, never an exception."""
    if path is None:
        return
    try:
        with DecisionLog(path) as decisions:
            decisions.append(item)
    except DecisionLogError as exc:
        log.warning("%s", exc)
