"""The controller's configuration file (YAML), validated with one-line errors.

``docs/configuration.md`` documents every key and default. The shape::

    version: 1
    cluster: prod                 # name in logs and in the history (default: the backend's)
    mode: shadow                  # shadow (default: record only) | manual (propose, an
                                  # operator approves) | active (migrate)
    automatic: [maintenance, return, repair]  # manual mode: what acts without approval
    proposal_ttl: 1h              # manual mode: an open proposal expires when older
    backend:
      type: file | sim | proxmox | incus  # and the keys of that backend
    history: history.sqlite       # relative paths are relative to this file
    lock: history.sqlite.lock     # default: the history path + ".lock"
    policy: {...}                 # see opendrs.engine.policy.parse_policy
    executor: {max_parallel, max_node_inflow, timeout, poll_interval}
    settings: {...}               # cluster settings, as in a snapshot (replace the backend's)
    log: {level: info, decisions: decisions.jsonl}
    http: {listen: 127.0.0.1:9180, token_file: FILE}  # the dashboard, /metrics, /healthz

Nothing migrates unless ``mode: active`` or ``mode: manual`` is written in the file; in manual
mode, only what ``automatic`` names or an operator approves.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any, Final, Literal

from opendrs.controller.executor import ExecutorConfig
from opendrs.controller.proposals import KINDS
from opendrs.engine.policy import PolicyConfig, parse_policy
from opendrs.model.cluster import Settings
from opendrs.model.document import DocumentError, Path, parse, read_file
from opendrs.model.snapshot import SnapshotReader
from opendrs.model.units import format_duration

if TYPE_CHECKING:
    from opendrs.backends.base import Backend, Clock
    from opendrs.backends.incus import IncusConfig
    from opendrs.backends.proxmox import ProxmoxConfig

__all__ = [
    "BackendConfig",
    "Config",
    "ConfigError",
    "HttpConfig",
    "load_config",
    "parse_config",
    "parse_listen",
    "with_platform_defaults",
]

#: Configuration problems are document problems: one line, ``FILE: PATH: REASON``.
ConfigError = DocumentError

VERSION: Final = 1
MODES: Final = ("shadow", "manual", "active")
#: In manual mode, the kinds of decision that act without approval by default.
AUTOMATIC: Final = ("maintenance", "return", "repair")
#: In manual mode, how long a proposal stays open by default (seconds), and at most.
PROPOSAL_TTL: Final = 3600
_LONGEST_PROPOSAL_TTL: Final = 30 * 86400
BACKENDS: Final = ("file", "sim", "proxmox", "incus")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
_TOP_KEYS: Final = (
    "version",
    "cluster",
    "mode",
    "automatic",
    "proposal_ttl",
    "backend",
    "history",
    "lock",
    "policy",
    "executor",
    "settings",
    "log",
    "http",
)
_EXECUTOR_KEYS: Final = (
    "max_parallel",
    "max_node_inflow",
    "timeout",
    "poll_interval",
    "avoid_after_failure",
    "stall_timeout",
)
#: The range of each executor duration, in seconds: (shortest, longest).
_EXECUTOR_DURATIONS: Final = {
    "timeout": (1, 7 * 86400),
    "poll_interval": (1, 3600),
    "avoid_after_failure": (0, 365 * 86400),
    "stall_timeout": (1, 7 * 86400),
}


@dataclass(frozen=True)
class BackendConfig:
    """Which cluster to drive and how to reach it."""

    type: Literal["file", "sim", "proxmox", "incus"]
    #: ``file``: the snapshot file.
    path: str | None = None
    #: ``sim``: the scenario file, or ``None`` for the built-in one named by ``builtin``.
    scenario: str | None = None
    builtin: str = "month"
    #: ``sim``: simulated days (``None``: the scenario's duration).
    days: float | None = None
    #: ``sim``: simulated seconds per second of wall time at most (``None``: as fast as it
    #: computes).
    speed: float | None = None
    #: ``proxmox``: the connection.
    proxmox: ProxmoxConfig | None = None
    #: ``incus``: the connection.
    incus: IncusConfig | None = None


@dataclass(frozen=True)
class HttpConfig:
    """Where ``opendrs run`` serves the dashboard, ``/metrics`` and ``/healthz`` (the ``http``
    section)."""

    #: An IP address (``localhost`` is 127.0.0.1) and a port; port 0: a free port.
    host: str
    port: int
    #: The file holding the bearer token every path then requires, or ``None``.
    token_file: str | None = None
    #: Whether the dashboard may approve, reject and balance now (``http.write``; needs the
    #: token), and the token's name its verdicts are recorded with (``NAME@http``).
    write: bool = False
    token_name: str = "dashboard"

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def address(self) -> str:
        """``HOST:PORT`` as written in a URL (``[::1]:9180``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Config:
    """A validated configuration."""

    file: str
    backend: BackendConfig
    history: str
    lock: str
    cluster: str | None = None
    mode: Literal["shadow", "manual", "active"] = "shadow"
    #: In manual mode, the kinds of proposal (``balance``, ``maintenance``, ``return``,
    #: ``repair``) that act on their own; the others wait for approval.
    automatic: tuple[str, ...] = AUTOMATIC
    #: In manual mode, the age (seconds) at which an open proposal expires.
    proposal_ttl: int = PROPOSAL_TTL
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    settings: Settings | None = None
    log_level: str = "info"
    #: Failed observations in a row from which each further one is logged at ERROR.
    failed_observations: int = 3
    #: The keys written in the ``policy`` section: they win over the platform's own defaults
    #: (Incus's ``cluster.rebalance.*``, see :func:`with_platform_defaults`).
    policy_keys: frozenset[str] = frozenset()
    #: The JSON Lines decision log the daemon appends to (``log.decisions``), or ``None``.
    decision_log: str | None = None
    #: The dashboard, ``/metrics`` and ``/healthz`` (the ``http`` section), or ``None``.
    http: HttpConfig | None = None

    @property
    def active(self) -> bool:
        return self.mode == "active"

    @property
    def migrates(self) -> bool:
        """Whether migrations may start: active mode, or manual (what is approved or automatic)."""
        return self.mode != "shadow"

    def manual_words(self) -> str:
        """Manual mode in an operator's words, with what acts without approval."""
        alone = ", ".join(self.automatic) or "nothing"
        return (
            f"proposes, migrates what an operator approves ({alone} act on their own; "
            f"a proposal expires after {format_duration(self.proposal_ttl)})"
        )

    def acts_alone(self, kind: str) -> bool:
        """Whether a decision of ``kind`` (``balance``, ``repair``, ``maintenance``) is carried
        out without approval: always in active mode, in manual mode as ``automatic`` says."""
        return self.mode == "active" or (self.mode == "manual" and kind in self.automatic)

    def make_backend(
        self, *, should_stop: Callable[[], bool] | None = None
    ) -> tuple[Backend, Clock]:
        """The backend this configuration names, and the clock that goes with it.

        ``should_stop`` is asked while a call to a real platform waits for its answer: once it
        says yes, the call is abandoned (the daemon was asked to stop).
        """
        from opendrs.backends.base import SystemClock

        if self.backend.type == "file":
            from opendrs.backends.file import FileBackend

            assert self.backend.path is not None
            return FileBackend(self.backend.path, self.settings), SystemClock()
        if self.backend.type == "sim":
            from opendrs.backends.sim import Simulator, builtin_scenario, load_scenario

            scenario = (
                load_scenario(self.backend.scenario)
                if self.backend.scenario is not None
                else builtin_scenario(self.backend.builtin)
            )
            sim = Simulator(scenario, days=self.backend.days, threshold=self.policy.threshold)
            if self.backend.speed is None:
                return sim, sim
            from opendrs.backends.paced import PacedClock

            return sim, PacedClock(sim, self.backend.speed, should_stop)
        if self.backend.type == "incus":
            from opendrs.backends.incus import IncusBackend

            assert self.backend.incus is not None
            incus = IncusBackend(
                self.backend.incus,
                self.settings or Settings(),
                cluster_name=self.cluster,
                should_stop=should_stop,
            )
            return incus, SystemClock()
        from opendrs.backends.proxmox import ProxmoxBackend

        assert self.backend.proxmox is not None
        backend = ProxmoxBackend(
            self.backend.proxmox,
            self.settings or Settings(),
            cluster_name=self.cluster,
            should_stop=should_stop,
        )
        return backend, SystemClock()


class _ConfigReader(SnapshotReader):
    """Reads a configuration document (snapshot settings included)."""

    def __init__(self, filename: str, *, check_inputs: bool = False) -> None:
        super().__init__(filename)
        self.base = FsPath(filename).parent if not filename.startswith("<") else FsPath(".")
        #: Whether the files the daemon will read must exist now (``validate --config``); a
        #: command that only reads the history (``history``, ``report``) does not need them.
        self.check_inputs = check_inputs

    def local_path(self, value: object, path: Path) -> str:
        """A file path; relative paths are taken relative to the configuration file."""
        text = self.text(value, path)
        expanded = FsPath(os.path.expanduser(text))
        return str(expanded if expanded.is_absolute() else self.base / expanded)

    def input_file(self, value: object, path: Path, *, required: bool) -> str:
        """:meth:`local_path` of a file opendrs reads (a snapshot, a scenario): never a
        directory, and when ``required`` (and the inputs are checked) a file that exists — what
        ``run`` would refuse is refused here, so that ``validate --config`` says it first."""
        local = self.local_path(value, path)
        if os.path.isdir(local):
            self.fail(path, f"{local} is a directory, not a file")
        if required and self.check_inputs and not os.path.exists(local):
            self.fail(path, f"{local}: no such file")
        return local

    def config(self, data: object) -> Config:
        if data is None:
            self.fail(
                (),
                "the configuration is empty (it needs at least a `backend` section: "
                "'opendrs init --platform proxmox' (or incus) writes a starting one)",
            )
        top = self.mapping(data, ())
        self.check_keys(top, (), _TOP_KEYS)
        if "version" in top:
            version = self.integer(top["version"], ("version",), minimum=1, maximum=10**6)
            if version != VERSION:
                self.fail(("version",), f"this opendrs reads version {VERSION}, not {version}")
        # The history keeps this name: no blanks around it, no control characters, not too long.
        cluster = self.plain_name(top["cluster"], ("cluster",)) if "cluster" in top else None
        mode = self.choice(top.get("mode", "shadow"), ("mode",), MODES)
        automatic = self.automatic(top["automatic"]) if "automatic" in top else AUTOMATIC
        proposal_ttl = (
            self.duration(
                top["proposal_ttl"], ("proposal_ttl",), minimum=1, maximum=_LONGEST_PROPOSAL_TTL
            )
            if "proposal_ttl" in top
            else PROPOSAL_TTL
        )
        backend = self.backend(self.require(top, "backend", ()), ("backend",))
        default_history = "history.sqlite"
        history = self.local_path(top.get("history", default_history), ("history",))
        lock = self.local_path(top["lock"], ("lock",)) if "lock" in top else history + ".lock"
        policy = parse_policy(self, top["policy"], ("policy",)) if "policy" in top else None
        settings = self.settings(top["settings"], ("settings",)) if "settings" in top else None
        executor = self.executor(top.get("executor"), ("executor",), policy)
        level, failed_observations, decision_log = (
            self.log(top["log"], (history, lock)) if "log" in top else ("info", 3, None)
        )
        policy_keys = frozenset(
            str(k) for k in (top["policy"] if isinstance(top.get("policy"), dict) else ())
        )
        return Config(
            file=self.filename,
            backend=backend,
            history=history,
            lock=lock,
            cluster=cluster,
            mode=mode,  # type: ignore[arg-type]
            automatic=automatic,
            proposal_ttl=proposal_ttl,
            policy=policy or PolicyConfig(),
            executor=executor,
            settings=settings,
            log_level=level,
            failed_observations=failed_observations,
            policy_keys=policy_keys,
            decision_log=decision_log,
            http=self.http(top["http"]) if "http" in top else None,
        )

    def http(self, value: object) -> HttpConfig:
        """The ``http`` section: ``listen`` (required) and ``token_file``."""
        path: Path = ("http",)
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, ("listen", "token_file", "write", "token_name"))
        host, port = self.listen(self.require(mapping, "listen", path), (*path, "listen"))
        token_file = None
        if "token_file" in mapping:
            token_file = self.local_path(mapping["token_file"], (*path, "token_file"))
        write, token_name = self.http_write(mapping, token_file)
        return HttpConfig(host, port, token_file, write, token_name)

    def http_write(self, mapping: Mapping[str, Any], token_file: str | None) -> tuple[bool, str]:
        """``http.write`` (off by default; never without ``token_file``) and ``token_name``."""
        write = self.boolean(mapping.get("write", False), ("http", "write"))
        if write and token_file is None:
            self.fail(("http", "write"), "needs http.token_file: no write without a token")
        name = mapping.get("token_name", "dashboard")
        return write, self.plain_name(name, ("http", "token_name"))

    def listen(self, value: object, path: Path) -> tuple[str, int]:
        """``HOST:PORT`` (``[V6]:PORT`` for IPv6): an IP address written out, and a port; a port
        alone (``9180``, ``":9180"``) is on loopback, ``127.0.0.1``."""
        example = "write it as 127.0.0.1:9180 or [::1]:9180"
        if isinstance(value, int) and not isinstance(value, bool):
            value = f"127.0.0.1:{value}"
        elif isinstance(value, str) and value.removeprefix(":").isdigit():
            value = f"127.0.0.1:{value.removeprefix(':')}"
        if not isinstance(value, str):
            self.fail(path, f"an address and a port are needed: {example}")
        host, colon, port_text = value.rpartition(":")
        if not colon or not host:
            self.fail(path, f"{value!r} has no address: {example}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            self.fail(path, f"write an IPv6 address in brackets, as [::1]:9180, not {value!r}")
        if host == "localhost":
            host = "127.0.0.1"
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            self.fail(path, f"{host!r} is not an IP address: {example}")
        if not port_text.isdigit() or int(port_text) > 65535:
            self.fail(path, f"{port_text!r} is not a port (0 to 65535; 0: any free port)")
        return host, int(port_text)

    def log(self, value: object, taken: tuple[str, ...]) -> tuple[str, int, str | None]:
        """The ``log`` section: level, failed observations, the decision log's path (which must
        not be one of the ``taken`` paths: the history and the lock)."""
        path: Path = ("log",)
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, ("level", "failed_observations", "decisions"))
        level = self.choice(mapping.get("level", "info"), (*path, "level"), LOG_LEVELS)
        failed_observations = 3
        if "failed_observations" in mapping:
            failed_observations = self.integer(
                mapping["failed_observations"],
                (*path, "failed_observations"),
                minimum=1,
                maximum=10_000,
            )
        decisions = None
        if "decisions" in mapping:
            decisions = self.local_path(mapping["decisions"], (*path, "decisions"))
            resolved = os.path.abspath(decisions)
            if any(resolved == os.path.abspath(other) for other in taken):
                self.fail(
                    (*path, "decisions"),
                    f"{decisions} is the history or its lock file: name a file of its own",
                )
            if decisions.endswith(("/", os.sep)) or os.path.isdir(decisions):
                self.fail((*path, "decisions"), f"{decisions} is a directory: name a file")
        return level, failed_observations, decisions

    def backend(self, value: object, path: Path) -> BackendConfig:
        mapping = self.mapping(value, path)
        kind = self.choice(self.require(mapping, "type", path), (*path, "type"), BACKENDS)
        if kind == "file":
            self.check_keys(mapping, path, ("type", "path"))
            return BackendConfig(
                "file",
                path=self.input_file(
                    self.require(mapping, "path", path), (*path, "path"), required=False
                ),
            )
        if kind == "sim":
            self.check_keys(mapping, path, ("type", "scenario", "days", "speed"))
            scenario: str | None = None
            builtin = "month"
            if "scenario" in mapping:
                text = self.text(mapping["scenario"], (*path, "scenario"))
                if text.startswith("builtin:"):
                    builtin = text.removeprefix("builtin:")
                else:
                    scenario = self.input_file(text, (*path, "scenario"), required=True)
            days = None
            if "days" in mapping:
                days = self.number(mapping["days"], (*path, "days"), positive=True, maximum=3660)
            speed = None
            if "speed" in mapping:
                speed = self.number(mapping["speed"], (*path, "speed"), positive=True, maximum=1e9)
            return BackendConfig("sim", scenario=scenario, builtin=builtin, days=days, speed=speed)
        if kind == "incus":
            from opendrs.backends.incus import parse_incus

            return BackendConfig("incus", incus=parse_incus(self, mapping, path))
        from opendrs.backends.proxmox import parse_proxmox

        return BackendConfig("proxmox", proxmox=parse_proxmox(self, mapping, path))

    def automatic(self, value: object) -> tuple[str, ...]:
        """``automatic``: a list of proposal kinds, each once."""
        kinds: list[str] = []
        for i, item in enumerate(self.sequence(value, ("automatic",))):
            kind = self.choice(item, ("automatic", i), KINDS)
            if kind in kinds:
                self.fail(("automatic", i), f"{kind} is listed twice")
            kinds.append(kind)
        return tuple(kinds)

    def executor(self, value: object, path: Path, policy: PolicyConfig | None) -> ExecutorConfig:
        base = ExecutorConfig()
        if policy is not None:
            base = replace(
                base,
                max_parallel=policy.max_parallel,
                max_node_inflow=policy.max_node_inflow,
                avoid_after_failure=policy.avoid_after_failure,
                cooldown=policy.cooldown,
            )
        if value is None:
            return base
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _EXECUTOR_KEYS)
        fields: dict[str, Any] = {}
        for key in ("max_parallel", "max_node_inflow"):
            if key in mapping:
                fields[key] = self.integer(mapping[key], (*path, key), minimum=1, maximum=100_000)
        for key, (shortest, longest) in _EXECUTOR_DURATIONS.items():
            if key in mapping:
                fields[key] = self.duration(
                    mapping[key], (*path, key), minimum=shortest, maximum=longest
                )
        return replace(base, **fields)


def with_platform_defaults(config: Config, fields: Mapping[str, Any]) -> tuple[Config, list[str]]:
    """``config`` with the policy fields the platform sets (Incus's ``cluster.rebalance.*``)
    where its ``policy`` section does not set them, and what was taken, one line each.

    ``options`` are merged: the strategy options of the configuration win, key by key. A
    cooldown taken also becomes the executor's (the cooldown a move starts).
    """
    explicit = config.policy_keys
    policy = config.policy
    changes: dict[str, Any] = {}
    taken: list[str] = []
    for key, value in fields.items():
        if key == "options":
            merged = {**dict(value), **dict(policy.options)}
            if merged != dict(policy.options):
                changes["options"] = merged
                new = [k for k in value if k not in policy.options]
                taken += [f"policy option {k} = {value[k]!r}" for k in new]
        elif key not in explicit and getattr(policy, key) != value:
            changes[key] = value
            taken.append(f"policy {key} = {value!r}")
    if not changes:
        return config, []
    policy = replace(policy, **changes)
    executor = replace(config.executor, cooldown=policy.cooldown)
    return replace(config, policy=policy, executor=executor), taken


def parse_config(data: object, *, filename: str = "<config>", check_inputs: bool = False) -> Config:
    """Validate a parsed configuration document; :class:`ConfigError` for the first problem.
    ``check_inputs``: a file the daemon will read (a sim scenario) must exist now."""
    try:
        return _ConfigReader(filename, check_inputs=check_inputs).config(data)
    except DocumentError:
        raise
    except RecursionError:
        raise ConfigError(filename, "", "the document is nested too deeply") from None


def parse_listen(text: str) -> HttpConfig:
    """``HOST:PORT`` as ``http.listen`` takes it (``opendrs demo --listen``); ``ValueError``
    with the reason."""
    try:
        host, port = _ConfigReader("<listen>").listen(text, ())
    except DocumentError as exc:
        raise ValueError(exc.reason) from None
    return HttpConfig(host, port)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a configuration file."""
    filename, data = read_file(path)
    return parse_config(parse(data, filename=filename), filename=filename)
