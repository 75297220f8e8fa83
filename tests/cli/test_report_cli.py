"""``opendrs report`` and ``opendrs simulate --report`` as an operator runs them (subprocesses):
the HTML page read back — the nodes, the moves, the charts are there and nothing in it points
outside the file — the Markdown, the same bytes for the same input, one-line errors."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from daemon import opendrs, write_sim_config
from opendrs.controller.history import History
from opendrs.model.cluster import Move
from report_page import Page

ROOT = Path(__file__).resolve().parents[2]
RULES = str(ROOT / "examples" / "rules.yaml")


def as_json(*args: str) -> Any:
    done = opendrs(*args, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def assert_self_contained(page: Page) -> None:
    assert page.external_references() == []
    assert page.find("script") == [] and page.find("link") == []
    assert page.find("style"), "the styles are inline"


def charts(page: Page) -> list[str]:
    """The text of each chart (inline SVG: titles, axis labels, legends)."""
    return [svg.text for svg in page.find("svg")]


# -- a snapshot and its plan -------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("plan") / "demo.html"
    done = opendrs("report", "demo", "-o", str(out))
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stderr
    return out, out.read_text(encoding="utf-8")


def test_snapshot_report_lists_the_nodes_before_and_after_with_a_chart_per_resource(
    demo_report: tuple[Path, str],
) -> None:
    page = Page(demo_report[1])
    shown = as_json("show", "demo")
    rows = page.find("tr", "node")
    assert [row.text.split()[0] for row in rows] == [n["name"] for n in shown["nodes"]]
    for row, node in zip(rows, shown["nodes"], strict=True):
        assert f"{100 * node['load']['cpu']:.1f} %" in row.text
    texts = charts(page)
    assert len(texts) == 2
    for resource, text in zip(("cpu", "memory"), texts, strict=True):
        assert f"{resource} load per node, before and after the plan" in text
        assert "before" in text and "after" in text
        assert all(n["name"] in text for n in shown["nodes"])
    assert_self_contained(page)


def test_snapshot_report_shows_the_steps_of_opendrs_plan_each_move_with_its_reason(
    demo_report: tuple[Path, str],
) -> None:
    page = Page(demo_report[1])
    plan = as_json("plan", "demo")
    steps = page.find("div", "step")
    assert len(steps) == plan["plan"]["steps"] > 1
    moves = page.find("li", "move")
    assert len(moves) == len(plan["moves"])
    for li, move in zip(moves, plan["moves"], strict=True):
        # the guest as name (id), then why in words; the engine's figures in the moves' table
        assert f"({move['guest']}) {move['source']} → {move['target']}" in li.text
        assert f"({move['guest']}) off {move['source']} (" in li.text and "; copies " in li.text
    table = page.section("moves").text
    assert all(f"{p['reason']} {p['metric']}" in table for p in plan["proposed"])
    for step, element in enumerate(steps, 1):
        assert element.text.startswith(f"Step {step} ")
    bounds = page.section("bounds").text
    assert f"at least {plan['bounds']['migrations']} are needed" in bounds
    assert f"{plan['migrations']} migrations" in bounds
    assert "gap" in bounds
    rules = page.section("rules").text
    for name in ("db-on-nvme", "pin-160", "db-apart", "dns-apart", "app-with-cache"):
        assert name in rules


def test_same_snapshot_same_bytes_in_a_file_and_on_stdout(demo_report: tuple[Path, str]) -> None:
    again = opendrs("report", "demo")
    assert again.returncode == 0
    assert again.stdout == demo_report[1]


def test_snapshot_report_in_markdown(tmp_path: Path) -> None:
    out = tmp_path / "demo.md"
    done = opendrs("report", "demo", "--format", "md", "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text(encoding="utf-8")
    plan = as_json("plan", "demo")
    assert text.startswith("# opendrs plan report: demo\n")
    assert re.search(r"<[a-z/]", text) is None, "no HTML in the Markdown"
    for heading in ("## Nodes before and after", "## The plan, step by step", "## Rules"):
        assert f"\n{heading}" in text
    for node in as_json("show", "demo")["nodes"]:
        assert re.search(rf"^\| {node['name']} \| online \|", text, re.MULTILINE)
    for move in plan["moves"]:
        said = rf"^- moves .* \({move['guest']}\) off {move['source']} \(.*\) to {move['target']} "
        assert re.search(said, text, re.MULTILINE), move
    assert text.count("\nStep ") == plan["plan"]["steps"]
    # The failover headroom before and after the plan, as opendrs headroom says it.
    before = opendrs("headroom", "demo").stdout.splitlines()[0].removeprefix("demo: ")
    assert f"\n- Before: {before}. After: failover headroom: yes, for any 1 node" in text
    # Every table row has as many cells as its header.
    for table in re.findall(r"((?:^\|.*\|\n)+)", text, re.MULTILINE):
        widths = {line.count(" | ") for line in table.splitlines() if not line.startswith("|-")}
        assert len(widths) == 1, table


def test_snapshot_report_shows_rules_that_conflict(tmp_path: Path) -> None:
    snapshot = tmp_path / "conflict.yaml"
    snapshot.write_text(
        "version: 1\nname: conflict\n"
        "nodes:\n  n1: {cpu: 16, memory: 64GiB}\n  n2: {cpu: 16, memory: 64GiB}\n"
        "guests:\n"
        "  - {id: a<b>, node: n1, cpu: 2, memory: 4GiB}\n"
        "  - {id: b, node: n2, cpu: 2, memory: 4GiB}\n"
        "rules:\n"
        "  - {type: affinity, name: together, guests: [a<b>, b]}\n"
        "  - {type: anti-affinity, name: apart, guests: [a<b>, b]}\n"
    )
    html = opendrs("report", str(snapshot))
    assert html.returncode == 0, html.stderr
    page = Page(html.stdout)
    rules = page.section("rules").text
    assert "together" in rules and "apart" in rules
    assert "Conflicts between rules" in rules and "None: every rule can hold." not in rules
    assert "a&lt;b&gt;" in html.stdout, "names are escaped"
    md = opendrs("report", str(snapshot), "--format", "md")
    assert "a&lt;b&gt;" in md.stdout and "a<b>" not in md.stdout


# -- a daemon's history ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration whose daemon ran a quarter of a simulated day against the simulator."""
    config = write_sim_config(tmp_path_factory.mktemp("ran"), days=0.25)
    done = opendrs("run", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return config


def test_history_report_over_a_run_of_the_daemon(ran: Path) -> None:
    done = opendrs("report", "--config", str(ran))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    page = Page(done.stdout)
    history = as_json("history", "--config", str(ran))
    migrations = history["migrations"]
    (day,) = page.find("tr", "day")  # a quarter of a day: one calendar day
    assert day.text.split()[:2] == ["1970-01-01", str(len(history["decisions"]))]
    summary = page.section("summary").text
    assert f"{len(migrations)} migrations" in summary
    texts = charts(page)
    assert len(texts) == 2
    assert "threshold" in texts[0] and "spread" in texts[0]
    assert "Migrations per day (UTC)" in texts[1]
    failed = [m for m in migrations if m["outcome"] in ("failed", "lost")]
    assert len(page.find("tr", "failure")) == len(failed)
    movers = page.find("tr", "mover")
    done_by_guest = Counter(m["guest"] for m in migrations if m["outcome"] == "done")
    assert movers and movers[0].text.split()[1].strip("()") in {
        g for g, n in done_by_guest.items() if n == max(done_by_guest.values())
    }
    assert_self_contained(page)
    again = opendrs("report", "--config", str(ran))
    assert again.stdout == done.stdout


def test_history_report_in_markdown(ran: Path) -> None:
    done = opendrs("report", "--config", str(ran), "--format", "md")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("# opendrs history report: demo\n")
    assert re.search(r"<[a-z/]", text) is None
    assert re.search(r"^\| 1970-01-01 \| \d+ \| [\d.]+ pp \|", text, re.MULTILINE)
    for heading in ("Failures and what was done about them", "The guests that moved most"):
        assert f"\n## {heading}\n" in text


def decide(history: History, at: float, spread: float, move: Move) -> int:
    """A decision to act, with one move, recorded in ``history``."""
    return history.record_decision(
        at=at,
        cluster="lab",
        mode="active",
        policy="opendrs",
        action="plan",
        reason=f"spread {100 * spread:.1f} pp above threshold 15 pp",
        imbalance=spread,
        predicted=0.05,
        summary={"code": "plan"},
        plan=[{"guest": move.guest, "source": move.source, "target": move.target, "step": 1}],
    )


def test_history_report_says_what_came_of_each_failure(tmp_path: Path) -> None:
    """A history written through the History API: over two days, one failure followed by a
    migration of the guest elsewhere, one after which the guest stayed."""
    day = 86_400.0
    with History(tmp_path / "history.sqlite") as history:
        history.bind("lab")
        first = decide(history, day, 0.3, Move("web1", "n1", "n2"))
        one = history.migration_started(
            decision=first, move=Move("web1", "n1", "n2"), handle="t1", at=day + 10
        )
        history.migration_finished(one, at=day + 20, outcome="failed", error="disk <busy>")
        two = history.migration_started(
            decision=first, move=Move("db1", "n1", "n3"), handle="t2", at=day + 30
        )
        history.migration_finished(two, at=day + 40, outcome="failed", error="timeout")
        second = decide(history, 2 * day, 0.2, Move("web1", "n1", "n3"))
        three = history.migration_started(
            decision=second, move=Move("web1", "n1", "n3"), handle="t3", at=2 * day + 10
        )
        history.migration_finished(three, at=2 * day + 30, outcome="done")
    config = tmp_path / "opendrs.yaml"
    config.write_text("backend: {type: sim, scenario: 'builtin:demo'}\nhistory: history.sqlite\n")
    done = opendrs("report", "--config", str(config))
    assert done.returncode == 0, done.stderr
    page = Page(done.stdout)
    failures = [row.text for row in page.find("tr", "failure")]
    assert len(failures) == 2
    assert "web1 n1 n2 failed disk <busy> moved n1 → n3 at 1970-01-03T00:00:10Z" in failures[0]
    assert "db1 n1 n3 failed timeout not moved since: it stayed on n1" in failures[1]
    days = [row.text.split() for row in page.find("tr", "day")]
    assert [d[:2] for d in days] == [["1970-01-02", "1"], ["1970-01-03", "1"]]
    assert "disk &lt;busy&gt;" in done.stdout
    md = opendrs("report", "--config", str(config), "--format", "md").stdout
    assert "| web1 | n1 | n2 | failed | disk &lt;busy&gt; | moved n1 → n3" in md


# -- the simulator's policies side by side -----------------------------------------------------


def test_simulate_report_puts_the_policies_side_by_side(tmp_path: Path) -> None:
    html, md = tmp_path / "sim.html", tmp_path / "sim.md"
    args = ("simulate", "builtin:demo", "--days", "0.25", "--policy", "opendrs,proxlb")
    done = opendrs(*args, "--no-progress", "--format", "json", "--report", str(html))
    assert done.returncode == 0, done.stderr
    stability = json.loads(done.stdout)
    page = Page(html.read_text(encoding="utf-8"))
    rows = page.find("tr", "policy")
    assert [row.text.split()[:3] for row in rows] == [
        [r["policy"], r["strategy"], str(r["migrations"])] for r in stability
    ]
    spread, per_day = charts(page)
    for text in (spread, per_day):
        assert "opendrs" in text and "proxlb" in text
    assert "Spread over time, each policy" in spread and "threshold" in spread
    assert "Migrations per simulated day, each policy" in per_day
    assert_self_contained(page)
    assert "wall" not in page.html, "the wall time is not the input's: left out"
    done = opendrs(*args, "--no-progress", "--report", str(md))
    assert done.returncode == 0 and "Stability over" in done.stdout
    text = md.read_text(encoding="utf-8")
    assert re.search(r"<[a-z/]", text) is None
    assert "| day | opendrs | proxlb |" in text
    migrations = {r["policy"]: r["migrations"] for r in stability}
    row = re.search(
        r"^## Migrations per day.*?^\| 1 \| (\d+) \(\d+\) \| (\d+) \(\d+\) \|",
        text,
        re.MULTILINE | re.DOTALL,
    )
    assert row and (int(row[1]), int(row[2])) == (migrations["opendrs"], migrations["proxlb"])


# -- errors ------------------------------------------------------------------------------------


def no_history_config(directory: Path) -> Path:
    return write_sim_config(directory, days=0.1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("report", "{dir}/missing.yaml"), "missing.yaml"),
        (("report", "demo", "--format", "pdf"), "--format"),
        (("report",), "give a SNAPSHOT or --config FILE"),
        (("report", "demo", "--config", "{config}"), "give a SNAPSHOT or --config FILE"),
        (("report", "--config", "{config}"), "does not exist (has the daemon run with this"),
        (("history", "--config", "{config}"), "does not exist (has the daemon run with this"),
        (("report", "--config", "{dir}/missing.yaml"), "missing.yaml"),
        (("report", "demo", "-o", "{dir}/no/such/dir/r.html"), "-o: cannot write"),
        (("report", "demo", "--strategy", "nope"), "--strategy"),
        (("report", "--config", "{config}", "--max-moves", "3"), "--max-moves is for a SNAPSHOT"),
        (
            ("simulate", "builtin:demo", "--days", "0.01", "--report", "{dir}/no/dir/r.html"),
            "--report: cannot write",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    config = no_history_config(tmp_path)
    argv = [a.format(config=config, dir=tmp_path) for a in args]
    done = opendrs(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error:")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("**/*.html")) and not list(tmp_path.glob("**/.*.tmp"))


def test_a_report_with_names_outside_the_charts_font_draws_them_without_warnings(
    tmp_path: Path,
) -> None:
    """A node named in CJK: the chart keeps it as text (the browser's fonts draw it), and the
    charts' font lacking its glyphs is no warning on standard error."""
    text = (ROOT / "examples" / "small.yaml").read_text().replace("pve1", "节点一")
    snapshot = tmp_path / "wide.yaml"
    snapshot.write_text(text)
    done = opendrs("report", str(snapshot), "-o", str(tmp_path / "report.html"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "节点一" in (tmp_path / "report.html").read_text()
