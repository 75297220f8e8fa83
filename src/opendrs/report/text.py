"""Human-readable reports: rich tables and colours on a terminal, plain aligned text otherwise."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opendrs.engine.bounds import LowerBounds
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.constraints import Constraints, nodes_by_reason, platform_balancer
from opendrs.engine.imbalance import Imbalance
from opendrs.engine.placement import Evacuation, Placement
from opendrs.engine.planner import Plan
from opendrs.engine.strategies.base import Proposal, cluster_imbalance, imbalance_by_arch
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import Rules
from opendrs.model.units import format_bytes
from opendrs.report.words import copied_bytes, move_sentences, penalty_rules, stop_sentence

BAR_WIDTH = 20

#: A number and its unit (``32.0 GiB``, ``89 %``): kept on one line when text is wrapped.
_NUMBER_UNIT = re.compile(r"(\d) (?=(?:[KMGTP]i)?B\b|%|pp\b|s\b|min\b)")
_TIED = "\u00a0"

#: The narrowest width text is wrapped at, whatever the console says.
MIN_WIDTH = 40


def wrap(text: str, width: int, hang: int | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` columns (:data:`MIN_WIDTH` at least), the first
    keeping its indent, the next indented ``hang`` columns (by default the first's indent and 2
    more: a hanging indent); a word longer than a line is kept whole, never cut."""
    words = _NUMBER_UNIT.sub(r"\1" + _TIED, text.lstrip(" "))
    indent = text[: len(text) - len(text.lstrip(" "))]
    hanging = " " * (len(indent) + 2 if hang is None else hang)
    lines = textwrap.wrap(
        words,
        max(width, MIN_WIDTH),
        initial_indent=indent,
        subsequent_indent=hanging,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_TIED, " ") for line in lines] or [indent.rstrip()]


def pad(text: str, width: int, *, right: bool = False) -> str:
    """``text`` padded with blanks to ``width`` columns of a terminal (a CJK or emoji character
    takes two), on the left when ``right``."""
    blanks = " " * max(width - cell_len(text), 0)
    return blanks + text if right else text + blanks


class Report:
    """Writes titled tables and lines to a console, rich or plain."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rich = console.is_terminal

    def line(self, text: str = "", style: str | None = None) -> None:
        if self.rich and style:
            self.console.print(Text(text, style=style))
        else:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def wrapped(self, text: str, style: str | None = None, *, hang: int | None = None) -> None:
        """``text`` wrapped at the console's width with a hanging indent (:func:`wrap`)."""
        for line in wrap(text, self.console.width, hang):
            self.line(line, style)

    def heading(self, text: str) -> None:
        self.line()
        self.line(text, "bold")

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[str | Text]],
        *,
        right: Sequence[int] = (),
    ) -> None:
        if self.rich:
            table = Table(show_edge=False, header_style="bold", pad_edge=False)
            for i, head in enumerate(headers):
                table.add_column(head, justify="right" if i in right else "left")
            for row in rows:
                table.add_row(*row)
            self.console.print(table)
            return
        plain = [[c.plain if isinstance(c, Text) else c for c in row] for row in rows]
        widths = [cell_len(h) for h in headers]
        for row in plain:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], cell_len(cell))

        def fmt(cells: Sequence[str]) -> str:
            out = []
            for i, cell in enumerate(cells):
                out.append(pad(cell, widths[i], right=i in right))
            return "  ".join(out).rstrip()

        self.console.print(fmt(headers), markup=False, highlight=False, soft_wrap=True)
        for row in plain:
            self.console.print(fmt(row), markup=False, highlight=False, soft_wrap=True)


def bar(fraction: float, width: int = BAR_WIDTH) -> Text:
    """A load bar: green below 70 %, yellow below 90 %, red above (plain: ``#`` and ``.``)."""
    frac = 0.0 if not np.isfinite(fraction) else max(fraction, 0.0)
    filled = min(round(frac * width), width)
    style = "green" if frac < 0.7 else "yellow" if frac < 0.9 else "red"
    text = Text("#" * filled, style=style)
    text.append("." * (width - filled), style="dim")
    text.append(f" {frac * 100:5.1f}%")
    return text


def node_state(node: Node) -> str:
    """``online``, ``maintenance`` or ``offline``."""
    return "offline" if not node.online else "maintenance" if node.maintenance else "online"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def imbalance_rows(imb: Imbalance) -> list[list[str]]:
    rows = []
    for name, m in [*imb.resources.items(), ("combined", imb.combined)]:
        rows.append(
            [
                name,
                _pct(m.mean),
                _pct(m.min),
                _pct(m.max),
                f"{m.spread * 100:.1f} pp",
                f"{m.cv:.3f}",
                f"{m.cv_normalized:.3f}",
                _pct(m.rms),
            ]
        )
    return rows


IMBALANCE_HEADERS = ("resource", "mean", "min", "max", "spread", "CV", "CV/√(N−1)", "RMS")


_LOAD_HEADERS = ("node", "state", "guests", "cpu", "memory")
_SIZE_HEADERS = ("node", "arch", "cores", "memory", "vCPUs committed", "memory committed")
_GUEST_HEADERS = ("node", "guest", "kind", "cpu", "memory", "flags")


def show_cluster(report: Report, cluster: Cluster, *, guests: bool = True) -> None:
    """Nodes with load bars per resource (as wide as the console lets them be), their sizes,
    guests per node, and the imbalance figures."""
    settings = cluster.settings
    fractions = LoadModel.build(cluster).fractions()
    cons = Constraints.build(cluster)
    committed = cons.capacity.committed()
    report.wrapped(
        f"Cluster {cluster.name}: {len(cluster.nodes)} nodes, {len(cluster.guests)} guests, "
        f"{settings.mode} mode",
        "bold",
    )
    balancer = platform_balancer(cluster)
    if balancer is not None:
        report.wrapped(balancer, "yellow")
    report.heading(f"Nodes ({settings.mode} load as a share of capacity less reserves)")
    report.table(_LOAD_HEADERS, _load_rows(cluster, fractions, report.console.width), right=(2,))
    report.heading("Node sizes (committed: what the guests are given, against the limit)")
    rows = _size_rows(cluster, committed, cons.capacity.limit)
    report.table(_SIZE_HEADERS, rows, right=(2, 3, 4, 5))
    by_arch = imbalance_by_arch(cluster)
    if by_arch:
        show_by_arch(report, "Imbalance", by_arch)
    else:
        report.heading("Imbalance (usable nodes)")
        report.table(
            IMBALANCE_HEADERS, imbalance_rows(cluster_imbalance(cluster)), right=range(1, 8)
        )
    if guests:
        report.heading(
            "Guests (cpu: cores used/vCPUs; memory: used/size; flags: state if not running)"
        )
        report.table(_GUEST_HEADERS, _guest_rows(cluster), right=(3, 4))
    _show_rules(report, cluster)
    _show_problems(report, cluster, cons, committed)


def _show_rules(report: Report, cluster: Cluster) -> None:
    """Each node and guest rule: its name, what it does, its guests (as ``name (id)``) and its
    origin."""
    rules = cluster.rules
    if not rules.node_affinity and not rules.guest_affinity:
        return
    report.heading("Rules")
    for node_rule in rules.node_affinity:
        strength = "strict" if node_rule.strict else "preferred"
        nodes = ", ".join(node_rule.nodes)
        guests = ", ".join(map(cluster.guest_label, node_rule.guests))
        report.wrapped(
            f"  {node_rule.name}: {guests} on {nodes} ({strength}), origin {node_rule.origin}"
        )
    for guest_rule in rules.guest_affinity:
        kind = "together" if guest_rule.positive else "apart"
        strength = "hard" if guest_rule.hard else "soft"
        guests = ", ".join(map(cluster.guest_label, guest_rule.guests))
        report.wrapped(
            f"  {guest_rule.name}: {guests} kept {kind} ({strength}), origin {guest_rule.origin}"
        )


def _load_rows(cluster: Cluster, fractions: np.ndarray, width: int) -> list[list[str | Text]]:
    """A row per node: state, guests running of all, a load bar per resource; the bars share
    what ``width`` leaves (from 5 to :data:`BAR_WIDTH` characters each)."""
    name_w = max((cell_len(n.name) for n in cluster.nodes), default=4)
    state_w = max((len(node_state(n)) for n in cluster.nodes), default=5)
    # the other columns, the bars' percents, and a rich table's " │ " between columns
    fixed = max(name_w, 4) + max(state_w, 5) + 6 + 2 * 7 + 4 * 3 + 1
    bar_w = max(5, min(BAR_WIDTH, (width - fixed) // 2))
    rows: list[list[str | Text]] = []
    for i, node in enumerate(cluster.nodes):
        on_node = cluster.guests_on(node.name)
        running = sum(1 for g in on_node if g.state != "stopped")
        rows.append(
            [
                node.name,
                node_state(node),
                f"{running}/{len(on_node)}",
                bar(fractions[i, 0], bar_w),
                bar(fractions[i, 1], bar_w),
            ]
        )
    return rows


def _size_rows(cluster: Cluster, committed: np.ndarray, limit: np.ndarray) -> list[list[str]]:
    """A row per node: its architecture and size, the capacity ``committed`` against the
    ``limit``."""
    return [
        [
            node.name,
            node.arch,
            f"{node.cpu:g}",
            format_bytes(node.memory),
            f"{committed[i, 0]:g}/{limit[i, 0]:g}",
            f"{format_bytes(committed[i, 1])}/{format_bytes(limit[i, 1])}",
        ]
        for i, node in enumerate(cluster.nodes)
    ]


def _guest_flags(cluster: Cluster, g: Guest) -> str:
    """What sets guest ``g`` apart: ``stopped ha ignored lock:backup devices local-disk
    ->node`` (its state when it is not running)."""
    flags = [] if g.state == "running" else [g.state]
    if g.ha:
        flags.append("ha")
    if g.id in cluster.rules.ignored:
        flags.append("ignored")
    if g.lock:
        flags.append(f"lock:{g.lock}")
    if g.devices:
        flags.append("devices")
    if g.local_disk_bytes:
        flags.append("local-disk")
    if g.migrating_to:
        flags.append(f"->{g.migrating_to}")
    return " ".join(flags)


def _guest_rows(cluster: Cluster) -> list[list[str | Text]]:
    """A row per guest, node by node: its use against its size, and its flags."""
    rows: list[list[str | Text]] = []
    for node in cluster.nodes:
        for g in cluster.guests_on(node.name):
            rows.append(
                [
                    node.name,
                    g.label,
                    g.kind,
                    f"{g.cpu_load:.2f}/{g.cpu:g}",
                    _used_of(g.memory_load, g.memory),
                    _guest_flags(cluster, g),
                ]
            )
    return rows


def _used_of(used: float, size: float) -> str:
    """``44.0/48.0 GiB``: bytes used of a size, both in the size's unit."""
    unit = format_bytes(size).split()[-1]
    scale = 1024.0 ** ("B", "KiB", "MiB", "GiB", "TiB", "PiB").index(unit)
    return f"{used / scale:.1f}/{size / scale:.1f} {unit}"


def _show_problems(
    report: Report, cluster: Cluster, cons: Constraints, committed: np.ndarray
) -> None:
    """The rules dropped, the rules broken now and the nodes over capacity now (``committed``)."""
    if cons.problems:
        report.heading("Rule problems")
        for problem in cons.problems:
            report.wrapped(f"  {problem}", "yellow")
    breaks = rule_breaks(cluster)
    if breaks:
        report.heading("Rules broken now")
        for broken in breaks:
            text = broken.describe(cluster.guest_label)
            report.wrapped(f"  {text}", "red" if broken.hard else "yellow")
    over = cons.capacity.over(committed)
    if over.any():
        limit = cons.capacity.limit
        report.heading("Over capacity now")
        for n, d in zip(*np.nonzero(over), strict=True):
            dimension = cons.capacity.dimensions[d]
            report.wrapped(
                f"  {cluster.nodes[n].name}: {dimension} "
                f"{dimension.amount(committed[n, d])} > {dimension.amount(limit[n, d])}",
                "red",
            )


def show_stuck(report: Report, stuck: Sequence[tuple[str, str]]) -> None:
    """The guests a repair leaves breaking a hard constraint — those left on a node in
    maintenance among them —, one line each with why (nothing when there are none)."""
    if not stuck:
        return
    report.heading(f"Stuck: {len(stuck)} left breaking a hard constraint")
    for _guest, reason in stuck:
        report.wrapped(f"  {reason}", "red")


def show_by_arch(report: Report, title: str, by_arch: Mapping[str, Imbalance]) -> None:
    """One imbalance table per CPU architecture: guests cannot move between them, so each is
    balanced (and its spread judged) on its own."""
    for arch, imbalance in by_arch.items():
        report.heading(f"{title}: {arch} nodes (balanced on their own)")
        report.table(IMBALANCE_HEADERS, imbalance_rows(imbalance), right=range(1, 8))


def show_placement(
    report: Report, result: Placement, cluster: Cluster, *, verbose: bool = False
) -> None:
    """The nodes ranked for a guest, each with its loads after and the soft rules it would
    break there (what its penalty stands for); ``verbose``: the score, the balance σ and the
    penalty too. ``cluster`` holds the guest (a new one included)."""
    label = cluster.guest_label
    if result.purpose == "new":
        named = result.guest in cluster.guest_index and cluster.guest(result.guest).name
        who = f"a new guest, {cluster.guest(result.guest).name}" if named else "a new guest"
    elif len(result.members) == 1:
        who = f"guest {label(result.guest)}"
    else:
        partners = ", ".join(label(m) for m in result.members if m != result.guest)
        who = f"guest {label(result.guest)} (with {partners}, kept together)"
    report.wrapped(f"Placement of {who} ({result.purpose})", "bold")
    if result.blocked:
        report.wrapped(f"  cannot move: {result.blocked}", "red")
        return
    if not result.ranking:
        report.line("  no node can take it", "red")
    else:
        _ranking_table(report, result, cluster, verbose)
    if result.rejected:
        report.heading("Rejected")
        for nodes, reason in nodes_by_reason(result.rejected):
            report.wrapped(f"  {', '.join(nodes)}: {reason}")


def _ranking_table(report: Report, result: Placement, cluster: Cluster, verbose: bool) -> None:
    figures = ("score", "balance σ", "penalty") if verbose else ()
    rows = []
    for rank, s in enumerate(result.ranking, 1):
        rules = penalty_rules(cluster, result.members, s.node) if s.penalty > 0 else []
        engine = (f"{s.score:.4f}", f"{s.balance * 100:.2f} pp", f"{s.penalty:g}")
        rows.append(
            [
                str(rank),
                s.node + (" (current)" if s.current else ""),
                *(_pct(s.fractions[r]) for r in RESOURCES),
                *(engine if verbose else ()),
                ", ".join(rules) or ("a soft preference" if s.penalty > 0 else ""),
            ]
        )
    report.table(
        ("rank", "node", *(f"{r} after" for r in RESOURCES), *figures, "soft rules broken"),
        rows,
        right=range(2, 2 + len(RESOURCES) + len(figures)),
    )
    report.wrapped(
        "Ranked by how even the nodes' loads would be; each soft rule broken counts against "
        "a node.",
        "dim",
    )


def show_evacuation(report: Report, result: Evacuation, cluster: Cluster) -> None:
    report.wrapped(f"Evacuation of {result.node}: {len(result.moves)} moves", "bold")
    if result.moves:
        report.table(
            ("guest", "source", "target"),
            [[cluster.guest_label(m.guest), m.source, m.target] for m in result.moves],
        )
    for guest, reason in result.stuck:
        report.wrapped(f"  {cluster.guest_label(guest)} stays: {reason}", "red")


def show_proposal(
    report: Report,
    proposal: Proposal,
    by_arch: tuple[Mapping[str, Imbalance], Mapping[str, Imbalance]] = ({}, {}),
    *,
    cluster: Cluster,
    verbose: bool = False,
) -> None:
    """The strategy's moves in words and the imbalance before and after (``by_arch``: before
    and after per CPU architecture, where the nodes have several); ``verbose``: the engine's
    figures too — each move's metric and cost, the full imbalance tables."""
    net = proposal.net_moves()
    copied = sum(
        copied_bytes(cluster.guest(m.guest)) for m in net if m.guest in cluster.guest_index
    )
    report.wrapped(
        f"Proposal by {proposal.strategy}: {len(net)} migrations, "
        f"{format_bytes(copied)} to copy (memory and local disks)",
        "bold",
    )
    for i, (move, sentence) in enumerate(
        zip(proposal.moves, move_sentences(cluster, proposal.moves), strict=True), 1
    ):
        report.wrapped(f"{i:3}  {sentence}", hang=5)
        if verbose:
            report.wrapped(
                f"     {move.reason or '-'}: {move.metric} {move.before:.4g} → {move.after:.4g}, "
                f"cost {move.cost}",
                "dim",
            )
    report.wrapped(f"Stopped: {stop_sentence(proposal, cluster.guest_label)}")
    if verbose:
        report.wrapped(f"  (engine: {proposal.stopped}; cost {proposal.total_cost})", "dim")
    if verbose:
        _imbalance_tables(report, proposal, by_arch)
    elif by_arch[0]:
        for arch, before in by_arch[0].items():
            report.heading(f"Spread of the {arch} nodes' loads (balanced on their own)")
            _spread_table(report, before, by_arch[1][arch])
    else:
        report.heading("Spread of the nodes' loads (busiest less idlest, in percentage points)")
        _spread_table(report, proposal.before, proposal.after)
    for note in proposal.notes:
        report.wrapped(f"note: {note}", "yellow")


def _spread_table(report: Report, before: Imbalance, after: Imbalance) -> None:
    """Per resource: the spread and the busiest node's load, before and after."""
    rows = [
        [
            name,
            f"{m.spread * 100:.1f} pp",
            f"{after.resources[name].spread * 100:.1f} pp",
            _pct(m.max),
            _pct(after.resources[name].max),
        ]
        for name, m in before.resources.items()
    ]
    report.table(
        ("resource", "spread before", "after", "busiest before", "after"), rows, right=range(1, 5)
    )


def _imbalance_tables(
    report: Report,
    proposal: Proposal,
    by_arch: tuple[Mapping[str, Imbalance], Mapping[str, Imbalance]],
) -> None:
    """The engine's imbalance figures before and after, per architecture where there are
    several."""
    if by_arch[0]:
        show_by_arch(report, "Imbalance before", by_arch[0])
        show_by_arch(report, "Imbalance after", by_arch[1])
    else:
        report.heading("Imbalance before")
        report.table(IMBALANCE_HEADERS, imbalance_rows(proposal.before), right=range(1, 8))
        report.heading("Imbalance after")
        report.table(IMBALANCE_HEADERS, imbalance_rows(proposal.after), right=range(1, 8))


def show_plan(report: Report, plan: Plan, cluster: Cluster) -> None:
    """The ordered steps, guests by name; parking moves are marked."""
    report.heading(
        f"Plan: {len(plan.moves)} migrations in {plan.steps} steps"
        + ("" if plan.feasible else " (not everything can be reached safely)")
    )
    if plan.moves:
        rows = [
            [
                str(m.step),
                cluster.guest_label(m.guest),
                m.source,
                m.target,
                "parking" if m.parking else "",
            ]
            for m in plan.moves
        ]
        report.table(("step", "guest", "from", "to", ""), rows, right=(0,))
    for guest, target in plan.unreachable:
        report.wrapped(f"  {cluster.guest_label(guest)} cannot reach {target} safely", "red")
    for problem in plan.problems:
        report.wrapped(f"  {problem}", "yellow")


def show_plan_breaks(report: Report, before: Cluster, after: Cluster, kept: Rules) -> None:
    """The rules (``kept``: those the checks keep) broken before the plan, and those it leaves
    broken, each with its origin; nothing when none is broken before or after."""
    origins = {r.name: r.origin for r in (*kept.node_affinity, *kept.guest_affinity)}
    for title, cluster in (("before the plan", before), ("after the plan", after)):
        breaks = rule_breaks(cluster, kept)
        if breaks:
            report.heading(f"Rules broken {title}")
        for broken in breaks:
            origin = origins.get(broken.rule, "config")
            text = broken.describe(cluster.guest_label)
            report.wrapped(f"  {text}; origin {origin}", "red" if broken.hard else "yellow")


def show_bounds(
    report: Report, proposal: Proposal, bounds: LowerBounds, achieved: Mapping[str, float]
) -> None:
    """How far the result is from the best possible (``achieved``: the spread reached per
    resource, of the worst CPU architecture where there are several)."""
    report.heading("Against the lower bounds")
    migrations = len(proposal.net_moves())
    ratio = f"{migrations / bounds.migrations:.2f}×" if bounds.migrations else "-"
    rows = [
        [
            r,
            f"{achieved[r] * 100:.2f} pp",
            f"{bounds.spread[r] * 100:.2f} pp",
        ]
        for r in RESOURCES
    ]
    report.table(("resource", "spread reached", "no placement below"), rows, right=(1, 2))
    report.wrapped(
        f"migrations {migrations}; at least {bounds.migrations} are needed to reach this spread "
        f"(ratio {ratio}); at least {format_bytes(bounds.moved_bytes)} of memory must move"
    )
