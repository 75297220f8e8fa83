"""``opendrs report``: a report as one self-contained HTML file, or as Markdown.

``opendrs report SNAPSHOT`` reports the plan ``opendrs plan`` makes for the snapshot;
``opendrs report --config FILE`` reports the daemon's history (opened read-only, as
``opendrs history`` does). ``opendrs simulate --report FILE`` writes the simulation's report
through :func:`write_report` too.

Exit status: 0 written; 1 the history cannot be read (busy, corrupt, of a newer opendrs);
2 bad input — a missing or bad snapshot or configuration, a configuration whose history does not
exist (yet) or is kept in memory, a file that cannot be written.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from opendrs.cli.history_command import require_history
from opendrs.cli.history_report import history_document
from opendrs.cli.process import UsageError
from opendrs.report.render import Document, render

__all__ = ["check_writable", "file_format", "report_of_history", "write_report"]


def report_of_history(config_file: str) -> Document:
    """The report of the history of the configuration in ``config_file``.

    :class:`UsageError` when the configuration keeps no history file, or it does not exist;
    :class:`~opendrs.controller.history_file.HistoryError` when it cannot be read."""
    # imported when the command runs: the controller is large
    from opendrs.controller.config import load_config
    from opendrs.controller.history import History

    config = load_config(config_file)
    require_history(config_file, config.history)
    with History(config.history, readonly=True) as history:
        return history_document(config, history)


def file_format(path: str) -> str:
    """The report format a file name asks for: ``md`` for ``.md`` and ``.markdown``, else
    ``html``."""
    return "md" if Path(path).suffix.lower() in (".md", ".markdown") else "html"


def check_writable(output: str, option: str) -> None:
    """Refuse, before any work, an output file whose folder does not exist (the one error that
    would otherwise come only once a long run is over)."""
    folder = Path(output).parent
    if not folder.is_dir():
        raise UsageError(f"{option}: cannot write {output}: No such file or directory")


def write_report(document: Document, fmt: str, output: str | None, option: str = "-o") -> None:
    """``document`` rendered as ``fmt`` into the file ``output`` (replaced whole, never left half
    written), or to standard output (``None`` or ``-``)."""
    text = render(document, fmt)
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    target = Path(output)
    temporary = target.with_name(f".{target.name}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise UsageError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None
