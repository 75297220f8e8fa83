"""What shadow mode would have done, through the commands as processes: the history report of a
shadow run shows the moves it would have made and what they would have bought (not "0
migrations"); the dashboard names guests and says which spread its threshold is compared with.
Every daemon a test starts is stopped by it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from daemon import Daemon, eventually, fetch, opendrs, served

#: A guest of the built-in demo as the operator reads it: ``web-013 (112)``.
LABEL = r"[a-z]+-\d{3} \(\d+\)"


def shadow_config(directory: Path, *, days: float, http: str = "") -> Path:
    """Shadow mode on the built-in demo (80 guests packed on three of 8 nodes), a decision every
    5 simulated minutes."""
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: shadow\n"
        f"backend: {{type: sim, scenario: 'builtin:demo', days: {days}}}\n"
        "history: history.sqlite\n"
        "policy: {interval: 5m, hold: 1, smoothing: 0}\n" + (f"http: {http}\n" if http else "")
    )
    return config


def test_the_history_report_of_a_shadow_run_shows_what_it_would_have_done(tmp_path: Path) -> None:
    config = shadow_config(tmp_path, days=0.1)
    ran = opendrs("run", "--config", str(config))
    assert ran.returncode == 0, ran.stderr
    assert re.search(rf"shadow: would migrate {LABEL} pve\d → pve\d", ran.stderr)
    data = json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout)
    last = [d for d in data["decisions"] if d["act"]][-1]
    md = opendrs("report", "--config", str(config), "--format", "md")
    assert md.returncode == 0, md.stderr
    text = md.stdout
    assert "Migrations: 0 — 0 done" in text  # nothing migrated: shadow mode
    section = text.split("## What shadow mode would have done", 1)[1].split("\n## ", 1)[0]
    bought = f"would have made {len(last['moves'])} migrations and brought the spread from "
    assert bought in section
    planned = re.findall(rf"^- ({LABEL}) pve\d → pve\d$", section, re.MULTILINE)
    assert [p.split()[-1].strip("()") for p in planned] == [m["guest"] for m in last["moves"]]
    html = opendrs("report", "--config", str(config)).stdout
    assert 'id="shadow"' in html and html.count('class="would-move"') == len(last["moves"])
    assert "decisions shadow mode would have acted on" in html  # in the chart, beside migrations


def test_the_dashboard_names_guests_and_says_which_spread_it_compares(tmp_path: Path) -> None:
    config = shadow_config(tmp_path, days=60, http="{listen: '127.0.0.1:0'}")
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(r"shadow: would migrate", timeout=60)

        def page() -> str:
            status, body = fetch(address, "/")
            assert status == 200
            return body

        eventually(lambda: "would-move" in page() or "step 1:" in page(), what="a plan shown")
        body = page()
        assert re.search(rf"step 1: {LABEL} pve\d → pve\d", body)
        assert "acts when the spread is above 15 pp" in body
        card = re.search(r'id="spread">(.*?)</p>', body, re.DOTALL)
        assert card is not None
        spreads = [float(v) for v in re.findall(r"(?:cpu|memory) ([\d.]+) pp", card.group(1))]
        compared = re.search(r"compared with its threshold: ([\d.]+) pp", card.group(1))
        assert compared is not None and float(compared.group(1)) == max(spreads)
        state = json.loads(fetch(address, "/api/state")[1])
        moves = state["now"]["moves"]
        assert moves and all(m["guest"].isdigit() and m["label"].endswith(")") for m in moves)
