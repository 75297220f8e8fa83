"""Secrets read from files: a token or password that must not be readable from the command line.

A secret file others could change (writable by its group or by every user, or owned by someone
else than the user running opendrs or root) is refused; one every user may read is used, with a
warning. Errors name the file, never its content. Used by the Proxmox backend's ``token_file`` /
``password_file`` and by the daemon's ``http.token_file``.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from typing import Final

__all__ = ["SecretError", "check_secret", "read_secret_file"]

log = logging.getLogger(__name__)

#: Largest secret file read (a token secret is a 36-character UUID).
_SECRET_MAX: Final = 4096


class SecretError(Exception):
    """A secret that cannot be had; the message names the file, never the content."""


def check_secret(secret: str, source: str, *, header: bool = False) -> str:
    """``secret`` (surrounding white space dropped) when it is one: not empty, at most 4096
    bytes, printable text on one line without white space, and — for a token sent in an HTTP
    header (``header``) — only Latin-1 characters, which is all a header carries. Else
    :class:`SecretError` naming ``source`` (``the secret file 'F'``, ``the environment variable
    V``), never the content."""
    if len(secret.encode("utf-8", "surrogateescape")) > _SECRET_MAX:
        raise SecretError(f"{source} is too large to hold only a secret")
    secret = secret.strip()
    if not secret:
        raise SecretError(f"{source} is empty")
    if not secret.isprintable() or any(c.isspace() for c in secret):
        raise SecretError(f"{source} must hold only the secret, on one line")
    if header:
        try:
            secret.encode("latin-1")
        except UnicodeEncodeError:
            raise SecretError(
                f"{source} holds a character outside Latin-1, which an HTTP header cannot carry "
                "(a token is ASCII)"
            ) from None
    return secret


def read_secret_file(file: str, *, header: bool = False) -> str:
    """The secret in ``file`` (surrounding white space dropped), or :class:`SecretError`:
    checked by :func:`check_secret` (``header``: a token sent in an HTTP header).

    A file others could change is refused (:func:`_check_secret_file`); one every user may read
    is used, with a warning.
    """
    try:
        info = os.stat(file)
    except OSError as exc:
        raise SecretError(f"cannot read the secret file {file!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SecretError(f"the secret file {file!r} is not a regular file")
    try:
        with open(file, "rb") as stream:
            info = os.fstat(stream.fileno())  # the file read, even if it was replaced meanwhile
            if not stat.S_ISREG(info.st_mode):
                raise SecretError(f"the secret file {file!r} is not a regular file")
            _check_secret_file(file, info)
            data = stream.read(_SECRET_MAX + 1)
    except OSError as exc:
        raise SecretError(f"cannot read the secret file {file!r}: {exc.strerror}") from None
    if len(data) > _SECRET_MAX:
        raise SecretError(f"the secret file {file!r} is too large to hold only a secret")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"the secret file {file!r} is not UTF-8 text") from None
    secret = check_secret(text, f"the secret file {file!r}", header=header)
    if info.st_mode & stat.S_IROTH:
        log.warning(
            "the secret file %s is readable by every user on this host: chmod 600 (or 640) it",
            file,
        )
    return secret


def _check_secret_file(file: str, info: os.stat_result) -> None:
    """Refuse a secret file others could change: one writable by its group or by every user,
    or one that belongs to neither the user running opendrs nor root."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if mode & stat.S_IWOTH else "its group"
        raise SecretError(
            f"the secret file {file!r} is writable by {who} (mode {mode:04o}): "
            "chmod 600 (or 640) it"
        )
    euid = os.geteuid()
    if info.st_uid not in (euid, 0):
        raise SecretError(
            f"the secret file {file!r} belongs to {_user(info.st_uid)}, not to the user running "
            f"opendrs ({_user(euid)}) or root: chown it"
        )


def _user(uid: int) -> str:
    """A user's name and uid, for a message."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
