"""The production-like clusters' table (``python -m bench``, generators of :mod:`bench.realistic`):
per cluster and runner the memory and vCPU spreads reached, the guests moved against the
memory-only lower bound and against the fewest moves the exact search (:mod:`bench.yardstick`)
finds for the same memory spread, and for the same memory and vCPU spreads, the migration cost,
the time and the peak memory.

Each column is one entry of :data:`COLUMNS` (a header and a function of the case and the row), so
a further figure is one more entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.metrics import Evaluation, Evaluator
from bench.report import Case, Row, _padded, ratio
from bench.twins import TwinFigures, twin_figures
from bench.yardstick import TIME_LIMITS, Yardstick, fewest_moves, warm_start, within
from opendrs.model.cluster import Cluster

MiB = 1024**2


@dataclass
class RealisticCase:
    """A realistic cluster's case, with the memory-only bounds and the yardstick's search."""

    case: Case
    seed: int
    #: Runner → the memory-only lower bound on the moves for the memory spread its row reached.
    memory_bound: dict[str, int] = field(default_factory=dict)
    #: The exact search for the default strategy's memory spread (None: not run).
    yardstick: Yardstick | None = None
    #: The runner whose spread the yardstick was given.
    reference: str = ""
    #: Why the yardstick did not run, when it did not.
    skipped: str = ""
    #: The search's placement measured as every row is (None: no search or no placement).
    search_evaluation: Evaluation | None = None
    #: The exact search for the default strategy's memory and vCPU spreads (None: not run).
    both: Yardstick | None = None
    #: Its placement measured as every row is (None: no search or no placement).
    both_evaluation: Evaluation | None = None
    #: Runner → its local-disk moves and those with a cheaper twin left behind (bench/twins.py).
    twins: dict[str, TwinFigures] = field(default_factory=dict)


def memory_bound(cluster: Cluster, spread: float) -> int | None:
    """The fewest moves any placement needs to bring the memory spread to ``spread``
    (:func:`opendrs.engine.bounds.lower_bounds`, memory alone), or None without bounds."""
    try:
        from opendrs.engine.bounds import lower_bounds
    except ImportError:
        return None
    return int(lower_bounds(cluster, {"memory": spread}, resources=("memory",)).migrations)


def measure(
    case: Case,
    cluster: Cluster,
    seed: int,
    reference: str,
    time_limit: float | None,
    *,
    search: bool = True,
) -> RealisticCase:
    """Bounds for every finished row, and with ``search`` the yardstick for ``reference``'s
    memory spread, then for its memory and vCPU spreads, when it ran and the size has a
    yardstick limit (capped by ``time_limit``), started from :func:`bench.yardstick.warm_start`
    (the second without a start unless that one is within both spreads)."""
    out = RealisticCase(case, seed, reference=reference)
    for row in case.rows:
        if row.ok and row.evaluation is not None:
            bound = memory_bound(cluster, row.evaluation.after.memory_spread)
            if bound is not None:
                out.memory_bound[row.runner] = bound
            out.twins[row.runner] = twin_figures(cluster, row.placement)
    ref = case.row(reference)
    if not search:
        out.skipped = "not asked for (--no-yardstick)"
    elif case.size not in TIME_LIMITS:
        out.skipped = f"the exact search runs up to L ({case.size} is beyond)"
    elif ref is None or ref.evaluation is None:
        out.skipped = f"no result of {reference} here (not run, or it failed)"
    else:
        limit = TIME_LIMITS[case.size]
        limit = limit if time_limit is None else min(limit, time_limit)
        _search(out, cluster, ref.evaluation, limit)
    return out


def _search(out: RealisticCase, cluster: Cluster, reached: Evaluation, limit: float) -> None:
    """The two exact searches for the spreads ``reached``: memory alone, memory and vCPUs."""
    spread, cpu = reached.after.memory_spread, reached.after.cpu_spread
    out.yardstick = fewest_moves(cluster, spread, limit, hint=warm_start(cluster, spread))
    if out.yardstick.moves is not None:
        out.search_evaluation = Evaluator(cluster).evaluate(out.yardstick.placement)
    start = warm_start(cluster, spread, cpu_spread=cpu)
    hint = start if within(cluster, start, spread, cpu) else None
    out.both = fewest_moves(cluster, spread, limit, hint=hint, cpu_spread=cpu)
    if out.both.moves is not None:
        out.both_evaluation = Evaluator(cluster).evaluate(out.both.placement)


def _moves(rc: RealisticCase, row: Row) -> str:
    return f"{row.evaluation.migrations:,}" if row.evaluation else "—"


def _bound(rc: RealisticCase, row: Row) -> str:
    bound = rc.memory_bound.get(row.runner)
    return "—" if bound is None else f"{bound:,}"


def _per_bound(rc: RealisticCase, row: Row) -> str:
    ev = row.evaluation
    return ratio(ev.migrations if ev else None, rc.memory_bound.get(row.runner))


def _twins(rc: RealisticCase, row: Row) -> str:
    twins = rc.twins.get(row.runner)
    return "—" if twins is None else f"{twins.with_twin:,} / {twins.local_disk_moves:,}"


def _best(rc: RealisticCase, row: Row, ys: Yardstick | None) -> str:
    return ys.summary if ys is not None and row.runner == rc.reference else ""


def _per_best(rc: RealisticCase, row: Row, ys: Yardstick | None) -> str:
    ev = row.evaluation
    if ys is None or row.runner != rc.reference or ys.moves is None or ev is None:
        return ""
    if ys.moves == 0:
        return "—" if ev.migrations else "1×"
    return ratio(ev.migrations, ys.moves)


Column = tuple[str, Callable[[RealisticCase, Row], str]]
#: The table's columns after the case's (generator, size, seed, rules) and the runner's name.
COLUMNS: tuple[Column, ...] = (
    ("mem spread before pp", lambda rc, row: f"{rc.case.before.memory_spread * 100:.2f}"),
    ("mem spread pp", lambda rc, row: f"{row.evaluation.after.memory_spread * 100:.2f}"),
    ("vCPU spread pp", lambda rc, row: f"{row.evaluation.after.cpu_spread * 100:.2f}"),
    ("moved", _moves),
    ("LB (mem only)", _bound),
    ("moved/LB", _per_bound),
    ("best found", lambda rc, row: _best(rc, row, rc.yardstick)),
    ("moved/best", lambda rc, row: _per_best(rc, row, rc.yardstick)),
    ("best found, memory and vCPUs", lambda rc, row: _best(rc, row, rc.both)),
    ("moved/best (both)", lambda rc, row: _per_best(rc, row, rc.both)),
    ("cost GiB", lambda rc, row: f"{row.evaluation.cost_gib:,.0f}"),
    ("disk moves with a twin", _twins),
    ("time s", lambda rc, row: f"{row.seconds:.3g}"),
    ("peak RSS MiB", lambda rc, row: f"{(row.rss_peak or 0) / MiB:,.0f}"),
    ("violations", lambda rc, row: str(len(row.evaluation.violations))),
)
LEAD = ("generator", "size", "seed", "rules", "runner")


def _lead(rc: RealisticCase) -> list[str]:
    case = rc.case
    return [case.generator, case.size, str(rc.seed), "with" if case.rules else "without"]


def rows(rc: RealisticCase) -> list[list[str]]:
    """The case's table rows, one per runner."""
    body = []
    for row in rc.case.rows:
        label = row.runner if row.kind == "strategy" else f"{row.runner} (peer)"
        if not row.ok or row.evaluation is None:
            failed = [*_lead(rc), label, f"**{row.error or 'failed'}**"]
            body.append(failed + [""] * (len(LEAD) + len(COLUMNS) - len(failed)))
            continue
        body.append([*_lead(rc), label] + [cell(rc, row) for _header, cell in COLUMNS])
    return body


def note_lines(cases: Sequence[RealisticCase]) -> list[str]:
    """Per case, the search's details; then the runners not run, each reason once."""
    lines = []
    skipped: dict[str, list[str]] = {}
    for rc in cases:
        title = f"{rc.case.generator} {rc.case.size} {'with' if rc.case.rules else 'without'} rules"
        if rc.yardstick is not None:
            lines.append(f"- {title}: {_search_note(rc, rc.yardstick, rc.search_evaluation)}")
        if rc.both is not None:
            lines.append(f"- {title}: {_search_note(rc, rc.both, rc.both_evaluation)}")
        elif rc.yardstick is None and rc.skipped:
            lines.append(f"- {title}: no exact search: {rc.skipped}")
        for reason in rc.case.skipped:
            skipped.setdefault(reason, []).append(title)
    for reason, titles in skipped.items():
        where = "every cluster" if len(titles) == len(cases) else ", ".join(titles)
        lines.append(f"- not run on {where}: {reason}")
    return lines


def _search_note(rc: RealisticCase, ys: Yardstick, found: Evaluation | None) -> str:
    """One search's target, answer, placement's spreads and effort."""
    target = f"≤ {ys.target_spread * 100:.2f} pp memory"
    reached = "" if found is None else f", its placement {found.after.memory_spread * 100:.2f} pp"
    if ys.cpu_spread is not None:
        target += f" and ≤ {ys.cpu_spread * 100:.2f} pp vCPUs"
        reached += "" if found is None else f" and {found.after.cpu_spread * 100:.2f} pp"
    reached += "" if found is None else f" with {len(found.violations)} violations"
    start = "from the warm start" if ys.hinted else "with no start (none within the targets)"
    return (
        f"exact search for {target} ({rc.reference}'s spreads), {start}: {ys.status}, best "
        f"{ys.summary}{reached}; {ys.free_guests:,} free guests in {ys.classes:,} classes; "
        f"{ys.seconds:.1f} s, {ys.deterministic:.1f} deterministic units"
    )


def section(cases: Sequence[RealisticCase], level: int = 3) -> str:
    """The realistic cases as one Markdown table with its notes."""
    if not cases:
        return ""
    header = [*LEAD, *(h for h, _cell in COLUMNS)]
    body = [line for rc in cases for line in rows(rc)]
    limits = ", ".join(f"{size} {limit:g} s" for size, limit in TIME_LIMITS.items())
    lines = [
        f"{'#' * level} Production-like clusters (bench/realistic.py): moves against the bound "
        "and the exact search",
        "",
        _padded(header, body, left=len(LEAD)),
        "",
        "- *LB (mem only)*: the fewest moves any placement needs for the row's memory spread "
        "(`opendrs.engine.bounds`, memory alone); *best found*: the fewest moves the exact search "
        "(bench/yardstick.py, CP-SAT, one worker, seed 1, time limit "
        f"{limits}) finds for the default strategy's memory spread, moving only guests in no "
        "rule and without a local disk, `(optimal)` when proven, else `(≥ its lower bound)`; "
        "*best found, memory and vCPUs*: the same search holding the default strategy's vCPU "
        "spread (configured vCPUs over cores) too; "
        "*cost*: moved memory + 4 × moved local disk; *disk moves with a twin*: of the moves "
        "of guests with a local disk, those where a guest alike without one stayed on the same "
        "node and could have gone instead (bench/twins.py); *time*, *peak RSS*: the runner's own "
        "process",
        *note_lines(cases),
        "",
    ]
    return "\n".join(lines)


__all__ = ["COLUMNS", "RealisticCase", "measure", "memory_bound", "rows", "section"]
