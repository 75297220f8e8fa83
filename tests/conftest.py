"""Shared test fixtures and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Read-only peer test data, beside the checkout (``../shared/compat``); may be absent.
COMPAT = ROOT.parent / "shared" / "compat"


def compat_dir(sub: str) -> Path:
    """Return ``COMPAT/sub`` or skip the calling test when it is not there."""
    path = COMPAT / sub
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    return path
