"""The failover headroom (:mod:`opendrs.engine.headroom`) in the operator's words: a line per
failure case, and a one-line summary for status, the dashboard and the report."""

from __future__ import annotations

from collections.abc import Sequence

from opendrs.engine.headroom import FailureCase, Headroom
from opendrs.model.cluster import Cluster

__all__ = ["case_line", "headroom_lines", "summary_line"]

#: Guests named in one line before "and N more".
NAMED = 5


def _labels(cluster: Cluster, guest_ids: Sequence[str]) -> str:
    index = cluster.guest_index
    names = [cluster.guests[index[g]].label if g in index else g for g in guest_ids]
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def _nodes(failed: Sequence[str]) -> str:
    return failed[0] if len(failed) == 1 else " and ".join((", ".join(failed[:-1]), failed[-1]))


def _guests(count: int) -> str:
    return f"{count} HA guest{'' if count == 1 else 's'}"


def case_line(cluster: Cluster, case: FailureCase) -> str:
    """``if pve3 fails: all 41 HA guests restart (worst survivor pve1 at 87 % memory)``, or the
    guests that cannot restart."""
    verb = "fails" if len(case.failed) == 1 else "fail"
    head = f"if {_nodes(case.failed)} {verb}: "
    if case.ha_guests == 0:
        return head + "no HA guest runs there"
    if case.stranded:
        count = len(case.stranded)
        which = _labels(cluster, [g for g, _why in case.stranded])
        return head + f"{_guests(count)} of {case.ha_guests} cannot restart: {which}"
    worst = (
        f" (worst survivor {case.worst_node} at {100 * case.worst_memory:.0f} % memory)"
        if case.worst_node is not None
        else ""
    )
    if case.ha_guests == 1:
        return head + f"the HA guest restarts{worst}"
    return head + f"all {case.ha_guests} HA guests restart{worst}"


def summary_line(headroom: Headroom) -> str:
    """``failover headroom: yes, for 1 node failing`` or ``no: 3 HA guests cannot restart …``."""
    nodes = f"{headroom.failures} node{'' if headroom.failures == 1 else 's'} failing"
    if headroom.ok:
        return f"failover headroom: yes, for any {nodes} ({_guests(headroom.ha_total)})"
    worst = max(headroom.cases, key=lambda c: len(c.stranded))
    return (
        f"failover headroom: no, {_guests(headroom.unrestartable)} cannot restart when "
        f"{_nodes(worst.failed)} {'fails' if len(worst.failed) == 1 else 'fail'}"
    )


def headroom_lines(cluster: Cluster, headroom: Headroom, *, reasons: bool = True) -> list[str]:
    """``opendrs headroom``'s text: a summary, notes, a line per case (with each stranded
    guest's reason when ``reasons``)."""
    lines = [f"{cluster.name}: {summary_line(headroom)}"]
    if headroom.assumed:
        lines.append("  note: no guest is HA-managed: every running guest is counted as one")
    if not headroom.exhaustive:
        lines.append(
            f"  note: {len(headroom.cases)} cases checked, the failed nodes' HA memory heaviest "
            "first (not every combination)"
        )
    index = cluster.guest_index
    for case in headroom.cases:
        lines.append(f"  {case_line(cluster, case)}")
        if reasons:
            for guest, why in case.stranded:
                label = cluster.guests[index[guest]].label if guest in index else guest
                lines.append(f"    {label}: {why}")
    return lines
