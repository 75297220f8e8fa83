"""The ``opendrs`` command run as a process, for the command-line tests."""

from __future__ import annotations

import subprocess
import sys


def opendrs(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m opendrs ARGS``: its exit status, stdout and stderr (five minutes at most)."""
    return subprocess.run(
        [sys.executable, "-m", "opendrs", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
