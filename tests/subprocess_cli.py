"""``opendrs`` run as an operator runs it: a subprocess of this Python, output captured; and
a configuration of the daemon against the simulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def opendrs(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS…`` in a subprocess: its exit status, standard output and error (text)."""
    return subprocess.run(
        [sys.executable, "-m", "opendrs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_config(directory: Path, *, days: float, extra: str = "") -> Path:
    """Active mode on the built-in demo (8 nodes, 80 guests packed on three, 2 % of migrations
    failing), a decision every 5 simulated minutes, the decision log beside the history."""
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: active\n"
        f"backend: {{type: sim, scenario: 'builtin:demo', days: {days}}}\n"
        "history: history.sqlite\n"
        "policy: {interval: 5m, hold: 1, smoothing: 0}\n"
        "log: {decisions: decisions.jsonl}\n" + extra
    )
    return config
