"""The CLI's shared consoles are made once, at import, with the width COLUMNS had then (80 under CI without a
terminal, wider on a developer's): every CLI test gets them 200 wide, so tables read the same everywhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln.cli import common


@pytest.fixture(autouse=True)
def wide_consoles() -> Iterator[None]:
    widths = (common.out.width, common.err.width)
    common.out.width = common.err.width = 200
    yield
    common.out.width, common.err.width = widths
