"""Manual mode's proposals approved on the dashboard, in a real browser: ``opendrs run`` in a
subprocess against the fake Proxmox API, ``http.write`` on behind a bearer token, the page opened
in headless Chromium. The operator types the token into the page's token field (first a wrong
one, which the page says is refused); the tab keeps it in ``sessionStorage`` — no cookie, not
in the address — and sends it with each request. The proposal must then show on the page, its
approve button must start its migrations, and the page must log no console error but the
refusals of the requests made without the right token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from tests.browser.conftest import console_errors
from tests.browser.test_dashboard import wait_until
from tests.controller.test_manual_daemon import fake  # noqa: F401 (the fixture)

from backends.fakepve_fixture import FakeCluster, proxmox_config
from daemon import Daemon, opendrs, served

TOKEN = "browser-write-token"
TIMEOUT = 60.0


def texts(driver: Any, selector: str) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )


def writing_config(tmp_path: Path, fake: FakeCluster) -> Path:  # noqa: F811 (the fixture's name)
    """Manual mode on the fake Proxmox API, the dashboard's writes on behind :data:`TOKEN`."""
    (tmp_path / "http.token").write_text(TOKEN + "\n")
    (tmp_path / "http.token").chmod(0o600)
    http = "http: {listen: '127.0.0.1:0', token_file: http.token, write: true, token_name: ops}\n"
    return proxmox_config(tmp_path, fake, mode="manual", extra=http)


def open_page(driver: Any, address: str) -> None:
    """The dashboard opened without a token: the page asks for it."""
    driver.get(f"http://{address}/")
    wait_until("the token needed", lambda: "token" in texts(driver, "#panel")[0])


def test_a_proposal_is_approved_from_the_dashboard(
    chromium: Any,
    tmp_path: Path,
    fake: FakeCluster,  # noqa: F811 (the fixture imported)
) -> None:
    config = writing_config(tmp_path, fake)
    with Daemon(config) as daemon:
        open_page(chromium, served(daemon))
        type_token(chromium, "not-the-token")
        refused = wait_until("the refusal", lambda: "(401)" in texts(chromium, "#refresh")[0])
        assert refused and "token field" in texts(chromium, "#refresh")[0]
        type_token(chromium, TOKEN)
        (proposal,) = wait_until("a proposal", lambda: texts(chromium, "li.proposal"))
        # The header's line, absent from the frame asked without the token, comes with the panel.
        assert "proxmox backend" in texts(chromium, "#where")[0]
        assert "pve1 →" in proposal and "vm10" in proposal
        assert chromium.get_cookies() == [] and TOKEN not in chromium.current_url
        kept = chromium.execute_script("return window.sessionStorage.getItem('opendrs.token');")
        assert kept == TOKEN
        refusals = console_errors(chromium)  # the page and panel asked without the right token
        assert refusals and all("401" in message for message in refusals), refusals
        assert texts(chromium, "#balance-now") == ["balance now"]
        chromium.execute_script("document.querySelector('li.proposal button.approve').click()")
        said = wait_until("the answer", lambda: texts(chromium, "#said")[0])
        assert said.startswith("proposal ") and "approved" in said, said
        daemon.wait_for(r"proposal [0-9a-f]{8} approved by ops@http: checked again, starting")
        daemon.wait_for(r"done .*pve1 → ", timeout=TIMEOUT)
        assert console_errors(chromium) == []
        assert daemon.stop() == 0, daemon.log()[-3000:]
    assert fake.pve.migrations


def type_token(driver: Any, token: str) -> None:
    """``token`` typed into the page's token field, then Enter, as an operator does."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token, Keys.ENTER)


def test_a_proposal_is_rejected_and_balance_now_asked_from_the_dashboard(
    chromium: Any,
    tmp_path: Path,
    fake: FakeCluster,  # noqa: F811 (the fixture imported)
) -> None:
    """The page's other two writes: its reject button rejects the proposal (kept with the token's
    name, and nothing of it starts), its balance now button asks the daemon for a decision."""
    config = writing_config(tmp_path, fake)
    with Daemon(config) as daemon:
        open_page(chromium, served(daemon))
        type_token(chromium, TOKEN)
        wait_until("a proposal", lambda: texts(chromium, "li.proposal"))
        refusals = console_errors(chromium)  # the page asked without the token first
        assert all("401" in message for message in refusals), refusals
        chromium.execute_script("document.querySelector('li.proposal button.reject').click()")
        said = wait_until("the answer", lambda: texts(chromium, "#said")[0])
        assert said.startswith("proposal ") and said.endswith(" rejected"), said
        rejected = said.split()[1]
        chromium.execute_script("document.querySelector('#balance-now').click()")
        wait_until("balance now", lambda: texts(chromium, "#said")[0] == "asked for a decision now")
        daemon.wait_for(r"balance now, asked by ops@http", timeout=TIMEOUT)
        assert console_errors(chromium) == []
        assert daemon.stop() == 0, daemon.log()[-3000:]
    listed = opendrs("proposals", "--all", "--config", str(config), "--format", "json")
    (kept,) = [p for p in json.loads(listed.stdout)["proposals"] if p["id"] == rejected]
    assert kept["state"] == "rejected" and kept["by"] == "ops@http"
    assert fake.pve.migrations == []  # manual mode: nothing approved, nothing started
