"""Workload patterns of the simulator: how busy each guest is at every step, vectorised.

A guest's use of a resource (CPU or memory) is a *fraction* of its configured size (vCPUs,
configured memory), built from components (see ``docs/scenarios.md``)::

    fraction = clip((base + diurnal + spikes) × weekly + surges + noise, 0, 1)

where ``base`` is a constant, a mean-reverting random walk or a ramp (by default the snapshot's
measured use), ``diurnal`` a daily cosine, ``spikes`` random bursts, ``weekly`` a weekday/weekend
factor, ``surges`` rises at given times (up, held, back down) and ``noise`` Gaussian noise drawn
anew every step. A CSV trace of measured use overrides
the pattern of the guests it lists, from their first sample on.

:class:`UsageGenerator` evaluates all guests at once, one block of steps at a time. Everything
random comes from one :class:`numpy.random.Generator` per guest, seeded from the scenario seed and
the guest id (one per random component), so adding or removing a guest does not change what any
other guest does, and a shorter run is a prefix of a longer one.

Simulated time ``0`` is a Monday, 00:00.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from opendrs.model.cluster import Guest

__all__ = [
    "Diurnal",
    "Pattern",
    "Ramp",
    "Selector",
    "Spikes",
    "Surge",
    "Trace",
    "TraceSeries",
    "UsageGenerator",
    "Walk",
    "Weekly",
    "Workload",
    "measured_fraction",
]

DAY = 86400.0
WEEK_DAYS = 7
#: Weekday index (0 = Monday) from which a day counts as weekend.
WEEKEND_FROM = 5


# --------------------------------------------------------------------------------------------
# Specifications (what a scenario file says)


@dataclass(frozen=True, slots=True)
class Diurnal:
    """A daily cosine: ``+amplitude`` at ``peak`` o'clock, ``−amplitude`` twelve hours later."""

    amplitude: float
    peak: float = 14.0


@dataclass(frozen=True, slots=True)
class Weekly:
    """Factors for Monday–Friday and for Saturday–Sunday."""

    weekday: float = 1.0
    weekend: float = 1.0


@dataclass(frozen=True, slots=True)
class Spikes:
    """Bursts of ``height`` lasting ``duration`` seconds, starting at random, ``rate`` per day."""

    rate: float
    height: float
    duration: float = 600.0


@dataclass(frozen=True, slots=True)
class Surge:
    """A rise of ``height`` at a given time: from ``at``, up linearly over ``rise`` seconds, held
    for ``last`` seconds, and back down over ``rise`` (0: at once)."""

    at: float
    height: float
    last: float
    rise: float = 0.0

    @property
    def end(self) -> float:
        """When it is back down."""
        return self.at + 2 * self.rise + self.last

    def level(self, times: np.ndarray) -> np.ndarray:
        """The height it adds at each of ``times`` (seconds)."""
        top = self.at + self.rise + self.last
        if self.rise <= 0:
            return np.where((times >= self.at) & (times < top), self.height, 0.0)
        up = np.clip((times - self.at) / self.rise, 0.0, 1.0)
        down = np.clip(1.0 - (times - top) / self.rise, 0.0, 1.0)
        return self.height * np.minimum(up, down)


@dataclass(frozen=True, slots=True)
class Walk:
    """A mean-reverting random walk, kept within ``[low, high]``.

    Each step adds ``volatility × √(step / 1h)`` times a standard normal draw and pulls the value
    towards ``mean`` so that a deviation halves every ``half_life`` seconds. It starts at
    ``mean`` (``None``: the snapshot's measured fraction).
    """

    mean: float | None = None
    volatility: float = 0.05
    half_life: float = 6 * 3600.0
    low: float = 0.0
    high: float = 1.0


@dataclass(frozen=True, slots=True)
class Ramp:
    """From ``start`` (``None``: the snapshot's measured fraction) to ``to``, linearly over
    ``over`` seconds beginning at ``begin``; flat before and after."""

    to: float
    over: float
    start: float | None = None
    begin: float = 0.0


@dataclass(frozen=True, slots=True)
class Pattern:
    """The workload of one resource of a guest. At most one of ``constant``, ``walk``, ``ramp``
    gives the base; without any of them the base is the snapshot's measured fraction."""

    constant: float | None = None
    walk: Walk | None = None
    ramp: Ramp | None = None
    diurnal: Diurnal | None = None
    weekly: Weekly | None = None
    spikes: Spikes | None = None
    noise: float = 0.0
    surges: tuple[Surge, ...] = ()

    @property
    def random(self) -> bool:
        return self.walk is not None or self.spikes is not None or self.noise > 0


@dataclass(frozen=True, slots=True)
class Selector:
    """Which guests a workload applies to: an id list, a glob on id or name, or a tag.

    Nothing given: every guest.
    """

    guests: tuple[str, ...] = ()
    match: str | None = None
    tag: str | None = None

    def matches(self, guest: Guest) -> bool:
        if self.guests:
            return guest.id in self.guests
        if self.match is not None:
            return fnmatch.fnmatchcase(guest.id, self.match) or (
                bool(guest.name) and fnmatch.fnmatchcase(guest.name, self.match)
            )
        if self.tag is not None:
            return self.tag in guest.tags
        return True


@dataclass(frozen=True, slots=True)
class Workload:
    """A selector and the patterns of the guests it selects (``None``: the default)."""

    selector: Selector
    cpu: Pattern | None = None
    memory: Pattern | None = None


@dataclass(frozen=True, slots=True)
class TraceSeries:
    """Measured use of one guest: at ``times[i]`` seconds, ``cpu[i]`` cores, ``memory[i]`` bytes."""

    guest: str
    times: tuple[float, ...]
    cpu: tuple[float, ...]
    memory: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    """A CSV trace: one series per guest it lists."""

    file: str
    series: tuple[TraceSeries, ...]

    def guests(self) -> frozenset[str]:
        return frozenset(s.guest for s in self.series)


def measured_fraction(guest: Guest) -> tuple[float, float]:
    """The snapshot's measured use as fractions of the configured size (1 where not measured)."""
    cpu = 1.0 if guest.cpu_used is None or guest.cpu <= 0 else guest.cpu_used / guest.cpu
    memory = (
        1.0 if guest.memory_used is None or guest.memory <= 0 else guest.memory_used / guest.memory
    )
    return min(max(cpu, 0.0), 1.0), min(max(memory, 0.0), 1.0)


# --------------------------------------------------------------------------------------------
# Evaluation


def guest_seed_key(guest_id: str) -> int:
    """A stable 64-bit number for a guest id (the spawn key of its random stream)."""
    return int.from_bytes(hashlib.sha256(guest_id.encode("utf-8")).digest()[:8], "big")


class _Resource:
    """Parameters of one resource (cpu or memory) for all guests, as arrays."""

    def __init__(
        self,
        patterns: Sequence[Pattern | None],
        default: np.ndarray,
        size: np.ndarray,
        step: float,
        integral: bool,
    ) -> None:
        n = len(patterns)
        self.size = size
        self.integral = integral
        self.constant = default.copy()
        amplitude = np.zeros(n)
        peak = np.zeros(n)
        weekday = np.ones(n)
        weekend = np.ones(n)
        self.noise = np.zeros(n)
        walk: list[tuple[int, Walk, float]] = []
        ramp: list[tuple[int, Ramp, float]] = []
        spikes: list[tuple[int, Spikes]] = []
        #: Each surge with the row of its guest.
        self.surges: list[tuple[int, Surge]] = []
        for g, pattern in enumerate(patterns):
            if pattern is None:
                continue
            if pattern.constant is not None:
                self.constant[g] = pattern.constant
            if pattern.walk is not None:
                walk.append((g, pattern.walk, float(default[g])))
            if pattern.ramp is not None:
                ramp.append((g, pattern.ramp, float(default[g])))
            if pattern.diurnal is not None:
                amplitude[g] = pattern.diurnal.amplitude
                peak[g] = pattern.diurnal.peak
            if pattern.weekly is not None:
                weekday[g] = pattern.weekly.weekday
                weekend[g] = pattern.weekly.weekend
            if pattern.spikes is not None:
                spikes.append((g, pattern.spikes))
            self.surges.extend((g, surge) for surge in pattern.surges)
            self.noise[g] = pattern.noise
        # Diurnal: a·cos(ω(h − p)) = a·cos(ωp)·cos(ωh) + a·sin(ωp)·sin(ωh).
        self.diurnal_rows = np.nonzero(amplitude)[0]
        angle = (2.0 * math.pi / 24.0) * peak[self.diurnal_rows]
        self.diurnal_cos = amplitude[self.diurnal_rows] * np.cos(angle)
        self.diurnal_sin = amplitude[self.diurnal_rows] * np.sin(angle)
        self.weekly_rows = np.nonzero((weekday != 1.0) | (weekend != 1.0))[0]
        self.weekday = weekday[self.weekly_rows]
        self.weekend = weekend[self.weekly_rows]
        # Random walks: x ← clip(keep·x + pull·mean + scale·z, low, high).
        self.walk_rows = np.array([g for g, _, _ in walk], dtype=np.intp)
        mean = np.array([w.mean if w.mean is not None else d for _, w, d in walk])
        pull = np.array([-math.expm1(-math.log(2.0) * step / w.half_life) for _, w, _ in walk])
        self.walk_keep = 1.0 - pull
        self.walk_drift = pull * mean
        self.walk_scale = np.array([w.volatility * math.sqrt(step / 3600.0) for _, w, _ in walk])
        self.walk_low = np.array([w.low for _, w, _ in walk])
        self.walk_high = np.array([w.high for _, w, _ in walk])
        self.walk_state = np.clip(mean, self.walk_low, self.walk_high)
        # Ramps.
        self.ramp_rows = np.array([g for g, _, _ in ramp], dtype=np.intp)
        self.ramp_from = np.array([r.start if r.start is not None else d for _, r, d in ramp])
        self.ramp_to = np.array([r.to for _, r, _ in ramp])
        self.ramp_begin = np.array([r.begin for _, r, _ in ramp])
        self.ramp_over = np.array([r.over for _, r, _ in ramp])
        # Spikes: a spike starts at a step with probability p (a normal draw above the matching
        # quantile) and lasts ``steps`` steps; overlapping spikes do not add up.
        self.spike_rows = np.array([g for g, _ in spikes], dtype=np.intp)
        self.spike_threshold = np.array(
            [_upper_quantile(-math.expm1(-s.rate * step / DAY)) for _, s in spikes]
        )
        self.spike_height = np.array([s.height for _, s in spikes])
        self.spike_steps = np.array(
            [max(1, round(s.duration / step)) for _, s in spikes], dtype=np.intp
        )
        longest = int(self.spike_steps.max()) if spikes else 0
        #: Spike starts of the last ``longest`` steps, carried into the next block.
        self.spike_tail = np.zeros((len(spikes), longest), dtype=np.int64)
        self.noise_rows = np.nonzero(self.noise > 0)[0]
        #: Standard normal draws of the current block: one row per walk, per spike row, and per
        #: guest for the noise (zero for guests without noise), float32 for speed.
        self.walk_z = np.zeros((0, 0), dtype=np.float32)
        self.spike_z = np.zeros((0, 0), dtype=np.float32)
        self.noise_z = np.zeros((0, 0), dtype=np.float32)

    def allocate(self, size: int) -> None:
        n = len(self.size)
        self.walk_z = np.zeros((len(self.walk_rows), size), dtype=np.float32)
        self.spike_z = np.zeros((len(self.spike_rows), size), dtype=np.float32)
        self.noise_z = np.zeros((n if self.noise_rows.size else 0, size), dtype=np.float32)


def _upper_quantile(p: float) -> float:
    """``z`` such that a standard normal draw exceeds it with probability ``p``."""
    if p >= 1.0:
        return -math.inf
    if p <= 0.0:
        return math.inf
    return NormalDist().inv_cdf(1.0 - p)


class UsageGenerator:
    """Usage of every guest at every step, in blocks of ``block`` steps.

    :meth:`block` returns ``(cpu, memory)``, each shaped ``(guests, block)``: CPU in cores and
    memory in whole bytes (as float64), for steps ``index·block … (index+1)·block − 1``. Blocks
    must be asked for in order (the current block may be asked for again); random walks and
    spikes carry over from one block to the next.
    """

    def __init__(
        self,
        guests: Sequence[Guest],
        patterns: Sequence[tuple[Pattern | None, Pattern | None]],
        *,
        seed: int,
        step: float,
        block: int,
        trace: Trace | None = None,
    ) -> None:
        if len(patterns) != len(guests):
            raise ValueError("one (cpu, memory) pattern pair per guest")
        if step <= 0 or block <= 0:
            raise ValueError("step and block must be positive")
        self.step = float(step)
        self.size = int(block)
        n = len(guests)
        measured = np.array([measured_fraction(g) for g in guests], dtype=np.float64).reshape(n, 2)
        vcpus = np.array([float(g.cpu) for g in guests])
        memory = np.array([float(g.memory) for g in guests])
        self.cpu = _Resource([p[0] for p in patterns], measured[:, 0], vcpus, self.step, False)
        self.memory = _Resource([p[1] for p in patterns], measured[:, 1], memory, self.step, True)
        self._n = n
        # One random stream per guest and random component, seeded from the scenario seed, the
        # guest id and the component: one standard normal per step, whatever the block size.
        self._streams: list[tuple[np.random.Generator, np.ndarray]] = []
        for code, res in enumerate((self.cpu, self.memory)):
            res.allocate(self.size)
            for part, (rows, matrix, by_guest) in enumerate(
                (
                    (res.walk_rows, res.walk_z, False),
                    (res.noise_rows, res.noise_z, True),
                    (res.spike_rows, res.spike_z, False),
                )
            ):
                for position, g in enumerate(rows.tolist()):
                    key = (1, guest_seed_key(guests[g].id), code, part)
                    sequence = np.random.SeedSequence(seed, spawn_key=key)
                    rng = np.random.Generator(np.random.PCG64(sequence))
                    self._streams.append((rng, matrix[g if by_guest else position]))
        # Trace: guest row → (times, cpu cores, memory bytes), clipped to the configured size.
        self._trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        if trace is not None:
            index = {g.id: i for i, g in enumerate(guests)}
            for series in trace.series:
                g = index.get(series.guest)
                if g is None:
                    continue
                self._trace.append(
                    (
                        g,
                        np.asarray(series.times, dtype=np.float64),
                        np.clip(np.asarray(series.cpu, dtype=np.float64), 0.0, vcpus[g]),
                        np.rint(
                            np.clip(np.asarray(series.memory, dtype=np.float64), 0.0, memory[g])
                        ),
                    )
                )
        self._index = -1
        self._current: tuple[np.ndarray, np.ndarray] = (np.zeros((n, 0)), np.zeros((n, 0)))

    @property
    def guests(self) -> int:
        return self._n

    @property
    def index(self) -> int:
        """The block generated last (``-1``: none yet)."""
        return self._index

    def block(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Usage for block ``index`` (the current one or the next)."""
        if index == self._index:
            return self._current
        if index != self._index + 1:
            raise ValueError(
                f"blocks are generated in order: asked for {index} after {self._index}"
            )
        self._index = index
        self._current = self._generate(index)
        return self._current

    # -- internals ------------------------------------------------------------------------------

    def _generate(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        size = self.size
        times = (index * size + np.arange(size, dtype=np.float64)) * self.step
        for rng, row in self._streams:
            rng.standard_normal(dtype=np.float32, out=row)
        omega = 2.0 * math.pi / 24.0
        hours = np.mod(times / 3600.0, 24.0)
        daily = (np.cos(omega * hours), np.sin(omega * hours))
        weekend = np.mod(np.floor(times / DAY), WEEK_DAYS) >= WEEKEND_FROM
        cpu = self._evaluate(self.cpu, times, daily, weekend)
        memory = self._evaluate(self.memory, times, daily, weekend)
        for g, t, c, m in self._trace:
            at = np.searchsorted(t, times, side="right") - 1
            seen = at >= 0
            if seen.any():
                cpu[g, seen] = c[at[seen]]
                memory[g, seen] = m[at[seen]]
        return cpu, memory

    def _evaluate(
        self,
        res: _Resource,
        times: np.ndarray,
        daily: tuple[np.ndarray, np.ndarray],
        weekend: np.ndarray,
    ) -> np.ndarray:
        size = self.size
        value = np.repeat(res.constant[:, None], size, axis=1)
        if res.ramp_rows.size:
            progress = np.clip(
                (times[None, :] - res.ramp_begin[:, None]) / res.ramp_over[:, None], 0.0, 1.0
            )
            value[res.ramp_rows] = (
                res.ramp_from[:, None] + (res.ramp_to - res.ramp_from)[:, None] * progress
            )
        if res.walk_rows.size:
            value[res.walk_rows] = self._walk(res)
        if res.spike_rows.size:
            value[res.spike_rows] += self._spikes(res) * res.spike_height[:, None]
        if res.diurnal_rows.size:
            value[res.diurnal_rows] += (
                res.diurnal_cos[:, None] * daily[0][None, :]
                + res.diurnal_sin[:, None] * daily[1][None, :]
            )
        if res.weekly_rows.size:
            value[res.weekly_rows] *= np.where(
                weekend[None, :], res.weekend[:, None], res.weekday[:, None]
            )
        for g, surge in res.surges:
            if surge.at <= times[-1] and surge.end > times[0]:
                value[g] += surge.level(times)
        if res.noise_rows.size:
            value += res.noise[:, None] * res.noise_z
        np.clip(value, 0.0, 1.0, out=value)
        value *= res.size[:, None]
        if res.integral:
            np.rint(value, out=value)
        return value

    def _walk(self, res: _Resource) -> np.ndarray:
        """The random walks over the block, (walk rows, block); the state carries over."""
        step_in = (res.walk_scale[:, None] * res.walk_z + res.walk_drift[:, None]).T
        out = np.empty((self.size, len(res.walk_rows)))
        x = res.walk_state.copy()
        keep, low, high = res.walk_keep, res.walk_low, res.walk_high
        for k in range(self.size):
            out[k] = x
            x *= keep
            x += step_in[k]
            np.maximum(x, low, out=x)
            np.minimum(x, high, out=x)
        res.walk_state = x
        return out.T

    def _spikes(self, res: _Resource) -> np.ndarray:
        """Whether a spike is on at each step, (spike rows, block); starts carry over."""
        starts = (res.spike_z > res.spike_threshold[:, None]).astype(np.int64)
        tail = res.spike_tail
        longest = tail.shape[1]
        extended = np.concatenate((tail, starts), axis=1)
        counts = np.concatenate(
            (np.zeros((len(starts), 1), dtype=np.int64), np.cumsum(extended, axis=1)), axis=1
        )
        # A spike covers step k when it started in (k − steps, k].
        end = longest + 1 + np.arange(self.size)[None, :]
        begin = end - res.spike_steps[:, None]
        rows = np.arange(len(starts))[:, None]
        active = counts[rows, end] - counts[rows, begin] > 0
        res.spike_tail = extended[:, extended.shape[1] - longest :]
        return active
