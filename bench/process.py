"""Run a command in a fresh process and measure it: wall time, CPU time and peak RSS.

The peak is the kernel's high-water mark of the process's own address space (``VmHWM``,
:func:`bench.worker.peak_rss_bytes`), sampled every :data:`SAMPLE_S` (or as asked) while the process
runs: it only grows, so the last sample is the peak up to then (growth in the last interval before
the process exits is not seen). ``ru_maxrss`` is not used for it: Linux carries it across fork and
exec. The CPU time (user + system) is the child's own, from ``os.wait4``; the wall time runs from
just before the process is started until it is reaped, the interpreter's start included. A process
still running at its timeout is killed, and reported as such with what it had used so far.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.worker import peak_rss_bytes

#: The checkout, whose ``bench`` and ``src`` the child processes import.
ROOT = Path(__file__).resolve().parent.parent
#: Seconds between two samples of the peak RSS.
SAMPLE_S = 0.02


def checkout_env() -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH`` (for ``bench``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class Measured:
    """What one process used, and how it ended."""

    wall: float
    cpu: float
    #: Peak RSS in bytes (None when it could never be read: the process ended at once).
    rss_peak: int | None
    returncode: int
    #: The timeout it was killed at, or None when it ended by itself.
    killed_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.killed_after is None and self.returncode == 0


def measure(
    cmd: Sequence[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[str] | int | None = subprocess.DEVNULL,
    stderr: IO[str] | int | None = subprocess.DEVNULL,
    sample_s: float = SAMPLE_S,
) -> Measured:
    """Run ``cmd`` to its end (or kill it after ``timeout`` seconds) and measure it, its peak
    RSS sampled every ``sample_s`` seconds."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    deadline = started + timeout
    peak: int | None = None
    killed: float | None = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = peak_rss_bytes(proc.pid) or peak
        if killed is None and time.perf_counter() > deadline:
            proc.kill()
            killed = timeout
        time.sleep(sample_s)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return Measured(wall, usage.ru_utime + usage.ru_stime, peak, proc.returncode, killed)


__all__ = ["ROOT", "SAMPLE_S", "Measured", "checkout_env", "measure"]
