"""A server says which release and commit it is: the first line of its log and /readyz's version field."""

from __future__ import annotations

from typing import Any

import httpx

from kiln.version import full_version


def test_the_servers_first_log_line_and_readyz_name_its_version(make_server: Any) -> None:
    server = make_server()
    assert "+g" in full_version()  # this is a checkout: the commit is known
    first = server.log_path.read_text().splitlines()[0]
    assert f"Kiln {full_version()} starting (home {server.home}" in first
    body = httpx.get(server.url + "/readyz", timeout=10).json()
    assert body["status"] == "ready" and body["version"] == full_version()
