"""``opendrs proposals``, ``approve ID``, ``reject ID`` and ``balance-now``: manual mode from the
command line.

They talk to the daemon as ``status`` and ``history`` do: through its history file. ``proposals``
reads it read-only; ``approve``, ``reject`` and ``balance-now`` write one row in it (who and when
— the local user, ``USER@cli`` — kept with the proposal or the request; a verdict also a line
of the decision log), then send the daemon, if
its lock says it runs, SIGUSR1: it takes the approval or the request at once, and otherwise at
its next cycle. An approved proposal is checked again on a fresh observation before anything
starts (:mod:`opendrs.controller.approval`); ``opendrs proposals --all`` then shows whether it
started or expired, and why.

Exit status: 0 done; 1 the history cannot be read or written; 2 a bad configuration or option, an
unknown proposal or one no longer open (one line each).
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Final

from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import add_config_option
from opendrs.cli.history_command import history_now, open_history
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError, setup_logging
from opendrs.controller.decision_log import append_to_log
from opendrs.controller.history_file import HistoryError
from opendrs.controller.proposals import ProposalRecord, choose_moves, open_proposal
from opendrs.json_data import json_text
from opendrs.model.units import format_duration

if TYPE_CHECKING:
    from opendrs.controller.config import Config
    from opendrs.controller.history import History

__all__ = ["add_approval_parsers", "local_user"]

FORMATS: Final = ("text", "json")


def local_user() -> str:
    """Who approves from this command line: ``USER@cli``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@cli"


def _load(args: argparse.Namespace) -> Config:
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    setup_logging(config.log_level)
    return config


def _writable_history(config: Config) -> History:
    """The history, read-write — never created: without one, the daemon never ran."""
    from opendrs.controller.history import History

    if not os.path.lexists(config.history):
        raise UsageError(f"{config.history}: no history: the daemon has not run with this file")
    return History(config.history)


def _wake_daemon(config: Config) -> str:
    """SIGUSR1 to the daemon that holds the lock, if one does: what the operator is told."""
    from opendrs.controller.loop import InstanceLock, LockError

    try:
        held, pid = InstanceLock(config.lock, config.history).probe()
    except LockError:
        held, pid = False, None
    if not held or pid is None:
        return "the daemon does not run: it takes it when it starts"
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        return f"the daemon (pid {pid}) takes it at its next cycle (not signalled: {exc.strerror})"
    return f"the daemon (pid {pid}) takes it now"


# -- opendrs proposals ----------------------------------------------------------------------


def cmd_proposals(args: argparse.Namespace) -> int:
    config = _load(args)
    if not os.path.lexists(config.history):
        proposals: list[ProposalRecord] = []
        now = time.time()
    else:
        try:
            with open_history(config) as history:
                proposals = history.proposals() if args.all else history.proposals("open")
                now = history_now(config, history)
        except HistoryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE if exc.foreign else EXIT_PROBLEM
    if args.format == "json":
        sys.stdout.write(json_text({"now": now, "proposals": [p.as_dict() for p in proposals]}))
        return EXIT_OK
    if not proposals:
        print("no open proposal" if not args.all else "no proposal")
    for proposal in proposals:
        print(_proposal_text(proposal, now, config))
    return EXIT_OK


def _proposal_text(proposal: ProposalRecord, now: float, config: Config) -> str:
    from opendrs.engine.policy.metrics import format_metric

    age = format_duration(max(now - proposal.at, 0.0))
    head = f"{proposal.id}  {proposal.kind}, {proposal.state}, made {age} ago"
    if proposal.by is not None:
        head += f", {proposal.state} by {proposal.by}"
    lines = [head, f"  {proposal.reason}"]
    if proposal.imbalance is not None and proposal.predicted is not None:
        metric = config.policy.metric
        lines.append(
            f"  imbalance {format_metric(metric, proposal.imbalance)} → "
            f"{format_metric(metric, proposal.predicted)} predicted"
        )
    chosen = proposal.chosen
    for n, move in enumerate(proposal.moves, start=1):
        mark = "" if chosen is None or n in chosen else "  (not approved)"
        lines.append(f"  {n}. {move.label()}{mark}")
    if proposal.note:
        lines.append(f"  {proposal.note}")
    return "\n".join(lines)


# -- opendrs approve / reject ---------------------------------------------------------------


def _open_proposal(history: History, proposal_id: str) -> ProposalRecord:
    try:
        return open_proposal(history.proposals(), proposal_id)
    except LookupError as exc:
        raise UsageError(f"ID: {exc.args[0]}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _chosen(proposal: ProposalRecord, spec: str | None) -> tuple[int, ...] | None:
    if spec is None:
        return None
    try:
        return choose_moves(proposal, spec.split(","))
    except ValueError as exc:
        raise UsageError(f"--moves: {exc}") from None


def _verdict(args: argparse.Namespace, approve: bool) -> int:
    config = _load(args)
    by = local_user()
    try:
        with _writable_history(config) as history:
            proposal = _open_proposal(history, args.id)
            chosen = _chosen(proposal, args.moves) if approve else None
            state = "approved" if approve else "rejected"
            verdict = history.give_verdict(proposal, state, by=by, chosen=chosen)
            if verdict is None:
                raise UsageError(f"proposal {proposal.id} is no longer open")
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.foreign else EXIT_PROBLEM
    append_to_log(config.decision_log, verdict)
    if not approve:
        print(f"proposal {proposal.id} rejected by {by}: nothing of it will start")
        return EXIT_OK
    count = len(chosen) if chosen is not None else len(proposal.moves)
    print(
        f"proposal {proposal.id} approved by {by} ({count} of {len(proposal.moves)} moves): "
        f"checked again on a fresh observation before it starts; {_wake_daemon(config)}"
    )
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    return _verdict(args, approve=True)


def cmd_reject(args: argparse.Namespace) -> int:
    return _verdict(args, approve=False)


# -- opendrs balance-now --------------------------------------------------------------------


def cmd_balance_now(args: argparse.Namespace) -> int:
    config = _load(args)
    by = local_user()
    try:
        with _writable_history(config) as history:
            history.request_balance(by)
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.foreign else EXIT_PROBLEM
    acted = {
        "shadow": "reported only (shadow mode)",
        "manual": "proposed (manual mode)",
        "active": "acted on (active mode)",
    }[config.mode]
    print(
        f"asked for one decision now, whatever the hold and interval, {acted}: "
        f"{_wake_daemon(config)}; 'opendrs status' shows it"
    )
    return EXIT_OK


# -- the parsers ----------------------------------------------------------------------------


def add_approval_parsers(sub: Subcommands) -> None:
    exit_status = (
        " Exit status: 0 done, 1 the history cannot be read or written, 2 a bad configuration "
        "or option"
    )
    verdict_status = exit_status + ", an unknown proposal, one no longer open or a move it lacks."
    exit_status += "."
    p = sub.add_parser(
        "proposals",
        help="manual mode's proposals waiting for approval",
        description="The open proposals of manual mode, from the daemon's history (read-only): "
        "id, kind, age, reason, predicted imbalance and each move by guest name, source and "
        "target." + exit_status,
    )
    add_config_option(p)
    p.add_argument("--all", action="store_true", help="every proposal kept, whatever its state")
    p.add_argument("--format", choices=FORMATS, default="text", help="text (default) or json")
    p.set_defaults(func=cmd_proposals)
    for name, func, verb in (("approve", cmd_approve, "approve"), ("reject", cmd_reject, "reject")):
        q = sub.add_parser(
            name,
            help=f"{verb} a proposal of manual mode",
            description=f"{verb.capitalize()} proposal ID, recorded in the history with the "
            "local user and the time; the daemon is signalled (SIGUSR1) when it runs. An "
            "approved proposal is checked again on a fresh observation before it starts, and "
            "expires with the reason when it no longer holds." + verdict_status,
        )
        add_config_option(q)
        q.add_argument("id", metavar="ID", help="the proposal's id (opendrs proposals)")
        if name == "approve":
            q.add_argument(
                "--moves",
                metavar="LIST",
                help="approve only these moves: their numbers, or guests' names or ids, "
                "comma-separated (default: all); checked again, they start if they still hold "
                "and raise neither the imbalance metric nor the load's σ",
            )
        q.set_defaults(func=func)
    b = sub.add_parser(
        "balance-now",
        help="ask the daemon for one decision now",
        description="Ask the running daemon for one decision now, whatever the hold and the "
        "interval (cooldowns, rules, capacity, migration windows and the policy's threshold "
        "still hold): acted on "
        "in active mode, proposed in manual mode, reported in shadow mode." + exit_status,
    )
    add_config_option(b)
    b.set_defaults(func=cmd_balance_now)
