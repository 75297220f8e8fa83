"""The dashboard of ``opendrs run`` and ``opendrs demo``: what the daemon sees, decides and does.

:class:`Dashboard` is fed by the controller's hooks in the daemon's thread — ``cycle`` after each
cycle, ``event`` for each migration event — and builds from them a :class:`Snapshot`: a JSON-ready
document of the cluster's node loads, the migrations in flight and the last ones ended, the last
decisions with their reasons, the guests the daemon leaves breaking a hard constraint (those left
on a node in maintenance among them), in shadow mode the plan it would carry out, and the policy
metric over the last day. The request threads of the HTTP server
(:mod:`opendrs.controller.http_server`) only read the latest snapshot, which is never changed
once published: they never ask the backend or the history anything. The HTML (from the Jinja2
templates ``templates/dashboard*.html.j2``) and the chart (``report.charts.line_chart``) are drawn
from a snapshot on the first request that needs them and kept until the next snapshot.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import jinja2

from opendrs.controller.config import Config
from opendrs.controller.executor import Event
from opendrs.controller.history_file import HistoryError
from opendrs.controller.loop import Controller, Cycle
from opendrs.controller.views import (
    FailoverWatch,
    arch_spreads,
    cluster_summary,
    node_loads,
    policy_summary,
    stuck_rows,
)
from opendrs.engine.policy import Decision
from opendrs.engine.policy.metrics import (
    format_metric,
    measure_by_arch,
    metric_label,
    metric_scale,
)
from opendrs.engine.policy.windows import schedule_now
from opendrs.engine.usage import LoadModel
from opendrs.json_data import iso_time, json_text
from opendrs.model.cluster import Cluster, guest_label
from opendrs.model.units import format_duration
from opendrs.report.charts import Line, line_chart
from opendrs.report.words import decision_words, purpose_words

__all__ = ["Dashboard", "Snapshot"]

log = logging.getLogger(__name__)

#: Recorded decisions and ended migrations the page lists, newest first.
KEPT: Final = 10
#: How far back the chart of the policy metric goes, in seconds of the backend's clock.
CHART_SPAN: Final = 86400.0
#: The most points the chart draws (every n-th point beyond).
CHART_POINTS: Final = 600
#: How often the page asks whether there is a newer snapshot, in milliseconds.
REFRESH_MS: Final = 2000

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("opendrs.controller", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True)
class Snapshot:
    """One published state of the dashboard: ``data`` is never changed after publishing."""

    version: int
    data: dict[str, Any]


class Dashboard:
    """The daemon's state for the page, rebuilt once per cycle (and per migration event)."""

    def __init__(self, config: Config, *, command: str = "opendrs run") -> None:
        self.config = config
        self.command = command
        self._controller: Controller | None = None
        self._simulated = config.backend.type == "sim"
        self._lock = threading.Lock()
        self._version = 0
        self._base: dict[str, Any] = {}
        self._decisions: deque[dict[str, Any]] = deque(maxlen=KEPT)
        self._ended: deque[dict[str, Any]] = deque(maxlen=KEPT)
        self._started: dict[str, float] = {}
        self._points: deque[tuple[float, float]] = deque()
        #: What the chart draws: the points of the last day, every n-th beyond CHART_POINTS.
        self._chart_points: list[list[float]] = []
        self._would: dict[str, Any] | None = None
        #: Each guest's name, from the clusters observed and the history (a guest deleted or
        #: renamed since keeps the name it had): the page says ``name (id)``.
        self._names: dict[str, str] = {}
        self._snapshot = Snapshot(0, {"version": 0, **self._document()})
        self._rendered: dict[tuple[int, str], str] = {}
        self._drawn: tuple[object, str] | None = None
        self._failover = FailoverWatch()

    def follow(self, controller: Controller) -> None:
        """Read the configuration and the migrations of ``controller`` from now on; the guests'
        names its history recorded name the guests gone since."""
        self._controller = controller
        try:
            self._names = {**controller.history.guest_names(), **self._names}
        except HistoryError as exc:
            log.warning("the dashboard names only the guests it sees: %s", exc)

    # -- the daemon's hooks (its thread) ---------------------------------------------------------

    def cycle(self, cycle: Cycle) -> None:
        """``Controller.on_cycle``: a new snapshot from what the cycle saw and decided."""
        if cycle.error is not None:
            self._base["observation"] = {"ok": False, "error": cycle.error, **self._at(cycle.at)}
        elif cycle.cluster is not None:
            cluster = cycle.cluster
            self._names.update((g.id, g.name) for g in cluster.guests if g.name)
            loads = LoadModel.build(cluster)
            self._base.update(
                observation={"ok": True, "error": None, **self._at(cycle.at)},
                cluster=cluster_summary(cluster),
                groups=_groups(
                    node_loads(cluster, loads),
                    arch_spreads(cluster, loads),
                    self._measured(cluster, loads),
                ),
            )
            if cycle.decision is not None:
                self._base["stuck"] = stuck_rows(cluster, cycle.stuck)
            decided = cycle.decision.state.failover if cycle.decision is not None else None
            policy = self._config.policy
            check = self._failover.update(
                cluster, cycle.at, policy.keep_failover, decided, policy.failover_recovery
            )
            self._base["failover"] = None if check is None else check.as_dict()
        if cycle.decision is not None:
            self._decided(cycle, cycle.decision)
        self._base["proposals"] = self._open_proposals()
        self._base["windows"] = schedule_now(self._config.policy.schedule, cycle.at)
        self._publish()

    def event(self, event: Event) -> None:
        """``Executor.on_event``: migrations in flight and ended follow each event."""
        move = event.move
        if move is None:
            return
        if event.kind == "started":
            self._started[move.guest] = event.at
        elif event.kind in ("done", "failed", "lost"):
            self._started.pop(move.guest, None)
            self._ended.appendleft(
                {
                    **self._at(event.at),
                    **self._guest(move.guest),
                    "source": move.source,
                    "target": move.target,
                    "outcome": event.kind,
                    "detail": event.detail,
                }
            )
        else:
            return
        self._publish()

    # -- read by the HTTP server (its threads) ---------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def state_json(self) -> str:
        """``/api/state``: the latest snapshot as JSON."""
        return self._rendered_once("json", lambda s: json_text(s.data, sort_keys=False))

    def page(self) -> str:
        """``/``: the whole page."""
        return self._rendered_once("page", lambda s: self._render(s, "page"))

    def sign_in(self) -> str:
        """``/`` asked without the token: the page's frame, its token field and script, and no
        data of the cluster."""
        return _TEMPLATES.get_template("dashboard.html.j2").render(
            s=None, chart="", refresh_ms=REFRESH_MS, script=SCRIPT
        )

    def panel(self) -> str:
        """``/api/panel``: the page's changing part, which the page's script swaps in."""
        return self._rendered_once("panel", lambda s: self._render(s, "panel"))

    # -- building a snapshot ---------------------------------------------------------------------

    def _at(self, at: float) -> dict[str, Any]:
        """A time on the backend's clock, as data and as the page shows it."""
        if self._simulated:
            return {"at": at, "time": simulated_time(at)}
        return {"at": at, "time": iso_time(at).replace("T", " ")}

    def _decided(self, cycle: Cycle, decision: Decision) -> None:
        config = self._config
        metric = config.policy.metric
        summary = {
            **self._at(cycle.at),
            "code": decision.code,
            "act": decision.act,
            "reason": decision_words(decision, self._label),
            "stop": None if decision.stop is None else decision.stop.as_dict(),
            "metric": format_metric(metric, decision.metric) if metric != "none" else None,
            "moves": [self._move(m) for m in _moves(decision)],
        }
        self._base["now"] = summary
        if cycle.decision_id is not None:
            self._decisions.appendleft({**summary, "id": cycle.decision_id, "mode": config.mode})
        if decision.act and summary["moves"]:
            self._would = None if config.migrates else summary
        if metric != "none":
            self._points.append((cycle.at, decision.metric))
            while self._points and self._points[0][0] < cycle.at - CHART_SPAN:
                self._points.popleft()
            stride = max(1, -(-len(self._points) // CHART_POINTS))
            self._chart_points = [[at, v] for at, v in list(self._points)[::stride]]

    def _open_proposals(self) -> list[dict[str, Any]]:
        """Manual mode's open proposals, from the controller's history (the daemon's thread)."""
        if self._controller is None:
            return []
        try:
            proposals = self._controller.history.proposals("open")
        except HistoryError:
            return list(self._base.get("proposals", []))
        return [{**p.as_dict(), **self._at(p.at)} for p in proposals]

    def _measured(self, cluster: Cluster, loads: LoadModel) -> dict[str, str]:
        """The policy's metric on each CPU architecture's nodes now, as the header names it."""
        metric = self._config.policy.metric
        if metric == "none":
            return {}
        values = measure_by_arch(cluster, metric, loads)
        return {arch: format_metric(metric, value) for arch, value in values.items()}

    def _guest(self, guest: str) -> dict[str, str]:
        """A guest's fields on the page: its ``guest`` id, and its ``label``, ``name (id)``."""
        return {"guest": guest, "label": self._label(guest)}

    def _label(self, guest: str) -> str:
        return guest_label(guest, self._names.get(guest, ""))

    def _move(self, move: dict[str, Any]) -> dict[str, Any]:
        """A plan's move on the page: its guest named, its reason code in ``words``."""
        label = self._guest(move["guest"])
        return {**move, **label, "words": purpose_words(move["reason"], self._label)}

    @property
    def _config(self) -> Config:
        return self._controller.config if self._controller is not None else self.config

    def _in_flight(self) -> tuple[list[dict[str, Any]], int]:
        controller = self._controller
        if controller is None:
            return [], 0
        executor = controller.executor
        now = controller.clock.now()
        rows = []
        for move in executor.in_flight:
            since = self._started.get(move.guest)
            rows.append(
                {
                    **self._guest(move.guest),
                    "source": move.source,
                    "target": move.target,
                    "since": None if since is None else self._at(since)["time"],
                    "seconds": None if since is None else max(0.0, now - since),
                }
            )
        return rows, len(executor.queued)

    def _document(self) -> dict[str, Any]:
        config = self._config
        in_flight, queued = self._in_flight()
        return {
            "command": self.command,
            "backend": config.backend.type,
            "simulated": self._simulated,
            "policy": {
                **policy_summary(config),
                "metric_label": metric_label(config.policy.metric),
                "smoothing": format_duration(config.policy.smoothing)
                if config.policy.smoothing
                else "",
            },
            "observation": self._base.get("observation"),
            # Why this instance stays idle (leader_only: another node leads), or None.
            "standby": self._controller.standing_by if self._controller is not None else None,
            "cluster": self._base.get("cluster"),
            "groups": self._base.get("groups", []),
            "now": self._base.get("now"),
            "stuck": self._base.get("stuck", []),
            "failover": self._base.get("failover"),
            # The migration windows and whether each activity may start migrations now.
            "windows": self._base.get("windows"),
            "decisions": list(self._decisions),
            "would": self._would if not config.migrates else None,
            "proposals": self._base.get("proposals", []),
            # Whether the page may approve, reject and balance now (http.write).
            "write": config.http is not None and config.http.write,
            # Whether every request needs the bearer token (the page's field then takes it).
            "token": config.http is not None and config.http.token_file is not None,
            "in_flight": in_flight,
            "queued": queued,
            "ended": list(self._ended),
            "chart": {
                "metric": config.policy.metric,
                "threshold": config.policy.threshold,
                "points": self._chart_points,
            },
            "published": iso_time(time.time()),
        }

    def _publish(self) -> None:
        data = self._document()
        with self._lock:
            self._version += 1
            self._snapshot = Snapshot(self._version, {"version": self._version, **data})
            self._rendered = {}

    # -- rendering (request threads) -------------------------------------------------------------

    def _rendered_once(self, what: str, render: Any) -> str:
        snapshot = self.snapshot()
        key = (snapshot.version, what)
        with self._lock:
            text = self._rendered.get(key)
        if text is None:
            text = render(snapshot)
            with self._lock:
                if self._snapshot.version == snapshot.version:
                    self._rendered[key] = text
        return text

    def _chart(self, snapshot: Snapshot) -> str:
        """The chart of a snapshot, drawn again only when its points changed (once per cycle,
        not per migration event)."""
        chart = snapshot.data["chart"]
        key = (tuple(map(tuple, chart["points"])), chart["threshold"], chart["metric"])
        with self._lock:
            cached = self._drawn
        if cached is not None and cached[0] == key:
            return cached[1]
        svg = _chart(chart)
        with self._lock:
            self._drawn = (key, svg)
        return svg

    def _render(self, snapshot: Snapshot, part: str) -> str:
        name = "dashboard-panel.html.j2" if part == "panel" else "dashboard.html.j2"
        return _TEMPLATES.get_template(name).render(
            s=snapshot.data,
            chart=self._chart(snapshot),
            refresh_ms=REFRESH_MS,
            script=SCRIPT,
        )


def simulated_time(at: float) -> str:
    """Seconds since the start of a simulation as the page shows them: ``sim 1d 03:25:10``."""
    seconds = int(max(at, 0.0))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    day = f"{days}d " if days else ""
    return f"sim {day}{hours:02d}:{seconds // 60:02d}:{seconds % 60:02d}"


def _groups(
    nodes: list[dict[str, Any]], spreads: dict[str, dict[str, float]], measured: dict[str, str]
) -> list[dict[str, Any]]:
    """The nodes by CPU architecture where the usable ones have several, else one group; each
    with its spread per resource and the policy's metric on it now (``measured``, per
    architecture: what the header's threshold is compared with)."""
    if len(spreads) < 2:
        spread = next(iter(spreads.values()), {})
        metric = next(iter(measured.values()), None)
        return [{"arch": None, "nodes": nodes, "spread": spread, "metric": metric}]
    return [
        {
            "arch": arch,
            "nodes": [n for n in nodes if n["arch"] == arch],
            "spread": spread,
            "metric": measured.get(arch),
        }
        for arch, spread in spreads.items()
    ]


def _moves(decision: Decision) -> list[dict[str, Any]]:
    """The plan's migrations, each with the strategy's reason for it."""
    if decision.plan is None:
        return []
    why: dict[str, str] = {}
    if decision.proposal is not None:
        for proposed in decision.proposal.moves:
            why[proposed.guest] = proposed.reason
    return [
        {
            "guest": m.guest,
            "source": m.source,
            "target": m.target,
            "step": m.step,
            "parking": m.parking,
            "reason": why.get(m.guest, ""),
        }
        for m in decision.plan.moves
    ]


def _chart(chart: dict[str, Any]) -> str:
    """The policy metric over the last day, with the threshold, as inline SVG ('' without
    points to draw)."""
    points: list[list[float]] = chart["points"]
    if len(points) < 2:
        return ""
    metric = chart["metric"]
    scale, unit = metric_scale(metric)
    unit = f" ({unit})" if unit else ""
    last = points[-1][0]
    series = [((at - last) / 3600, value * scale) for at, value in points]
    return line_chart(
        {metric: series},
        title=f"policy metric over the last day: {metric}",
        xlabel="hours before the last decision",
        ylabel=f"{metric}{unit}",
        lines=[Line(chart["threshold"] * scale, "threshold")],
        steps=True,
        size=(8.0, 2.4),
    )


def _script_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode()).digest()
    return "'sha256-" + base64.b64encode(digest).decode() + "'"


#: The page's only script: ask every few seconds whether there is a newer snapshot and swap the
#: changing part in (the decisions opened staying open); say so when the daemon cannot be
#: reached. With ``http.token_file``, its field takes the token: kept in the tab's
#: ``sessionStorage`` (never a cookie, never in an address) and sent as ``Authorization: Bearer``
#: with each request of the page (none when the field is empty: a proxy in front may add it);
#: a 401 or 403 says what to do. With ``http.write``, its buttons POST an approval, a rejection
#: or a request to balance now (the page's own origin) and say the answer.
SCRIPT: Final = """
(function () {
  var KEY = "opendrs.token";
  var panel = document.getElementById("panel");
  var status = document.getElementById("refresh");
  var said = document.getElementById("said");
  var every = Number(panel.dataset.refresh);
  var timer = null;
  function bearer() {
    var token = window.sessionStorage.getItem(KEY);
    return token ? {"Authorization": "Bearer " + token} : {};
  }
  function refusal(code, error) {
    if (code === 401) {
      return "the daemon wants its token (401): enter the token of http.token_file in the " +
        "token field" + (window.sessionStorage.getItem(KEY) ? " (the one kept is refused)" : "");
    }
    if (code === 403) {
      return "refused (403): " + (error || "forbidden") +
        ": open the dashboard at the daemon's own address";
    }
    return "refused (" + code + "): " + (error || "HTTP " + code);
  }
  function show(element, text, ok) {
    element.textContent = text;
    element.className = ok ? "live" : "lost";
  }
  function schedule(delay) {
    window.clearTimeout(timer);
    timer = window.setTimeout(refresh, delay);
  }
  function refresh() {
    fetch("api/panel?after=" + panel.dataset.version, {cache: "no-store", headers: bearer()})
      .then(function (answer) {
        if (answer.status === 204) { return null; }
        if (answer.status === 401 || answer.status === 403) {
          throw {refused: refusal(answer.status, "")};
        }
        if (!answer.ok) { throw new Error("HTTP " + answer.status); }
        return answer.text();
      })
      .then(function (html) {
        if (html !== null) {
          var open = Array.prototype.map.call(
            panel.querySelectorAll("details[open]"), function (d) { return d.dataset.key; });
          panel.outerHTML = html;
          panel = document.getElementById("panel");
          // the frame answered without the token has no header line: the panel brings it
          document.getElementById("where").textContent = panel.dataset.where || "";
          open.forEach(function (key) {
            var details = panel.querySelector('details[data-key="' + key + '"]');
            if (details) { details.open = true; }
          });
        }
        show(status, "live: updated " + new Date().toLocaleTimeString(), true);
      })
      .catch(function (error) {
        show(status, error.refused ||
          "cannot reach the daemon (" + error.message + "): retrying", false);
      })
      .finally(function () { schedule(every); });
  }
  schedule(panel.dataset.frame && window.sessionStorage.getItem(KEY) ? 0 : every);
  var field = document.getElementById("token");
  if (field) {
    var told = document.getElementById("token-said");
    var keep = function () {
      if (!field.value) { return; }
      window.sessionStorage.setItem(KEY, field.value);
      field.value = "";
      show(told, "kept for this tab", true);
      schedule(0);
    };
    document.getElementById("token-use").addEventListener("click", keep);
    field.addEventListener("keydown", function (event) {
      if (event.key === "Enter") { keep(); }
    });
    document.getElementById("token-forget").addEventListener("click", function () {
      window.sessionStorage.removeItem(KEY);
      show(told, "forgotten", true);
    });
    if (window.sessionStorage.getItem(KEY)) { show(told, "kept for this tab", true); }
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-post]");
    if (!button) { return; }
    button.disabled = true;
    fetch(button.dataset.post, {method: "POST", cache: "no-store", headers: bearer()})
      .then(function (answer) {
        var type = answer.headers.get("Content-Type") || "";
        var data = type.indexOf("application/json") === 0 ? answer.json() : Promise.resolve({});
        return data.then(function (data) {
          if (answer.ok) {
            show(said, button.dataset.done, true);
          } else {
            show(said, refusal(answer.status, data.error), false);
            button.disabled = false;
          }
        });
      })
      .catch(function (error) {
        show(said, "cannot reach the daemon (" + error.message + ")", false);
        button.disabled = false;
      });
  });
})();
"""

#: The page's Content-Security-Policy: its own script and styles only, nothing from elsewhere.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; "
    f"script-src {_script_hash(SCRIPT)}; "
    "style-src 'unsafe-inline'; "
    "img-src 'self' data:; "
    "connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def dashboard_headers() -> Iterable[tuple[str, str]]:
    """Headers of every dashboard answer."""
    return (
        ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("Cache-Control", "no-store"),
    )
