"""``opendrs run`` as an operator runs it: a subprocess, its log read as it goes, signals sent.

:class:`Daemon` starts the command with a configuration file, collects its standard error line by
line on a thread, and waits for log lines; :meth:`Daemon.stop` ends it (SIGTERM, then SIGKILL)
whatever the test did, so no process outlives its test.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CLOCK_STEP",
    "SERVING",
    "Daemon",
    "eventually",
    "fetch",
    "opendrs",
    "run_once",
    "send",
    "served",
    "stepped_clock",
    "write_proxmox_config",
    "write_sim_config",
]


#: Put first on the daemon's PYTHONPATH as ``sitecustomize.py``: its wall clock (``time.time``)
#: steps back by ``OPENDRS_TEST_CLOCK_STEP`` seconds (forward if negative) once the file
#: ``OPENDRS_TEST_CLOCK_AFTER`` exists, as when NTP corrects a clock that ran ahead (or behind).
CLOCK_STEP = """
import os, time
_wall = time.time
_step = float(os.environ["OPENDRS_TEST_CLOCK_STEP"])
_after = os.environ["OPENDRS_TEST_CLOCK_AFTER"]
time.time = lambda: _wall() - (_step if os.path.exists(_after) else 0.0)
"""


class Daemon:
    """One ``opendrs run`` process."""

    def __init__(
        self,
        config: Path,
        *args: str,
        env: dict[str, str] | None = None,
        files: int | None = None,
        module: str = "opendrs",
    ) -> None:
        """``files``: the process's limit of open files (``LimitNOFILE``), when given;
        ``module``: what ``python -m`` runs (one that runs opendrs's ``main`` itself)."""
        command = [sys.executable, "-m", module, "run", "--config", str(config), *args]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=None if files is None else functools.partial(_limit_files, files),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def log(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def count(self, pattern: str) -> int:
        with self._lock:
            return sum(1 for line in self.lines if re.search(pattern, line))

    def wait_for(self, pattern: str, timeout: float = 30.0, *, after: int = 0) -> str:
        """The first log line (from line ``after`` on) matching ``pattern``; fails after
        ``timeout`` seconds or when the process ends first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for line in self.lines[after:]:
                    if re.search(pattern, line):
                        return line
                seen = len(self.lines)
            if self.process.poll() is not None:
                self._reader.join(5)
                with self._lock:
                    rest = [ln for ln in self.lines[after:] if re.search(pattern, ln)]
                if rest:
                    return rest[0]
                raise AssertionError(
                    f"opendrs run exited ({self.process.returncode}) before {pattern!r}:\n"
                    + self.log()
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {timeout:g}s (after {seen} lines):\n" + self.log()
                )
            time.sleep(0.05)

    @property
    def mark(self) -> int:
        """The number of log lines so far (for ``wait_for(after=…)``)."""
        with self._lock:
            return len(self.lines)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` seconds (TimeoutExpired after)."""
        status = self.process.wait(timeout)
        self._reader.join(5)
        return status

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._reader.join(5)
        return self.process.returncode

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _limit_files(count: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def write_proxmox_config(
    directory: Path,
    address: str,
    cafile: str,
    *,
    user: str,
    token: str,
    mode: str,
    executor: str = "{max_parallel: 1, poll_interval: 1s}",
    extra: str = "",
) -> Path:
    """``directory/opendrs.yaml`` for a Proxmox API at ``address`` (trusting ``cafile``), its
    token secret in ``directory/token`` (mode 600); a policy that acts at the first observation,
    every second. ``extra`` is appended as it is (more top-level keys)."""
    token_file = directory / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    config = directory / "opendrs.yaml"
    config.write_text(
        f"mode: {mode}\n"
        "backend:\n"
        "  type: proxmox\n"
        f"  hosts: ['{address}']\n"
        f"  user: '{user}'\n"
        "  token_file: token\n"
        f"  ca_file: '{cafile}'\n"
        "  timeout: 5s\n"
        "  retries: 1\n"
        "policy: {interval: 1s, hold: 1, smoothing: 0}\n"
        f"executor: {executor}\n" + extra
    )
    return config


def run_once(config: Path) -> subprocess.CompletedProcess[str]:
    """``opendrs run --once --config CONFIG`` in a subprocess, to its end (at most 2 minutes)."""
    return opendrs("run", "--once", "--config", str(config), timeout=120)


def opendrs(
    *args: str,
    timeout: float = 300,
    columns: int | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS`` in a subprocess, to its end (at most ``timeout`` seconds); with
    ``columns``, its tables are as wide as on a terminal of that many columns; ``env``: its
    whole environment (this one's by default); ``preexec_fn``: run in the child before it starts
    (to set its limits)."""
    environ = dict(os.environ if env is None else env)
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "opendrs", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environ,
        preexec_fn=preexec_fn,
    )


# -- the daemon's HTTP server --------------------------------------------------------------

SERVING = r"serving the dashboard, /metrics and /healthz on http://(\S+)"


def fetch(
    address: str,
    path: str,
    *,
    method: str = "GET",
    token: str | None = None,
) -> tuple[int, str]:
    """The status and body of one request to ``http://ADDRESS/PATH`` (loopback only)."""
    return send(address, path, method=method, token=token)[:2]


def send(
    address: str,
    path: str,
    *,
    method: str = "POST",
    token: str | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, str, dict[str, str]]:
    """The status, body and headers of one request to ``http://ADDRESS/PATH`` (loopback only),
    with ``token`` as its ``Authorization: Bearer`` when given; ``body`` is sent by a POST."""
    assert address.startswith(("127.", "[::1]")), address
    fields = dict(headers or {})
    if token is not None:
        fields["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://{address}{path}",
        data=body if method == "POST" else None,
        method=method,
        headers=fields,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def served(daemon: Daemon) -> str:
    """The address the daemon says it bound (its ``http.listen``)."""
    match = re.search(SERVING, daemon.wait_for(SERVING, timeout=60))
    assert match is not None
    return match.group(1)


def eventually(
    check: Callable[[], bool],
    timeout: float = 60.0,
    *,
    what: str = "",
    log: Callable[[], str] | None = None,
) -> None:
    """Wait until ``check()`` is true; fail after ``timeout`` seconds, saying ``what`` was
    awaited and, given ``log``, ``log()`` (a daemon's log)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            said = f"not {what} within {timeout:g}s" if what else "not within the time"
            raise AssertionError(said if log is None else f"{said}:\n{log()}")
        time.sleep(0.1)


def write_sim_config(directory: Path, *, days: float, extra: str = "") -> Path:
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


def stepped_clock(folder: Path, seconds: float) -> tuple[dict[str, str], Path]:
    """The environment of a daemon whose wall clock steps back by ``seconds`` (forward if
    negative) once the returned file exists (:data:`CLOCK_STEP`, its shim made in ``folder``)."""
    shim = folder / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(CLOCK_STEP)
    stepped = folder / "stepped"
    env = {
        "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]),
        "OPENDRS_TEST_CLOCK_STEP": str(seconds),
        "OPENDRS_TEST_CLOCK_AFTER": str(stepped),
    }
    return env, stepped
