"""Human-readable reports: rich tables and colours on a terminal, plain aligned text otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opendrs.engine.bounds import LowerBounds
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.constraints import Constraints, platform_balancer
from opendrs.engine.imbalance import Imbalance
from opendrs.engine.placement import Evacuation, Placement
from opendrs.engine.planner import Plan
from opendrs.engine.strategies.base import Proposal, cluster_imbalance, imbalance_by_arch
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest, Node
from opendrs.model.rules import Rules
from opendrs.model.units import format_bytes

BAR_WIDTH = 20


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
        widths = [len(h) for h in headers]
        for row in plain:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def fmt(cells: Sequence[str]) -> str:
            out = []
            for i, cell in enumerate(cells):
                out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
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


_NODE_HEADERS = (
    "node",
    "state",
    "arch",
    "cores",
    "memory",
    "guests",
    "cpu",
    "memory",
    "vCPUs",
    "mem committed",
)
_GUEST_HEADERS = (
    "node",
    "id",
    "name",
    "kind",
    "state",
    "vCPUs",
    "memory",
    "cpu used",
    "mem used",
    "flags",
)


def show_cluster(report: Report, cluster: Cluster, *, guests: bool = True) -> None:
    """Nodes with load bars per resource, guests per node, and the imbalance figures."""
    settings = cluster.settings
    fractions = LoadModel.build(cluster).fractions()
    cons = Constraints.build(cluster)
    committed = cons.capacity.committed()
    report.line(
        f"Cluster {cluster.name}: {len(cluster.nodes)} nodes, {len(cluster.guests)} guests, "
        f"{settings.mode} mode",
        "bold",
    )
    balancer = platform_balancer(cluster)
    if balancer is not None:
        report.line(balancer, "yellow")
    report.heading(f"Nodes ({settings.mode} load as a share of capacity less reserves)")
    rows = _node_rows(cluster, fractions, committed, cons.capacity.limit)
    report.table(_NODE_HEADERS, rows, right=(3, 4, 5, 8, 9))
    by_arch = imbalance_by_arch(cluster)
    if by_arch:
        show_by_arch(report, "Imbalance", by_arch)
    else:
        report.heading("Imbalance (usable nodes)")
        report.table(
            IMBALANCE_HEADERS, imbalance_rows(cluster_imbalance(cluster)), right=range(1, 8)
        )
    if guests:
        report.heading("Guests")
        report.table(_GUEST_HEADERS, _guest_rows(cluster), right=(5, 6, 7, 8))
    _show_rules(report, cluster.rules)
    _show_problems(report, cluster, cons, committed)


def _show_rules(report: Report, rules: Rules) -> None:
    """Each node and guest rule: its name, what it does, its guests and its origin."""
    if not rules.node_affinity and not rules.guest_affinity:
        return
    report.heading("Rules")
    for node_rule in rules.node_affinity:
        strength = "strict" if node_rule.strict else "preferred"
        nodes = ", ".join(node_rule.nodes)
        report.line(
            f"  {node_rule.name}: {', '.join(node_rule.guests)} on {nodes} ({strength}), "
            f"origin {node_rule.origin}"
        )
    for guest_rule in rules.guest_affinity:
        kind = "together" if guest_rule.positive else "apart"
        strength = "hard" if guest_rule.hard else "soft"
        report.line(
            f"  {guest_rule.name}: {', '.join(guest_rule.guests)} kept {kind} ({strength}), "
            f"origin {guest_rule.origin}"
        )


def _node_rows(
    cluster: Cluster, fractions: np.ndarray, committed: np.ndarray, limit: np.ndarray
) -> list[list[str | Text]]:
    """A row per node: state, size, guests, load bars (``fractions``), capacity ``committed``
    against the ``limit``."""
    rows: list[list[str | Text]] = []
    for i, node in enumerate(cluster.nodes):
        on_node = cluster.guests_on(node.name)
        running = sum(1 for g in on_node if g.state != "stopped")
        rows.append(
            [
                node.name,
                node_state(node),
                node.arch,
                f"{node.cpu:g}",
                format_bytes(node.memory),
                f"{running}/{len(on_node)}",
                bar(fractions[i, 0]),
                bar(fractions[i, 1]),
                f"{committed[i, 0]:g}/{limit[i, 0]:g}",
                f"{format_bytes(committed[i, 1])}/{format_bytes(limit[i, 1])}",
            ]
        )
    return rows


def _guest_flags(cluster: Cluster, g: Guest) -> str:
    """What sets guest ``g`` apart: ``ha ignored lock:backup devices local-disk ->node``."""
    flags = []
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
    """A row per guest, node by node: its size, its use and its flags."""
    rows: list[list[str | Text]] = []
    for node in cluster.nodes:
        for g in cluster.guests_on(node.name):
            rows.append(
                [
                    node.name,
                    g.id,
                    g.name,
                    g.kind,
                    g.state,
                    f"{g.cpu:g}",
                    format_bytes(g.memory),
                    f"{g.cpu_load:.2f}",
                    format_bytes(g.memory_load),
                    _guest_flags(cluster, g),
                ]
            )
    return rows


def _show_problems(
    report: Report, cluster: Cluster, cons: Constraints, committed: np.ndarray
) -> None:
    """The rules dropped, the rules broken now and the nodes over capacity now (``committed``)."""
    if cons.problems:
        report.heading("Rule problems")
        for problem in cons.problems:
            report.line(f"  {problem}", "yellow")
    breaks = rule_breaks(cluster)
    if breaks:
        report.heading("Rules broken now")
        for broken in breaks:
            report.line(f"  {broken}", "red" if broken.hard else "yellow")
    over = cons.capacity.over(committed)
    if over.any():
        limit = cons.capacity.limit
        report.heading("Over capacity now")
        for n, d in zip(*np.nonzero(over), strict=True):
            report.line(
                f"  {cluster.nodes[n].name}: {cons.capacity.dimensions[d]} "
                f"{committed[n, d]:.4g} > {limit[n, d]:.4g}",
                "red",
            )


def show_stuck(report: Report, stuck: Sequence[tuple[str, str]]) -> None:
    """The guests a repair leaves breaking a hard constraint — those left on a node in
    maintenance among them —, one line each with why (nothing when there are none)."""
    if not stuck:
        return
    report.heading(f"Stuck: {len(stuck)} left breaking a hard constraint")
    for _guest, reason in stuck:
        report.line(f"  {reason}", "red")


def show_by_arch(report: Report, title: str, by_arch: Mapping[str, Imbalance]) -> None:
    """One imbalance table per CPU architecture: guests cannot move between them, so each is
    balanced (and its spread judged) on its own."""
    for arch, imbalance in by_arch.items():
        report.heading(f"{title}: {arch} nodes (balanced on their own)")
        report.table(IMBALANCE_HEADERS, imbalance_rows(imbalance), right=range(1, 8))


def show_placement(report: Report, result: Placement) -> None:
    if result.purpose == "new":
        who = "a new guest"
    elif len(result.members) == 1:
        who = f"guest {result.guest}"
    else:
        partners = ", ".join(m for m in result.members if m != result.guest)
        who = f"guest {result.guest} (with {partners}, kept together)"
    report.line(f"Placement of {who} ({result.purpose})", "bold")
    if result.blocked:
        report.line(f"  cannot move: {result.blocked}", "red")
        return
    if not result.ranking:
        report.line("  no node can take it", "red")
    else:
        rows = []
        for rank, s in enumerate(result.ranking, 1):
            rows.append(
                [
                    str(rank),
                    s.node + (" (current)" if s.current else ""),
                    f"{s.score:.4f}",
                    f"{s.balance * 100:.2f} pp",
                    f"{s.penalty:g}",
                    *(_pct(s.fractions[r]) for r in RESOURCES),
                ]
            )
        report.table(
            (
                "rank",
                "node",
                "score",
                "balance σ",
                "soft penalty",
                *(f"{r} after" for r in RESOURCES),
            ),
            rows,
            right=(0, 2, 3, 4, 5, 6),
        )
    if result.rejected:
        report.heading("Rejected")
        report.table(("node", "reason"), [[r.node, str(r)] for r in result.rejected])


def show_evacuation(report: Report, result: Evacuation) -> None:
    report.line(f"Evacuation of {result.node}: {len(result.moves)} moves", "bold")
    if result.moves:
        report.table(
            ("guest", "source", "target"),
            [[m.guest, m.source, m.target] for m in result.moves],
        )
    for guest, reason in result.stuck:
        report.line(f"  {guest} stays: {reason}", "red")


def show_proposal(
    report: Report,
    proposal: Proposal,
    by_arch: tuple[Mapping[str, Imbalance], Mapping[str, Imbalance]] = ({}, {}),
) -> None:
    """The strategy's moves and the imbalance before and after (``by_arch``: before and after
    per CPU architecture, where the nodes have several)."""
    report.line(
        f"Proposal by {proposal.strategy}: {len(proposal.moves)} migrations, "
        f"cost {proposal.total_cost}",
        "bold",
    )
    if proposal.moves:
        rows = [
            [str(i), m.guest, m.source, m.target, f"{m.cost}", m.reason]
            for i, m in enumerate(proposal.moves, 1)
        ]
        report.table(("#", "guest", "from", "to", "cost", "why"), rows, right=(0, 4))
    report.line(f"Stopped: {proposal.stopped}")
    if by_arch[0]:
        show_by_arch(report, "Imbalance before", by_arch[0])
        show_by_arch(report, "Imbalance after", by_arch[1])
    else:
        report.heading("Imbalance before")
        report.table(IMBALANCE_HEADERS, imbalance_rows(proposal.before), right=range(1, 8))
        report.heading("Imbalance after")
        report.table(IMBALANCE_HEADERS, imbalance_rows(proposal.after), right=range(1, 8))
    for note in proposal.notes:
        report.line(f"note: {note}", "yellow")


def show_plan(report: Report, plan: Plan) -> None:
    """The ordered steps; parking moves are marked."""
    report.heading(
        f"Plan: {len(plan.moves)} migrations in {plan.steps} steps"
        + ("" if plan.feasible else " (not everything can be reached safely)")
    )
    if plan.moves:
        rows = [
            [str(m.step), m.guest, m.source, m.target, "parking" if m.parking else ""]
            for m in plan.moves
        ]
        report.table(("step", "guest", "from", "to", ""), rows, right=(0,))
    for guest, target in plan.unreachable:
        report.line(f"  {guest} cannot reach {target} safely", "red")
    for problem in plan.problems:
        report.line(f"  {problem}", "yellow")


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
            report.line(f"  {broken}; origin {origin}", "red" if broken.hard else "yellow")


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
    report.line(
        f"migrations {migrations}; at least {bounds.migrations} are needed to reach this spread "
        f"(ratio {ratio}); at least {format_bytes(bounds.moved_bytes)} of memory must move"
    )
