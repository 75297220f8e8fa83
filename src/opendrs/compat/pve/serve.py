"""The query protocol of ``opendrs pve decide``: one JSON query in, one Proxmox decision out.

Everything is pure: a query (a JSON-like ``dict``) goes in, an answer comes out.
:func:`serve` wraps :func:`decide` as a JSON-Lines service::

    query:  {"mode": "basic|static|dynamic",
             "nodes": {NODE: {"maxcpu": n, "maxmem": bytes, "online": bool}},
             "services": {SID: {"node": NODE, "state": STATE, "target": NODE|null,
                                "running": bool, "maxcpu": n, "maxmem": bytes,
                                "cpu": n, "mem": bytes, "failback": bool}},
             "rules": TEXT|null, "groups": TEXT|null,
             "query": {"select-node": {...}} | {"rebalance": {...}} | {"command": {...}}}
    answer: {"node": NODE|null} | {"migration": {...}|null} | {"accepted": bool, "comoves": [...]}

Optional service fields beyond the basic protocol: ``"group"`` (a legacy HA group
of ``groups``), ``"ha": false`` (a non-HA guest: it loads its node but never
moves) and ``"cmd": [TASK, NODE]`` (a CRM command queued and not yet carried out,
e.g. ``["migrate", "node2"]``: while any migrate or relocate is queued or running,
``rebalance`` makes no move, as ``any_resource_motion_queued_or_running`` says).
Every answer also carries ``"mode"`` (the effective scheduler mode) and ``"dropped"``
(the ``Drop rule '<id>', because …`` messages), and where relevant
``"scores"`` (lower is better), ``"imbalance"`` (``before``/``after``, raw and
``*_normalized``), ``"comoves"``, ``"reason"`` and ``"warnings"``.

Imbalance, threshold and margin use the scale of the Proxmox test logs: the plain
coefficient of variation of the node loads (crate 2.0), not the ÷√(N−1) form of
crate 2.1.0 (which :func:`~opendrs.engine.pve_selection.node_imbalance` also offers).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .groups import apply_groups, groups_to_rules, parse_groups
from .manager import PREFERENCES, execute_command, load_balance, make_usage, select_service_node
from .rules import CompiledRules, compile_rules, parse_rules, transform_rules
from .status import (
    DEFAULT_NODE_MAXCPU,
    DEFAULT_NODE_MAXMEM,
    DEFAULT_SERVICE_CPU,
    DEFAULT_SERVICE_MAXCPU,
    DEFAULT_SERVICE_MAXMEM,
    DEFAULT_SERVICE_MEM,
    MODES,
    SERVICE_STATES,
    SID_RE,
    ManagerStatus,
    NodeInfo,
    Service,
)
from .usage import Usage

__all__ = ["MAX_QUERY_NUMBER", "PveQueryError", "answer_line", "decide", "parse_query", "serve"]


class PveQueryError(ValueError):
    """A malformed query; the message is one sentence naming the offending field."""


#: The keys a query, a node, a service and each request may have (as in snapshots, a key that
#: is not one of them is an error: a misspelt key would otherwise silently take its default).
_QUERY_KEYS = ("mode", "nodes", "services", "rules", "groups", "query")
_NODE_KEYS = ("maxcpu", "maxmem", "online")
_SERVICE_KEYS = (
    "node",
    "state",
    "target",
    "running",
    "maxcpu",
    "maxmem",
    "cpu",
    "mem",
    "failback",
    "group",
    "ha",
    "cmd",
)
_REQUEST_KEYS: Mapping[str, tuple[str, ...]] = {
    "select-node": ("sid", "preference", "failed_nodes", "maintenance_fallback"),
    "rebalance": ("method", "threshold", "margin"),
    "command": ("sid", "task", "target"),
}
#: Largest number a query may hold (cores, bytes, threshold, margin): 2⁵³, the largest integer
#: a float holds exactly — the arithmetic stays finite and exact in its whole numbers.
MAX_QUERY_NUMBER = 2**53


def _err(path: str, message: str) -> PveQueryError:
    return PveQueryError(f"field '{path}' {message}")


def _show(value: Any) -> str:
    """A value for a message: its JSON, shortened (a number of 4,000 digits is not repeated)."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:39] + "…"


def _json_kind(value: Any) -> str:
    """What a JSON value is, as the query's author wrote it: ``null``, ``a string``, …"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {_show(value)}"
    if isinstance(value, str):
        return f"the string {_show(value)}"
    return "an array" if isinstance(value, list) else "an object"


def _known_keys(obj: Mapping[str, Any], path: str, allowed: Sequence[str]) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise _err(where, f"is not a known key (known: {', '.join(allowed)})")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # an int of any size is finite


def _number(obj: Mapping[str, Any], key: str, path: str, default: float) -> float:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if not _is_number(value) or not 0 <= value <= MAX_QUERY_NUMBER:
        raise _err(f"{path}.{key}", f"must be a non-negative number up to 2^53, got {_show(value)}")
    return float(value)


def _bool(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _err(f"{path}.{key}", f"must be a boolean, got {_show(value)}")


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _err(path, f"must be an object, got {_json_kind(value)}")
    return value


def _text(query: Mapping[str, Any], key: str) -> str | None:
    value = query.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _err(key, f"must be a string or null, got {_json_kind(value)}")
    return value


def parse_query(query: Mapping[str, Any]) -> tuple[ManagerStatus, Mapping[str, Any]]:
    """Validate a query dict and build the :class:`~.status.ManagerStatus`; also return
    ``query["query"]``.

    Optional fields get Proxmox's defaults: node online, 24 cores, 128 GiB;
    service state ``started``, maxcpu 4, maxmem 4096 MiB, cpu 2, mem 2048 MiB,
    failback true, not running.

    Raises:
        PveQueryError: naming the first malformed field.
    """
    query = _mapping(query, "(query line)")
    _known_keys(query, "", _QUERY_KEYS)
    mode = query.get("mode", "basic")
    if mode not in MODES:
        raise _err("mode", f"must be one of basic, static, dynamic, got {_show(mode)}")
    nodes = _parse_nodes(query.get("nodes"))
    raw_services = _mapping(query.get("services", {}), "services")
    services = {sid: _parse_service(sid, spec, nodes) for sid, spec in raw_services.items()}
    request = _mapping(query.get("query"), "query")
    if len(request) != 1 or next(iter(request)) not in ("select-node", "rebalance", "command"):
        raise _err("query", "must hold exactly one of 'select-node', 'rebalance' or 'command'")
    return ManagerStatus(mode=mode, nodes=nodes, services=services), request


def _parse_nodes(raw: object) -> dict[str, NodeInfo]:
    """The query's ``nodes``: at least one, each with Proxmox's defaults."""
    raw_nodes = _mapping(raw, "nodes")
    if not raw_nodes:
        raise _err("nodes", "must name at least one node")
    nodes: dict[str, NodeInfo] = {}
    for name, spec in raw_nodes.items():
        path = f"nodes.{name}"
        spec = _mapping(spec, path)
        _known_keys(spec, path, _NODE_KEYS)
        maxcpu = _number(spec, "maxcpu", path, DEFAULT_NODE_MAXCPU)
        maxmem = _number(spec, "maxmem", path, DEFAULT_NODE_MAXMEM)
        nodes[name] = NodeInfo(
            name=name,
            maxcpu=int(maxcpu),
            maxmem=int(maxmem),
            online=_bool(spec, "online", path, True),
        )
    return nodes


def _parse_service(sid: str, raw: object, nodes: Mapping[str, NodeInfo]) -> Service:
    """One of the query's ``services``, on a known node, with Proxmox's defaults."""
    path = f"services.{sid}"
    if not SID_RE.match(sid):
        raise _err(path, "must be named like 'vm:100' or 'ct:100'")
    spec = _mapping(raw, path)
    _known_keys(spec, path, _SERVICE_KEYS)
    node = spec.get("node")
    if not isinstance(node, str) or node not in nodes:
        raise _err(f"{path}.node", f"must name a known node, got {_show(node)}")
    state = spec.get("state", "started")
    if not isinstance(state, str) or state not in SERVICE_STATES:
        raise _err(f"{path}.state", f"is not a valid service state: {_show(state)}")
    target = spec.get("target")
    if target is not None and (not isinstance(target, str) or target not in nodes):
        raise _err(f"{path}.target", f"must be null or name a known node, got {_show(target)}")
    group = spec.get("group")
    if group is not None and not isinstance(group, str):
        raise _err(f"{path}.group", "must be a string or null")
    return Service(
        cmd=_command(spec.get("cmd"), f"{path}.cmd", nodes),
        sid=sid,
        node=node,
        state=state,
        target=target,
        running=_bool(spec, "running", path, False),
        maxcpu=_number(spec, "maxcpu", path, DEFAULT_SERVICE_MAXCPU),
        maxmem=int(_number(spec, "maxmem", path, DEFAULT_SERVICE_MAXMEM)),
        cpu=_number(spec, "cpu", path, DEFAULT_SERVICE_CPU),
        mem=int(_number(spec, "mem", path, DEFAULT_SERVICE_MEM)),
        failback=_bool(spec, "failback", path, True),
        group=group,
        ha=_bool(spec, "ha", path, True),
    )


def _command(raw: object, path: str, nodes: Mapping[str, NodeInfo]) -> tuple[str, str] | None:
    """A queued CRM command: null, or ``[TASK, NODE]`` (``$ss->{$sid}->{cmd}``)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2 or not all(isinstance(part, str) for part in raw):
        raise _err(path, f"must be null or [TASK, NODE], got {_show(raw)}")
    task, node = raw
    if task in ("migrate", "relocate") and node not in nodes:
        raise _err(path, f"must name a known node, got {_show(node)}")
    return task, node


def _prepare_rules(
    query: Mapping[str, Any], status: ManagerStatus
) -> tuple[ManagerStatus, CompiledRules, list[str], list[str]]:
    """Parse rules and groups, migrate groups, drop infeasible rules, compile."""
    rules, warnings = parse_rules(_text(query, "rules"))
    groups, group_warnings = parse_groups(_text(query, "groups"))
    warnings.extend(group_warnings)
    if groups:
        status = ManagerStatus(status.mode, status.nodes, apply_groups(status.services, groups))
        existing = {rule.ruleid for rule in rules}
        next_order = max((rule.order for rule in rules), default=0) + 1
        for rule in groups_to_rules(groups, status.services, first_order=next_order):
            if rule.ruleid not in existing:
                rules.append(rule)
    transformed, dropped = transform_rules(rules, sorted(status.nodes))
    return status, compile_rules(transformed), dropped, warnings


def _known_sid(request: Mapping[str, Any], path: str, status: ManagerStatus) -> str:
    sid = request.get("sid")
    if not isinstance(sid, str) or sid not in status.services:
        raise _err(f"{path}.sid", f"must name a service of the query, got {_show(sid)}")
    return sid


def decide(query: Mapping[str, Any]) -> dict[str, Any]:
    """Answer one query (see the module docstring for the protocol).

    Raises:
        PveQueryError: if the query is malformed.
    """
    status, request = parse_query(query)
    status, compiled, dropped, warnings = _prepare_rules(query, status)
    usage, usage_warnings = make_usage(status)
    warnings.extend(usage_warnings)
    kind, body = next(iter(request.items()))
    path = f"query.{kind}"
    body = _mapping(body, path)
    _known_keys(body, path, _REQUEST_KEYS[kind])
    answer = _ANSWERS[kind](body, path, _Round(compiled, usage, status))
    answer["mode"] = usage.mode
    answer["dropped"] = dropped
    if warnings:
        answer["warnings"] = warnings
    return answer


@dataclass(frozen=True)
class _Round:
    """What the manager decides a query's round with: the compiled rules, the usage and the
    manager's status."""

    compiled: CompiledRules
    usage: Usage
    status: ManagerStatus


def _answer_select_node(body: Mapping[str, Any], path: str, round_: _Round) -> dict[str, Any]:
    """A ``select-node`` query's answer: the node, and the scores when the mode has them."""
    sid = _known_sid(body, path, round_.status)
    preference = body.get("preference", "none")
    if preference not in PREFERENCES:
        raise _err(
            f"{path}.preference",
            f"must be none, best-score or try-next, got {_show(preference)}",
        )
    failed = body.get("failed_nodes") or []
    if not isinstance(failed, list) or not all(isinstance(n, str) for n in failed):
        raise _err(f"{path}.failed_nodes", "must be a list of node names")
    fallback = body.get("maintenance_fallback")
    if fallback is not None and not isinstance(fallback, str):
        raise _err(f"{path}.maintenance_fallback", "must be a node name or null")
    node, scores = select_service_node(
        round_.compiled,
        round_.usage,
        round_.status,
        sid,
        preference,
        failed_nodes=failed,
        maintenance_fallback=fallback,
    )
    answer: dict[str, Any] = {"node": node}
    if scores is not None:
        answer["scores"] = {n: scores[n] for n in sorted(scores)}
    return answer


def _answer_rebalance(body: Mapping[str, Any], path: str, round_: _Round) -> dict[str, Any]:
    """A ``rebalance`` query's answer (:func:`~.manager.load_balance`)."""
    method = body.get("method", "bruteforce")
    if method not in ("bruteforce", "topsis"):
        raise _err(f"{path}.method", f"must be bruteforce or topsis, got {_show(method)}")
    threshold = _number(body, "threshold", path, 0.3)
    margin = _number(body, "margin", path, 0.1)
    return load_balance(
        round_.compiled,
        round_.usage,
        round_.status,
        method=method,
        threshold=threshold,
        margin=margin,
    )


def _answer_command(body: Mapping[str, Any], path: str, round_: _Round) -> dict[str, Any]:
    """A ``command`` query's answer (:func:`~.manager.execute_command`)."""
    sid = _known_sid(body, path, round_.status)
    task = body.get("task", "migrate")
    if task not in ("migrate", "relocate"):
        raise _err(f"{path}.task", f"must be migrate or relocate, got {_show(task)}")
    target = body.get("target")
    if not isinstance(target, str):
        raise _err(f"{path}.target", f"must be a node name, got {_show(target)}")
    return execute_command(round_.compiled, round_.status, sid, task, target)


#: Each query kind's answer.
_ANSWERS: Mapping[str, Callable[[Mapping[str, Any], str, _Round], dict[str, Any]]] = {
    "select-node": _answer_select_node,
    "rebalance": _answer_rebalance,
    "command": _answer_command,
}


def _dump(answer: Mapping[str, Any]) -> str:
    return json.dumps(answer, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _read_line(number: int, line: str) -> Any:
    """The JSON value on ``line``, or PveQueryError saying why there is none (one sentence)."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, kept as lone surrogates
        raise PveQueryError(f"line {number} is not UTF-8 text") from None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        reason = exc.msg
    except RecursionError:
        reason = "it is nested too deeply"
    except ValueError:  # an integer longer than Python converts
        reason = f"a number has more than {sys.get_int_max_str_digits()} digits"
    raise PveQueryError(f"line {number} is not valid JSON: {reason}")


def answer_line(number: int, line: str) -> str:
    """The answer to input line ``number`` (without its newline): never raises.

    An error in the query is ``{"error": "line N: …"}`` naming the field; an error opendrs
    cannot explain by the query (a bug) is ``{"error": "line N: internal error …"}`` — the
    stream goes on either way.
    """
    try:
        query = _read_line(number, line)
    except PveQueryError as exc:
        return _dump({"error": f"{exc}."})
    try:
        if not isinstance(query, dict):
            raise PveQueryError("the query line must be a JSON object")
        return _dump(decide(query))
    except PveQueryError as exc:
        return _dump({"error": f"line {number}: {exc}."})
    except Exception as exc:  # the stream must go on; say it is not the query's fault
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        return _dump(
            {"error": f"line {number}: internal error (a bug in opendrs): {detail}."},
        )


def serve(stdin: TextIO, stdout: TextIO) -> int:
    """JSON-Lines service: one query per input line, one answer per output line.

    Blank lines are skipped; a malformed line — not UTF-8 (when ``stdin`` decodes with
    ``surrogateescape``), not JSON, an integer Python will not convert, an unknown key, a
    number out of range — yields ``{"error": "..."}`` and the stream goes on. Output is
    deterministic (sorted keys, compact separators) and flushed after every answer. Returns 0.
    """
    for number, line in enumerate(stdin, start=1):
        if not line.strip():
            continue
        stdout.write(answer_line(number, line) + "\n")
        stdout.flush()
    return 0
