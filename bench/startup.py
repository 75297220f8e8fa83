"""Start-up: what ``opendrs plan FILE`` costs on a small snapshot, a fresh process each time.

``python -m bench.startup [--repeats 10] [--seed 1] [--markdown FILE]`` (also a section of
``python -m bench``). Each command runs once to warm up, then ``--repeats`` times, each time in a
fresh process from its start to its exit, measured by :mod:`bench.process` (its peak RSS sampled
every :data:`SAMPLE_S`); the table gives the median wall and CPU seconds and the largest peak.
The processes compile their modules once into a bytecode cache of their own
(``PYTHONPYCACHEPREFIX``, written whatever ``PYTHONDONTWRITEBYTECODE`` says), as an installed
opendrs finds its modules compiled by pip: the start-up measured is not Python compiling sources.
The commands:

* the floors: the interpreter alone (``python -c pass``), and with numpy imported (the engine's
  arrays: every plan needs them);
* ``opendrs plan examples/small.yaml`` (three nodes, five guests), as ``python -m opendrs`` and as
  the ``opendrs`` console script that pip writes (``from opendrs.cli.main import main``);
* ``opendrs strategies``, a command that plans nothing;
* ``opendrs plan FILE --format json`` on the basic L cluster (32 nodes, 3,000 guests) written as
  a snapshot: the whole plan, for scale.

The targets (issue #30): the three-node plan ≤ :data:`TARGET_SMALL` s wall, the L plan ≤
:data:`TARGET_L` s wall.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.process import ROOT, Measured, checkout_env, measure
from bench.report import emit

MIB = 1024**2
SMALL = ROOT / "examples" / "small.yaml"
#: Seconds between two samples of a run's peak RSS: the runs last a fraction of a second.
SAMPLE_S = 0.002
TARGET_SMALL = 0.3
TARGET_L = 1.0
#: What pip's console script runs (``[project.scripts]``), without the script file.
CONSOLE_SCRIPT = "import sys; from opendrs.cli.main import main; sys.exit(main())"


@dataclass(frozen=True)
class Command:
    """A command to time: its label in the table, its arguments, and its target wall (s)."""

    label: str
    argv: tuple[str, ...]
    target: float | None = None


@dataclass
class Startup:
    """One command's runs, summarised: medians of the times, the largest peak RSS."""

    command: Command
    wall: float
    cpu: float
    rss_peak: int | None
    repeats: int

    @property
    def verdict(self) -> str:
        target = self.command.target
        if target is None:
            return ""
        return f"≤ {target:g}: {'met' if self.wall <= target else '**not met**'}"


def commands(large: Path) -> list[Command]:
    """The commands measured, ``large`` being the L snapshot."""
    python = sys.executable
    small = str(SMALL)
    return [
        Command("interpreter alone (`python -c pass`)", (python, "-c", "pass")),
        Command("interpreter, numpy imported", (python, "-c", "import numpy")),
        Command(
            "`opendrs plan small.yaml` (`python -m opendrs`)",
            (python, "-m", "opendrs", "plan", small),
            TARGET_SMALL,
        ),
        Command(
            "`opendrs plan small.yaml` (console script)",
            (python, "-c", CONSOLE_SCRIPT, "plan", small),
            TARGET_SMALL,
        ),
        Command("`opendrs strategies`", (python, "-m", "opendrs", "strategies")),
        Command(
            "`opendrs plan L.yaml --format json`",
            (python, "-m", "opendrs", "plan", str(large), "--format", "json"),
            TARGET_L,
        ),
    ]


def compiled_env(pycache: Path) -> dict[str, str]:
    """The checkout's environment, its bytecode cached in ``pycache``."""
    env = checkout_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def run_command(command: Command, repeats: int, env: dict[str, str]) -> Startup:
    """A run to warm up, then ``repeats`` fresh runs of ``command``; RuntimeError when one
    fails."""
    runs: list[Measured] = []
    for _ in range(1 + repeats):
        done = measure(command.argv, timeout=120.0, cwd=ROOT, env=env, sample_s=SAMPLE_S)
        if not done.ok:
            raise RuntimeError(f"{command.label}: exit status {done.returncode}")
        runs.append(done)
    runs = runs[1:]
    peaks = [r.rss_peak for r in runs if r.rss_peak is not None]
    return Startup(
        command=command,
        wall=statistics.median(r.wall for r in runs),
        cpu=statistics.median(r.cpu for r in runs),
        rss_peak=max(peaks) if peaks else None,
        repeats=repeats,
    )


def write_large(folder: Path, seed: int) -> Path:
    """The basic L cluster (without rules) as a YAML snapshot in ``folder``."""
    from bench.clusters import generated
    from opendrs.model.snapshot import dump

    path = folder / "L.yaml"
    dump(generated("basic", "L", seed=seed), path, "yaml")
    return path


def run(repeats: int, seed: int = 1) -> list[Startup]:
    """Every command of :func:`commands`, ``repeats`` times each."""
    with tempfile.TemporaryDirectory(prefix="opendrs-startup-") as tmp:
        large = write_large(Path(tmp), seed)
        env = compiled_env(Path(tmp) / "pycache")
        results = []
        for command in commands(large):
            results.append(run_command(command, repeats, env))
            print(f"[start-up] {command.label}: {results[-1].wall:.3f} s", file=sys.stderr)
        return results


def section(results: list[Startup]) -> str:
    """The runs as a Markdown section."""
    repeats = results[0].repeats if results else 0
    lines = [
        "### Start-up",
        "",
        f"Each command run {repeats} times (after one to warm up), each a fresh process from its "
        "start to its exit, its modules compiled beforehand; times are the medians, the peak RSS "
        "the largest.",
        "",
        "| command | wall s | CPU s | peak RSS MiB | target |",
        "|---|---:|---:|---:|---|",
    ]
    for r in results:
        rss = f"{r.rss_peak / MIB:.0f}" if r.rss_peak is not None else "—"
        lines.append(f"| {r.command.label} | {r.wall:.3f} | {r.cpu:.3f} | {rss} | {r.verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.startup",
        description="Measure what `opendrs plan` costs on a small snapshot, from start to exit.",
    )
    parser.add_argument("--repeats", type=int, default=10, metavar="N")
    parser.add_argument("--seed", type=int, default=1, help="seed of the L cluster (1)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: expected at least 1")
    emit(section(run(args.repeats, args.seed)), args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
