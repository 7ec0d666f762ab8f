"""Debian's Chromium, headless, driven by Playwright for Python: what the console's browser tests and its benchmark
launch. ``playwright install`` is not used (it downloads its own browsers, which this kind of machine cannot): the
machine's Chromium is launched by path, with the flags that keep it from reaching the network on its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",  # as root; the page is our own console
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
REPO = Path(__file__).resolve().parent.parent


def launch(playwright: Playwright) -> Browser:
    """Headless Chromium from the machine (``make browser-tools`` installs Debian's)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)


def artifacts_dir(name: str) -> Path:
    """Where a test keeps what a person may want to look at afterwards (screenshots): ``$KILN_TEST_ARTIFACTS/name``,
    else ``test-artifacts/name`` in the repository (ignored by git)."""
    root = Path(os.environ.get("KILN_TEST_ARTIFACTS") or REPO / "test-artifacts")
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path
