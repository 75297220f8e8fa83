"""Manual mode's proposals approved on the dashboard, in a real browser: ``opendrs run`` in a
subprocess against the fake Proxmox API, ``http.write`` on behind a bearer token (which the
browser sends with every request, as a reverse proxy in front of it would add it), the page opened
in headless Chromium. The proposal must show on the page, its approve button must start its
migrations, and the page must log no console error."""

from __future__ import annotations

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
from daemon import Daemon, served

TOKEN = "browser-write-token"
TIMEOUT = 60.0


def texts(driver: Any, selector: str) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )


def test_a_proposal_is_approved_from_the_dashboard(
    chromium: Any,
    tmp_path: Path,
    fake: FakeCluster,  # noqa: F811 (the fixture imported)
) -> None:
    (tmp_path / "http.token").write_text(TOKEN + "\n")
    (tmp_path / "http.token").chmod(0o600)
    http = "http: {listen: '127.0.0.1:0', token_file: http.token, write: true, token_name: ops}\n"
    config = proxmox_config(tmp_path, fake, mode="manual", extra=http)
    with Daemon(config) as daemon:
        address = served(daemon)
        chromium.execute_cdp_cmd("Network.enable", {})
        chromium.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}}
        )
        chromium.get(f"http://{address}/")
        (proposal,) = wait_until("a proposal", lambda: texts(chromium, "li.proposal"))
        assert "pve1 →" in proposal and "vm10" in proposal
        assert texts(chromium, "#balance-now") == ["balance now"]
        chromium.execute_script("document.querySelector('li.proposal button.approve').click()")
        said = wait_until("the answer", lambda: texts(chromium, "#said")[0])
        assert said.startswith("proposal ") and "approved" in said, said
        daemon.wait_for(r"proposal [0-9a-f]{8} approved by ops@http: checked again, starting")
        daemon.wait_for(r"done .*pve1 → ", timeout=TIMEOUT)
        assert console_errors(chromium) == []
        assert daemon.stop() == 0
    assert fake.pve.migrations
