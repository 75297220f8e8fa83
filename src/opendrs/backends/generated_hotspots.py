"""The hot spots of a generated month (:mod:`opendrs.backends.generated`).

A *job* is a few guests of one node that no scheduler moves: a batch job's workers pinned to
their node as HA resources set to ``ignored`` are — no balancer moves them, and the HA manager
does not restart them elsewhere when their node fails (they wait for it to come back) —, so that
they load that node together whatever a policy does. Its guests follow their kind's pattern plus
:class:`~opendrs.backends.workload.Surge` s, each in proportion to its unused vCPUs, that would
raise a node at the cluster's mean CPU load at the start to its full CPU net of reserves — with
the mean of the workloads lower than the snapshot's, in practice 85–100 %: hot — the job's own
guests using at most 80 % of it (moving the others off relieves the node):

* a **lasting** hot spot: one job's usage rises over 30–90 minutes, stays up 2–8 hours, and falls
  back as slowly. Moving guests off its node relieves it for good;
* an **alternating** one: two jobs on two nodes take turns, an hour busy and an hour idle each,
  for 6–12 hours. Each node runs hot in its turn, but the average over the turns is steady:
  relieving one turn onto the other node only moves the heat to the next turn.

Everything comes from ``rng``: the same seed and size give the same jobs and surges.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from opendrs.backends.workload import Pattern, Selector, Surge, Workload
from opendrs.model.cluster import Cluster, Guest, Node

__all__ = ["Job", "hot_spot_jobs", "job_workloads", "pinned"]

HOUR: Final = 3600.0
DAY: Final = 86_400.0
#: The share of a node's CPU (net of reserves) a surge raises it to, from the mean load, and the
#: most of it the job's own guests may use then.
_PEAK: Final = 1.0
_JOB_PEAK: Final = 0.8
#: The most guests in a job.
_JOB_SIZE: Final = 12
#: A turn of an alternating hot spot, and how fast each turn rises and falls.
_TURN: Final = HOUR
_TURN_RISE: Final = 300.0


@dataclass(frozen=True)
class Job:
    """Guests of one node pinned there, how high each one's CPU use surges (a share of its
    vCPUs), and when: ``times``, each ``(at, last, rise)`` of :class:`Surge`."""

    name: str
    node: str
    heights: tuple[tuple[str, float], ...]
    times: tuple[tuple[float, float, float], ...] = ()

    @property
    def guests(self) -> tuple[str, ...]:
        return tuple(g for g, _ in self.heights)

    def surges(self, guest: str) -> tuple[Surge, ...]:
        """The surges of one of its guests."""
        height = dict(self.heights)[guest]
        return tuple(Surge(at, height, last, rise) for at, last, rise in self.times)

    def ignore_reasons(self) -> dict[str, str]:
        """Why each of its guests is ignored."""
        return {g: f"HA resource ignored: pinned to {self.node} ({self.name})" for g in self.guests}


def hot_spot_jobs(
    rng: np.random.Generator, cluster: Cluster, lasting: int, alternating: int, days: int
) -> tuple[Job, ...]:
    """``lasting`` lasting hot spots and ``alternating`` alternating ones (two jobs each) over
    days 1 to ``days − 2``, each job on its own node while there are nodes enough."""
    order = [cluster.nodes[int(i)].name for i in rng.permutation(len(cluster.nodes))]
    taken: set[str] = set()
    jobs: list[Job] = []
    for k in range(lasting):
        at = _minute(float(rng.uniform(1, days - 2)) * DAY)
        rise = float(rng.choice((1800, 3600, 5400)))
        last = float(rng.integers(2, 9)) * HOUR
        job = _job(cluster, order[k % len(order)], f"job-lasting-{k + 1}", taken)
        if job is not None:
            jobs.append(replace(job, times=((at, last, rise),)))
    for k in range(alternating):
        at = _minute(float(rng.uniform(1, days - 2)) * DAY)
        turns = int(rng.integers(6, 13))
        for side in (0, 1):
            node = order[(lasting + 2 * k + side) % len(order)]
            job = _job(cluster, node, f"job-alternating-{k + 1}{'ab'[side]}", taken)
            if job is None:
                continue
            busy = _TURN - 2 * _TURN_RISE
            times = tuple((at + t * _TURN, busy, _TURN_RISE) for t in range(side, turns, 2))
            jobs.append(replace(job, times=times))
    return tuple(jobs)


def _job(cluster: Cluster, node: str, name: str, taken: set[str]) -> Job | None:
    """The fewest guests of ``node`` (those with the most unused vCPUs first, no database and none
    of another job) whose surge takes the node from the cluster's mean CPU load at the start —
    where balancing brings it — to :data:`_PEAK`, the job itself using at most :data:`_JOB_PEAK`
    of it, each guest surging in proportion to its unused vCPUs (untimed: the caller times it);
    None when the node has no such guest."""
    n = cluster.nodes[cluster.node_index[node]]
    free = [g for g in cluster.guests if g.node == node]
    free = [g for g in free if "db" not in g.tags and g.id not in taken]
    free.sort(key=lambda g: (-_headroom(g), g.id))
    net = _net_cpu(cluster, n)
    extra = (_PEAK - _mean_cpu_load(cluster)) * net
    chosen: list[Guest] = []
    for guest in free[:_JOB_SIZE]:
        chosen.append(guest)
        if sum(_headroom(g) for g in chosen) >= extra:
            break
    # The job alone stays under the hot level: moving the other guests off relieves the node.
    extra = min(extra, _JOB_PEAK * net - sum(g.cpu_used or 0.0 for g in chosen))
    room = sum(_headroom(g) for g in chosen)
    if not chosen or extra <= 0 or room <= 0:
        return None
    share = min(1.0, extra / room)
    taken.update(g.id for g in chosen)
    chosen.sort(key=lambda g: int(g.id))
    return Job(name, node, tuple((g.id, round(share * _room(g), 3)) for g in chosen))


def _net_cpu(cluster: Cluster, node: Node) -> float:
    reserve = cluster.settings.reserve_cpu if node.reserve_cpu is None else node.reserve_cpu
    return node.cpu - reserve


def _mean_cpu_load(cluster: Cluster) -> float:
    """The cluster's CPU use at the start (guests' and nodes' own) over its CPU net of reserves."""
    used = sum(g.cpu_used or 0.0 for g in cluster.guests)
    used += sum(n.base_cpu or 0.0 for n in cluster.nodes)
    return used / sum(_net_cpu(cluster, n) for n in cluster.nodes)


def _room(guest: Guest) -> float:
    """The share of its vCPUs a guest does not use at the start."""
    return max(0.0, 1.0 - (guest.cpu_used or 0.0) / guest.cpu) if guest.cpu > 0 else 0.0


def _headroom(guest: Guest) -> float:
    """The cores a guest does not use at the start."""
    return _room(guest) * guest.cpu


def job_workloads(
    cluster: Cluster, jobs: tuple[Job, ...], workloads: tuple[Workload, ...]
) -> tuple[Workload, ...]:
    """A workload per guest of a job — the pattern of the first of ``workloads`` that selects it,
    with the job's surges on its CPU —, then ``workloads``."""
    out: list[Workload] = []
    for job in jobs:
        for guest_id in job.guests:
            guest = cluster.guests[cluster.guest_index[guest_id]]
            own = next((w for w in workloads if w.selector.matches(guest)), None)
            cpu = Pattern() if own is None or own.cpu is None else own.cpu
            memory = None if own is None else own.memory
            selector = Selector(guests=(guest_id,))
            out.append(Workload(selector, replace(cpu, surges=job.surges(guest_id)), memory))
    return (*out, *workloads)


def pinned(cluster: Cluster, jobs: tuple[Job, ...]) -> Cluster:
    """``cluster`` with the guests of ``jobs`` pinned to their node as HA resources set to
    ``ignored`` are, read as opendrs's Proxmox backend reads them: not HA-managed (the HA manager
    neither moves nor restarts them) and ignored, with the reason."""
    reasons = {g: why for job in jobs for g, why in job.ignore_reasons().items()}
    rules = replace(
        cluster.rules,
        ignored=cluster.rules.ignored | frozenset(reasons),
        ignore_reasons={**cluster.rules.ignore_reasons, **reasons},
    )
    guests = tuple(
        replace(g, ha=False, ha_state=None) if g.id in reasons else g for g in cluster.guests
    )
    return replace(cluster, guests=guests, rules=rules)


def _minute(seconds: float) -> float:
    return float(round(seconds / 60) * 60)
