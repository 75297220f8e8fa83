"""``opendrs demo`` serves the dashboard while it runs, says where, and still ends by itself."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.cli.slow_page_demo import DRAWING

from daemon import fetch, opendrs
from opendrs.cli.demo_command import _stop_serving
from opendrs.cli.main import main
from opendrs.controller.http_server import STOP_GRACE

DASHBOARD = re.compile(r"dashboard: http://(127\.0\.0\.1:\d+)/ — served while the demo runs")


def test_the_demo_prints_its_dashboard_and_stops_serving_at_its_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--fast", "--days", "0.25"]) == 0
    out = capsys.readouterr().out
    match = DASHBOARD.search(out)
    assert match is not None, out
    assert "What opendrs did over 0.25 simulated days of the demo cluster" in out
    with pytest.raises(OSError):
        fetch(match.group(1), "/healthz")


def test_no_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--fast", "--days", "0.25", "--no-dashboard"]) == 0
    assert "dashboard:" not in capsys.readouterr().out


def test_a_bad_or_busy_address_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--listen", "example.com:80"])
    assert exit_.value.code == 2
    assert "argument --listen: 'example.com' is not an IP address" in capsys.readouterr().err


def test_the_dashboard_answers_while_a_paced_demo_runs() -> None:
    """A subprocess spread over about 15 s: its dashboard, JSON and metrics answer meanwhile;
    then it ends by itself (exit 0)."""
    demo = subprocess.Popen(
        [sys.executable, "-u", "-m", "opendrs", "demo", "--seconds", "15", "--days", "0.25"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        address = None
        for line in demo.stdout:
            match = DASHBOARD.search(line)
            if match:
                address = match.group(1)
                break
        assert address is not None, demo.stderr.read() if demo.stderr else ""
        deadline = time.monotonic() + 30
        while not json.loads(fetch(address, "/api/state")[1])["decisions"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        state = json.loads(fetch(address, "/api/state")[1])
        assert state["command"] == "opendrs demo" and state["simulated"]
        assert len(state["groups"][0]["nodes"]) == 8
        status, page = fetch(address, "/")
        assert status == 200 and "opendrs demo" in page
        status, text = fetch(address, "/metrics")
        names = {family.name for family in text_string_to_metric_families(text)}
        assert status == 200 and {"opendrs_node_load", "opendrs_spread"} <= names
        rest, _ = demo.communicate(timeout=120)
        assert demo.returncode == 0 and "What opendrs did over 0.25 simulated days" in rest
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)


def test_the_demo_reads_at_100_columns_with_guests_by_name() -> None:
    """Off a terminal, 100 columns: every line fits, migrations name their guests, and the summary
    says what its figures mean."""
    demo = opendrs("demo", "--fast", "--days", "0.25", "--no-dashboard", columns=100)
    assert demo.returncode == 0, demo.stderr
    lines = demo.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    done = [line for line in lines if re.match(r"\s*[\d.]+ h  done ", line)]
    assert done and all(re.search(r"done [a-z]+-\d{3} \(\d+\) pve\d → pve\d", d) for d in done)
    summary = "\n".join(
        lines[lines.index("What opendrs did over 0.25 simulated days of the demo cluster") :]
    )
    assert "ping-pongs: guests taken back to a node they left less than 24 h before" in summary
    assert "the spread (busiest node's load less the idlest's) averaged" in summary


#: Seconds the slowed page draws: far longer than any demo's end may wait.
SLOW_PAGE = 120
#: Seconds past the server's grace the demo may take to end once its page is cut.
END_MARGIN = 15.0


@contextlib.contextmanager
def _slowed_demo(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``opendrs demo ARGS`` with its page slowed by :data:`SLOW_PAGE` s, a page asked for and
    being drawn: the process and the file of its stderr; killed at the end if still running."""
    here = str(Path(__file__).parent)
    env = {**os.environ, "SLOW_PAGE": str(SLOW_PAGE)}
    env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")])
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-u", "-m", "slow_page_demo", "demo", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    try:
        _ask_for_the_page(demo, err)
        yield demo, err
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)


def _ask_for_the_page(demo: subprocess.Popen[str], err: Path) -> None:
    """Ask ``demo`` for its page once it says where it serves, and wait until it is drawn."""
    assert demo.stdout is not None
    found: list[str] = []

    def read_the_address() -> None:
        for line in demo.stdout or ():
            match = DASHBOARD.search(line)
            if match:
                found.append(match.group(1))
                return

    reader = threading.Thread(target=read_the_address, daemon=True)
    reader.start()
    reader.join(60)
    assert found, f"no dashboard address within 60 s:\n{err.read_text()}"

    def ask() -> None:
        with contextlib.suppress(OSError):  # cut by the demo's end, as it should be
            fetch(found[0], "/")

    threading.Thread(target=ask, daemon=True).start()
    deadline = time.monotonic() + 30
    while DRAWING not in err.read_text():
        assert time.monotonic() < deadline and demo.poll() is None, err.read_text()
        time.sleep(0.05)


def test_a_page_still_drawing_does_not_hold_the_end_of_the_demo(tmp_path: Path) -> None:
    """The demo ends by itself while its page draws for minutes: it prints its summary and exits
    0 within the server's grace and a margin — the cut page is not waited for."""
    with _slowed_demo(tmp_path, "--seconds", "6", "--days", "0.25") as (demo, err):
        try:
            out, _ = demo.communicate(timeout=6 + STOP_GRACE + END_MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo waited for its page to be drawn:\n{err.read_text()[-2000:]}")
    assert demo.returncode == 0, err.read_text()
    assert "What opendrs did over 0.25 simulated days of the demo cluster" in out
    assert "Traceback" not in err.read_text()


def test_ctrl_c_with_a_page_drawing_ends_the_demo_with_130(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) while a page draws: the demo stops serving within the server's grace and
    exits 130 at once, no traceback."""
    with _slowed_demo(tmp_path, "--seconds", "600", "--days", "0.25") as (demo, err):
        demo.send_signal(signal.SIGINT)
        try:
            demo.communicate(timeout=STOP_GRACE + END_MARGIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"Ctrl-C waited for the page to be drawn:\n{err.read_text()[-2000:]}")
    assert demo.returncode == 130, err.read_text()
    assert "Traceback" not in err.read_text()


class _InterruptedStop:
    """A server whose stop is interrupted by Ctrl-C half way, as an operator's second Ctrl-C
    lands while the demo's server waits for a request."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the signal is handled here, in the middle of the wait
        self.stopped = True


def test_a_ctrl_c_during_the_servers_stop_waits_for_the_stop_then_interrupts() -> None:
    server = _InterruptedStop()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _stop_serving(server)  # type: ignore[arg-type]
        assert server.stopped  # the stop ran to its end before the interrupt
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
