"""Commands run as an operator runs them, for the install tests: outside the checkout's Python
path, failing the test with their output; and whether pip's index can be reached."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The checkout.
ROOT = Path(__file__).resolve().parents[2]


def run(
    command: Sequence[str],
    cwd: Path,
    *,
    timeout: float = 900,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``command`` run in ``cwd`` without the checkout on Python's path; an exit status other
    than 0 fails the test with the command's output."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        list(command),
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{' '.join(command)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def index_unreachable(where: Path) -> str | None:
    """Why pip's index cannot serve a package here (the dependencies come from it), or None."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(where), "PyYAML"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode == 0:
        return None
    return f"pip's index cannot be reached: {' '.join(done.stderr.split()[-30:])}"


def make_dist(where: Path) -> None:
    """``make dist`` with its output in ``where``."""
    run(["make", "dist", f"DIST={where}", f"PYTHON={sys.executable}"], ROOT)
