"""The failover headroom (:mod:`opendrs.engine.headroom`) in the operator's words: a line per
failure case, and ``opendrs headroom``'s text (the one-line summary status, the dashboard and
the report show is :meth:`~opendrs.engine.headroom.Headroom.summary`)."""

from __future__ import annotations

from collections.abc import Sequence

from opendrs.engine.headroom import FailureCase, Headroom, guests_phrase, nodes_phrase
from opendrs.model.cluster import Cluster
from opendrs.report.text import wrap

__all__ = ["case_line", "headroom_lines"]

#: Guests named in one line before "and N more".
NAMED = 5


def _labels(cluster: Cluster, guest_ids: Sequence[str]) -> str:
    index = cluster.guest_index
    names = [cluster.guests[index[g]].label if g in index else g for g in guest_ids]
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def case_line(cluster: Cluster, case: FailureCase) -> str:
    """``if pve3 fails: all 41 HA guests restart (worst survivor pve1 at 87 % memory)``, or the
    guests that cannot restart."""
    verb = "fails" if len(case.failed) == 1 else "fail"
    head = f"if {nodes_phrase(case.failed)} {verb}: "
    if case.ha_guests == 0:
        return head + "no HA guest runs there"
    if case.stranded:
        count = len(case.stranded)
        which = _labels(cluster, [g for g, _why in case.stranded])
        return head + f"{guests_phrase(count)} of {case.ha_guests} cannot restart: {which}"
    worst = (
        f" (worst survivor {case.worst_node} at {100 * case.worst_memory:.0f} % memory)"
        if case.worst_node is not None
        else ""
    )
    if case.ha_guests == 1:
        return head + f"the HA guest restarts{worst}"
    return head + f"all {case.ha_guests} HA guests restart{worst}"


def headroom_lines(
    cluster: Cluster, headroom: Headroom, *, width: int, reasons: bool = True
) -> list[str]:
    """``opendrs headroom``'s text, wrapped at ``width`` columns: a summary, notes, a line per
    case (with each stranded guest's reason when ``reasons``)."""
    lines = [f"{cluster.name}: {headroom.summary()}"]
    if headroom.assumed:
        lines.append("  note: no guest is HA-managed: every running guest is counted as one")
    if not headroom.exhaustive:
        lines.append(
            f"  note: {len(headroom.cases)} cases checked, the failed nodes' HA memory heaviest "
            "first (not every combination)"
        )
    index = cluster.guest_index
    for case in headroom.cases:
        lines.extend(wrap(f"  {case_line(cluster, case)}", width))
        if reasons:
            for guest, why in case.stranded:
                label = cluster.guests[index[guest]].label if guest in index else guest
                lines.extend(wrap(f"    {label}: {why}", width))
    return lines
