"""The server's start-up line about the machine reads in human units (it printed `25275990016 bytes memory`,
issue 26)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kiln.backends.local.inventory import local_inventory
from kiln.settings import Settings


def test_the_inventory_line_says_memory_in_binary_units(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(home=tmp_path / "home", cpus=2, memory="23.54G", gpus="")
    with caplog.at_level(logging.INFO, logger="kiln.backends.local.inventory"):
        local_inventory(settings)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("local inventory")]
    assert line == "local inventory: 2 CPUs, 23.5 GiB memory, GPUs none"
